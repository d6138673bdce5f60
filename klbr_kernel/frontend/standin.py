"""The stand-in: the frontend's sockets bound first thing, and kernel_info answered while the proxy
still starts (the log calls it the early front).

`python -m klbr_kernel` calls `start` right after the prelaunch and before the heavy imports
(jupyter_client, traitlets, asyncio: about 200 ms here). Two things follow. A client that connected
before the bind is not left waiting for its next reconnect attempt (libzmq retries every 100 ms).
And a thread answers kernel_info_request, which `wait_for_ready`, nbclient and JupyterLab send
first, so the kernel answers once its sockets are bound (about 0.13 s after exec here), not after
its imports.

Besides that, the thread only greets iopub subscribers (JEP 65 iopub_welcome). The first other
message on a channel is kept, and the thread stops reading that channel, so what follows stays
queued in its socket, in order. When the proxy binds,
its `Frontend` calls `take`: the thread stops and the `Frontend` receives the sockets, the kept
messages (to handle before anything newer) and the signatures already answered (for its replay
check). Only `take` ends the thread; until then it alone touches the sockets.

Standard library, pyzmq and the light `klbr_kernel` modules only: each import here is paid before
the first answer.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import zmq

from klbr_supervisor.boot import prelaunch
from klbr_supervisor.messages import protocol

from . import encryption, kernel_info
from .heartbeat import Heartbeat
from .kernel_info import PROTOCOL_VERSION, kernel_info_content

# Messages ZMQ queues per iopub subscriber before a send fails and the message waits in the
# proxy's `outbox` (ipykernel's PUB drops at 1000 instead). Counted in messages, so kept short: the
# outbox bounds bytes.
IOPUB_QUEUE = 200
# The longest message taken on iopub, in bytes (a longer one disconnects its sender). What comes in
# there is subscriptions, which anyone who reaches the port may send, and libzmq keeps each as a
# trie node per byte: one 64 MiB subscription cost the kernel 3.4 GiB. Jupyter clients subscribe to
# everything (an empty topic) or to a short prefix.
SUBSCRIPTION_MAX = 4096
# The longest frame taken on shell, control and stdin unless `KlbrKernelApp.max_message_size` says
# otherwise: well above the 64 MiB content a frontend may legally send. libzmq checks each frame's
# size before it allocates it and disconnects a sender whose frame is longer.
MAX_MESSAGE_SIZE = 256 << 20
_SIZE_OPTION = "KlbrKernelApp.max_message_size"
_KINDS = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "iopub": zmq.XPUB}


def channel_url(info: dict[str, Any], channel: str) -> str:
    """The address to bind for `channel`, for tcp and ipc transports (jupyter_client's convention)."""
    transport, ip, port = info.get("transport", "tcp"), info["ip"], info[f"{channel}_port"]
    if transport == "ipc":
        return f"ipc://{ip}-{port}"
    return f"{transport}://{ip}:{port}"


def welcome_topic(event: bytes) -> bytes | None:
    """The topic of an iopub subscription event, which gets a JEP 65 iopub_welcome; None for an
    unsubscription (or a topic that is not text)."""
    if event[:1] != b"\x01":
        return None
    try:
        event[1:].decode()
    except UnicodeDecodeError:
        return None
    return event[1:]


class Subscriptions:
    """The live iopub subscriptions, by topic, from the XPUB's events (every one is reported:
    XPUB_VERBOSER), kept by the stand-in and then by the `Frontend`.

    libzmq also reports an unsubscription from a peer that never subscribed to its topic, and any
    peer can send one: one of a topic nobody holds is not counted, so the count never goes below
    what is live. (One of a topic someone else holds still lowers it: libzmq does not say which
    peer sent what.)"""

    def __init__(self) -> None:
        self.topics: dict[bytes, int] = {}
        self.live = 0  # 0: nobody sees what is published

    def event(self, event: bytes) -> bool:
        """Count one event from iopub; False for what is neither a subscription nor the end of a
        live one."""
        kind, topic = event[:1], event[1:]
        if kind == b"\x01":
            self.topics[topic] = self.topics.get(topic, 0) + 1
        elif kind == b"\x00" and topic in self.topics:
            self.topics[topic] -= 1
            if not self.topics[topic]:
                del self.topics[topic]
            self.live -= 1
            return True
        else:
            return False
        self.live += 1
        return True


def max_message_size(argv: list[str]) -> int:
    """The cap on frames the command line sets (`--KlbrKernelApp.max_message_size=N`), else the
    default. (A value that is not an integer is the app's to report.)

    Only the command line: config files are read by the app, after these sockets are bound, and
    libzmq copies a socket's options into its listener when it binds. Binding again then would
    drop what is in flight both ways (a reply sent while its frontend reconnects is lost), so the
    `Frontend` only warns about a config file's other value."""
    given = prelaunch.values(argv, _SIZE_OPTION)
    try:
        return int(given[-1]) if given else MAX_MESSAGE_SIZE
    except ValueError:
        return MAX_MESSAGE_SIZE


class BindError(Exception):
    """A channel of the connection file could not be bound (most often: its port was taken between
    the client picking it and the kernel binding it); the text names the channel and the address."""


def _bind(sock: zmq.Socket[bytes], name: str, url: str) -> None:
    try:
        sock.bind(url)
    except zmq.ZMQError as e:
        msg = f"{name} cannot be bound at {url}: {e.strerror}"
        raise BindError(msg) from None


def bind(info: dict[str, Any], context: zmq.Context[zmq.Socket[bytes]], max_message_size: int = MAX_MESSAGE_SIZE
         ) -> tuple[dict[str, zmq.Socket[bytes]], Heartbeat]:
    """Bind the frontend's four channels and start answering heartbeats; all five are CURVE
    servers when the connection file carries curve keys (see `encryption`). Every socket takes
    frames up to a size (a longer one disconnects its sender): `max_message_size` on shell,
    control and stdin, a few KiB on iopub and the heartbeat."""
    server_keys = encryption.keys(info)
    sockets: dict[str, zmq.Socket[bytes]] = {}
    try:
        for name, kind in _KINDS.items():
            sock = context.socket(kind)
            sockets[name] = sock
            sock.linger = 1000
            encryption.serve(sock, server_keys)
            if kind == zmq.ROUTER:
                sock.router_handover = 1  # a reconnecting client takes over its identity
                # Every request read is answered: replies a client takes slower than the proxy
                # makes them (10 000 aborted executes, under load) wait here for it. At libzmq's
                # mark of 1000 a mandatory ROUTER refuses the send, and the reply was dropped.
                sock.sndhwm = 0
                if name in ("shell", "stdin"):
                    # Say when the frontend is not there: an input_request must wait for it (see
                    # `stdin`), and a reply it cannot get means its outputs reached no one.
                    sock.router_mandatory = 1
                sock.maxmsgsize = max_message_size
            else:
                # Report every subscription and unsubscription, not only the first and last per
                # topic: a frontend that connects while another is attached still gets its
                # iopub_welcome, and the proxy knows when no one is subscribed.
                sock.setsockopt(zmq.XPUB_VERBOSER, 1)
                # A subscriber that falls this far behind makes a send fail, never drop silently:
                # the message waits in the proxy's `outbox`, which decides what may be dropped.
                sock.sndhwm = IOPUB_QUEUE
                sock.setsockopt(zmq.XPUB_NODROP, 1)
                sock.maxmsgsize = SUBSCRIPTION_MAX
            _bind(sock, name, channel_url(info, name))
        try:
            heartbeat = Heartbeat(context, channel_url(info, "hb"), server_keys)
        except zmq.ZMQError as e:
            msg = f"hb cannot be bound at {channel_url(info, 'hb')}: {e.strerror}"
            raise BindError(msg) from None
    except BaseException:
        for sock in sockets.values():
            sock.close(linger=0)
        raise
    heartbeat.start()
    return sockets, heartbeat


class Bound:
    """What the `Frontend` takes over: the sockets, the heartbeat, and what the thread read."""

    def __init__(self, sockets: dict[str, zmq.Socket[bytes]], heartbeat: Heartbeat, session_id: str,
                 max_message_size: int):
        self.sockets = sockets
        self.max_message_size = max_message_size  # what shell, control and stdin were bound with
        self.heartbeat = heartbeat
        self.session_id = session_id
        self.kept: list[tuple[str, list[zmq.Frame]]] = []  # (channel, frames), in arrival order
        self.answered: list[bytes] = []  # signatures of the kernel_info requests answered
        self.subscriptions = Subscriptions()


class _Responder(threading.Thread):
    def __init__(self, bound: Bound, info: dict[str, Any], context: zmq.Context[zmq.Socket[bytes]]):
        super().__init__(name="klbr-standin", daemon=True)
        self._bound = bound
        self._signer = protocol.Signer(info.get("key", "").encode(), info.get("signature_scheme", "hmac-sha256"))
        # Both ends connected before the thread starts (which hands its end over), so a stop is
        # never sent to a pair that is not there yet.
        url = f"inproc://klbr-standin-{id(self)}"
        self._halt = context.socket(zmq.PAIR)
        self._halt.bind(url)
        self._halted = context.socket(zmq.PAIR)
        self._halted.connect(url)

    def stop(self) -> None:
        """From the main thread: end the thread and wait for it."""
        try:
            self._halt.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the thread has ended already (its end of the pair is closed)
        self.join()
        self._halt.close(linger=0)

    def run(self) -> None:
        sockets = self._bound.sockets
        stop = self._halted
        poller = zmq.Poller()
        poller.register(stop, zmq.POLLIN)
        for name in ("shell", "control", "iopub"):
            poller.register(sockets[name], zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if stop in ready:
                    return
                if sockets["iopub"] in ready:
                    self._subscribed(sockets["iopub"].recv())
                for name in ("shell", "control"):
                    sock = sockets[name]
                    if sock in ready:
                        frames = sock.recv_multipart(copy=False)
                        try:
                            answered = self._answered(name, frames)
                        except Exception:  # whatever it is, the Frontend handles it, and reports it
                            answered = False
                        if not answered:
                            self._bound.kept.append((name, frames))
                            poller.unregister(sock)  # the rest waits in the socket, in order
        finally:
            stop.close(linger=0)

    def _answered(self, channel: str, frames: list[zmq.Frame]) -> bool:
        """Answer `frames` if they are a correctly signed, first-time kernel_info_request: cut and
        verified as the `Frontend` does (`protocol`), so both judge a message alike."""
        try:
            prefix, body = protocol.split(frames)
            header, _, _, raw_content = protocol.verify(body, self._signer.sign if self._signer.keyed else None)
            header = json.loads(header)
            json.loads(raw_content)  # content the door would refuse is not answered here either
        except ValueError:  # no message, a bad signature, or no JSON: the Frontend reports it
            return False
        if not isinstance(header, dict) or header.get("msg_type") != "kernel_info_request":
            return False
        signature = protocol.as_bytes(body[0])
        if signature and signature in self._bound.answered:
            return False  # a replay: the Frontend drops it
        self._bound.answered.append(signature)
        sockets = self._bound.sockets
        self._publish("status", {"execution_state": "busy"}, header)
        metadata = {"started": _now(), "dependencies_met": True, "engine": self._bound.session_id, "status": "ok"}
        # "local": the only placement there is; the proxy's own answers name the configured one.
        content = kernel_info_content(None, None, "local")
        try:
            sockets[channel].send_multipart([*map(protocol.as_bytes, prefix),
                                             *self._message("kernel_info_reply", content, header, metadata)])
        except zmq.ZMQError:
            pass  # the client went away (shell is ROUTER_MANDATORY): nobody to answer
        self._publish("status", {"execution_state": "idle"}, header)
        return True

    def _subscribed(self, event: bytes) -> None:
        """A new iopub subscriber: greet it (JEP 65), as the `Frontend` does after the handover."""
        self._bound.subscriptions.event(event)
        topic = welcome_topic(event)
        if topic is not None:
            self._publish("iopub_welcome", {"subscription": topic.decode()}, {}, topic=topic or None)

    def _publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any], topic: bytes | None = None
                 ) -> None:
        prefix = topic or f"kernel.klbr.{msg_type}".encode()
        try:  # a subscriber that reads nothing must not stall the start: this status is dropped
            self._bound.sockets["iopub"].send_multipart([prefix, *self._message(msg_type, content, parent)], zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _message(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any],
                 metadata: dict[str, Any] | None = None) -> list[bytes]:
        header = {"msg_id": prelaunch.new_id(), "session": self._bound.session_id, "username": "kernel",
                  "date": _now(), "msg_type": msg_type, "version": PROTOCOL_VERSION}
        parts = [json.dumps(part).encode() for part in (header, parent, metadata or {}, content)]
        return [protocol.DELIM, self._signer.sign(parts), *parts]


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


_bound: Bound | None = None
_responder: _Responder | None = None


def start(argv: list[str], session_id: str | None = None) -> None:
    """Bind the sockets of the connection file in `argv` and answer kernel_info until `take`, as
    `session_id` (the prelaunched worker's, which the proxy keeps) or a new one.

    Does nothing when there is no readable connection file or the bind fails: the app reports
    the first, and the `Frontend` binds (or reports the failure) itself."""
    global _bound, _responder
    path = prelaunch.connection_file_arg(argv)
    if path is None:
        return  # the app says -f is required
    try:
        with open(path) as f:
            info = json.load(f)
        if prelaunch.connection_problem(info) or encryption.problem(info):
            return  # the app refuses to start, and says why
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        size = max_message_size(argv)
        sockets, heartbeat = bind(info, context, size)
        # The command line's only: a config file's is the app's, read later (`KlbrKernelApp.start`).
        kernel_info.configure(prelaunch.debugger_given(argv) is not False)
    except (OSError, TypeError, ValueError, KeyError, zmq.ZMQError, BindError):  # no file, bad JSON, port taken
        return
    # The session the frontend will see throughout: the prelaunched worker already speaks as it.
    _bound = Bound(sockets, heartbeat, session_id or prelaunch.new_id(), size)
    _responder = _Responder(_bound, info, context)
    _responder.start()


def session_id() -> str | None:
    """The session id the stand-in's answers carried, which the proxy keeps; None if nothing was bound."""
    return _bound.session_id if _bound else None


def bound_max_message_size() -> int | None:
    """The cap shell, control and stdin were bound with (`max_message_size`); None if nothing was bound."""
    return _bound.max_message_size if _bound else None


def take() -> Bound | None:
    """Stop answering and hand everything over (once); None when the stand-in bound nothing."""
    global _bound, _responder
    if _bound is None:
        return None
    assert _responder is not None  # started with `_bound`
    _responder.stop()
    taken, _bound, _responder = _bound, None, None
    return taken
