"""The sockets a Jupyter frontend connects to, bound from its connection file.

Owned by the `Proxy`. Every inbound message is cut and its signature checked by `protocol` (with
jupyter_client's `Session.sign`), and checked against the replay history, before anyone sees it; a
message that fails is dropped, and counted by `drops`, which logs at a bounded rate (a hostile peer
does not get a log line per frame). Outbound, the proxy either sends its own messages (serialized
by the `Session`, with the proxy's one session id) or forwards a worker's frames untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import zmq
from jupyter_client.session import Session

from klbr_supervisor.messages import protocol
from klbr_supervisor.messages.sockets import LoopSocket
from klbr_supervisor.messages.wire import MalformedMessage, Wire, loads

from . import encryption, standin
from .drops import Drops
from .heartbeat import Heartbeat
from .outbox import Outbox

log = logging.getLogger(__name__)


class Frontend:
    _on_message: Callable[[str, Wire], None]  # every verified shell, control and stdin message (`bind`)

    def __init__(
        self,
        info: dict[str, Any],
        session: Session,
        max_message_size: int = standin.MAX_MESSAGE_SIZE,
    ):
        """`max_message_size`: the longest frame shell, control and stdin take (see `standin.bind`)."""
        self.info = info
        self.max_message_size = max_message_size
        self.server_keys = encryption.keys(info)  # None: the frontend link is plaintext
        self.session = session
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._channels: dict[str, LoopSocket] = {}
        self._heartbeat: Heartbeat | None = None
        self.outbox: Outbox | None = None  # iopub's: waits for slow frontends, drops only outputs
        self._subscriptions = standin.Subscriptions()
        self.drops = Drops(log)  # what came in and was not served, counted
        # Signatures already taken, oldest first, bounded as jupyter_client bounds its digest history.
        self._seen: dict[bytes, None] = {}
        # Read once: the key never changes, and each read of a Session trait is a traitlets call.
        self._sign = session.sign if session.auth is not None else None
        self._history_size = session.digest_history_size

    def bind(self, on_message: Callable[[str, Wire], None]) -> None:
        """Take over the sockets bound at start-up (see `standin`), or bind them now; from now on
        `on_message(channel, wire)` receives every verified shell, control and stdin message."""
        self._on_message = on_message
        bound = standin.take()
        if bound is None:
            sockets, self._heartbeat = standin.bind(self.info, self._context, self.max_message_size)
        else:
            sockets, self._heartbeat = bound.sockets, bound.heartbeat
            self.max_message_size = bound.max_message_size  # another value is the app's to report
            self._subscriptions = bound.subscriptions
            for signature in bound.answered:
                self._remember(signature)
            # What came before the handover is handled before anything newer in the same socket.
            loop = asyncio.get_running_loop()
            for channel, frames in bound.kept:
                loop.call_soon(self._received, channel, frames)
        for name, sock in sockets.items():
            handler = self._subscription if name == "iopub" else (lambda f, n=name: self._received(n, f))
            # iopub receives subscriptions (Frames, read by `_subscription`); the rest, requests as bytes.
            self._channels[name] = LoopSocket(f"frontend.{name}", sock, handler, copy=name != "iopub")
        self.outbox = Outbox(self._channels["iopub"])

    def close(self) -> None:
        """Called once at exit; lingers up to a second so the last replies reach the frontend."""
        self.drops.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.outbox is not None:
            self.outbox.flush()  # what the socket still takes goes out with the linger
            self.outbox.close()
        for ch in self._channels.values():
            ch.close(linger=1000)

    @property
    def subscriptions(self) -> int:
        """Live iopub subscriptions: 0 means nobody sees what is published."""
        return self._subscriptions.live

    # -- inbound -----------------------------------------------------------------------------------

    def _received(self, channel: str, frames: protocol.Frames) -> None:
        try:
            wire = self._verify(channel, frames)
        except (ValueError, TypeError) as e:  # bad frames, signature or header JSON
            self.drops.drop(channel, str(e))
            return
        if wire is not None:
            self._on_message(channel, wire)

    def _verify(self, channel: str, frames: protocol.Frames) -> Wire | None:
        """Check the signature and the replay history, as `Session.deserialize` does, and decode the
        headers; None for a replay that is dropped.

        Not `deserialize` itself: the `door` checks the rest of what a message must be, once.
        An execute_request byte-identical to one already taken (a client resending after a
        reconnect) is let through: the proxy answers it from the record without running it again
        (semantics 9), where a rejected replay would leave the client waiting forever.
        """
        prefix, body = protocol.split(frames)
        header, parent, _, _ = protocol.verify(body, self._sign)
        signature = body[0] if type(body[0]) is bytes else protocol.as_bytes(body[0])
        try:
            header_object, parent_object = loads(header), loads(parent)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser's depth
            msg = "header is not JSON"
            raise MalformedMessage(msg) from None
        if not isinstance(header_object, dict) or not isinstance(parent_object, dict):
            msg = "header is not an object"
            raise MalformedMessage(msg)
        wire = Wire([frame if type(frame) is bytes else protocol.as_bytes(frame) for frame in prefix], body,
                    header_object, parent_object)
        if signature and signature in self._seen:
            if wire.msg_type != "execute_request":
                self.drops.drop(channel, "a replay (its signature was taken already)", f"a {str(wire.msg_type)[:100]}")
                return None
        elif signature:
            self._remember(signature)
        return wire

    def _remember(self, signature: bytes) -> None:
        self._seen[signature] = None
        if len(self._seen) > self._history_size:
            del self._seen[next(iter(self._seen))]

    def _subscription(self, frames: list[zmq.Frame]) -> None:
        """XPUB subscription events: count them, and greet each new subscriber (JEP 65 iopub_welcome)."""
        for frame in frames:
            if not self._subscriptions.event(frame.bytes):
                self.drops.drop("iopub", "neither a subscription nor the end of one")
                continue
            topic = standin.welcome_topic(frame.bytes)
            if topic is not None:
                self.send_iopub("iopub_welcome", {"subscription": topic.decode()}, parent=None, topic=topic or None)

    # -- outbound ----------------------------------------------------------------------------------

    def reply(self, channel: str, idents: list[zmq.Frame | bytes], msg_type: str, content: dict[str, Any],
              parent: dict[str, Any], metadata: dict[str, Any] | None = None) -> bool:
        """Send the proxy's own reply to the frontend that asked; False when that frontend is gone."""
        msg = self.session.msg(msg_type, content, parent=parent, metadata=metadata)
        return self._channels[channel].send([*idents, *self.session.serialize(msg)], copy=True)

    def send_iopub(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None, topic: bytes | None = None,
                   keep: bool = False) -> None:
        """The proxy's own iopub message; `keep`: never dropped, even when it is an output."""
        msg = self.session.msg(msg_type, content, parent=parent or {})
        prefix = [topic] if topic else [f"kernel.klbr.{msg_type}".encode()]
        assert self.outbox is not None, "sent only once `bind` has made the outbox"
        self.outbox.send(prefix + self.session.serialize(msg), msg_type, copy=True, keep=keep)

    def status(self, state: str, parent: dict[str, Any]) -> None:
        self.send_iopub("status", {"execution_state": state}, parent)

    def forward(self, channel: str, idents: list[zmq.Frame | bytes], frames: protocol.Frames) -> bool:
        """Frames already signed with the frontend's key: sent as they are. False when dropped, or,
        on shell and stdin, when no frontend of that identity is connected (see `stdin`)."""
        return self._channels[channel].send(idents + frames)

    def publish(self, wire: Wire) -> None:
        """A worker's iopub message, untouched, through the `outbox`."""
        assert self.outbox is not None, "sent only once `bind` has made the outbox"
        self.outbox.send(wire.prefix + wire.frames(), wire.msg_type)

