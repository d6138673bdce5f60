"""The proxy's end of one worker's channels: four sockets, what each is connected to, and the drain.

Each socket has a monitor, and its events are the exact signals the generation needs:

- a handshake says a channel is connected. Readiness waits for stdin's: the worker's stdin is a
  ROUTER, which drops a message for a peer it does not know yet, so an `input_request` sent before
  our connection is made would be lost and its cell would wait forever. Shell answering proves
  nothing about stdin (our sockets connect before the worker binds and then retry on their own
  timers, and only the worker's stdin sends to us unasked).
- a disconnect says everything the worker wrote on that channel has been read: libzmq reads a
  connection to its end before it reports it closed. So when the worker's process is gone, `drain`
  waits for exactly that on every connected channel, then delivers what is queued (semantics 7):
  no settling time, and nothing in flight is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial

import zmq
from jupyter_client.session import Session
from zmq.utils.monitor import parse_monitor_message

from ..messages.protocol import Frames
from ..messages.sockets import LoopSocket

# The worker channels the proxy talks on; heartbeat is not used (we watch the process itself).
CHANNELS = ("shell", "control", "stdin", "iopub")
_KINDS = {"shell": zmq.DEALER, "control": zmq.DEALER, "stdin": zmq.DEALER, "iopub": zmq.SUB}
_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


def curve_client(sock: zmq.Socket[bytes], server_key: str) -> None:
    """Make `sock` a CurveZMQ client of the server whose public key is `server_key` (none: plain)."""
    if server_key:
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = server_key.encode("ascii")


class WorkerChannels:
    """Created by a `Generation` once its worker is launched; closed when the generation ends."""

    _on_change: Callable[[], None]  # a channel connected or disconnected (`connect`)

    def __init__(self, name: str, context: zmq.Context[zmq.Socket[bytes]], session: Session, log: logging.Logger):
        self._name = name
        self._context = context
        self._session = session
        self._log = log
        self._channels: dict[str, LoopSocket] = {}
        self._monitors: dict[str, LoopSocket] = {}
        self._connected: set[str] = set()
        self._changed = asyncio.Event()  # set at each connection event, for `drain`
        self.closed = False

    def connect(self, endpoints: dict[str, str], on_message: Callable[[str, Frames], None],
                on_change: Callable[[], None], server_key: str = "") -> None:
        """Connect to the worker's `endpoints` (channel -> url); the worker may not have bound yet.
        From now on `on_message(channel, frames)` receives every message from the worker (its frames
        as bytes), on the loop, and `on_change()` is called whenever a channel connects or
        disconnects. With `server_key` (Z85), as a CurveZMQ client of a worker that serves it (over a
        network). Nothing, once closed (its generation ended while its launch reported)."""
        if self.closed:
            return
        self._on_change = on_change
        for name in CHANNELS:
            sock = self._context.socket(_KINDS[name])
            sock.linger = 0
            # Never drop between worker and proxy: the frontend and the store must see every output.
            sock.rcvhwm = 0
            sock.sndhwm = 0
            # We connect before the worker binds: retry every 10-20 ms rather than libzmq's
            # 100-200 ms, which would otherwise add up to 0.2 s to a generation's start.
            sock.reconnect_ivl = 10
            if name == "iopub":
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                # ipykernel sends input_request to the identity the execute came from on shell, so
                # shell and stdin must share one (as jupyter_client's clients do).
                sock.setsockopt(zmq.IDENTITY, self._session.bsession)
            curve_client(sock, server_key)
            monitor = sock.get_monitor_socket(_EVENTS)
            self._monitors[name] = LoopSocket(f"{self._name}.{name}-monitor", monitor, partial(self._event, name))
            sock.connect(endpoints[name])
            self._channels[name] = LoopSocket(f"{self._name}.{name}", sock, partial(on_message, name), copy=True)

    def connected(self, channel: str) -> bool:
        return channel in self._connected

    def send(self, channel: str, frames: Sequence[bytes | zmq.Frame]) -> bool:
        ch = self._channels.get(channel)
        return ch is not None and ch.send(frames)

    async def drain(self, bound: float) -> None:
        """The worker is gone: wait until each connected channel has read the worker's last byte
        (at most `bound` seconds: a process that escaped the worker's group may hold its end),
        then deliver everything queued."""
        try:
            async with asyncio.timeout(bound):
                while self._connected:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            self._log.warning("%s: %s still connected %.0f s after the worker exited (a process it started "
                              "holds them?); delivering what has arrived", self._name,
                              ", ".join(sorted(self._connected)), bound)
        for ch in self._channels.values():
            ch.drain()

    def deliver_queued(self) -> None:
        """Deliver what has arrived and is queued, now (a worker whose link is lost says no more)."""
        for ch in self._channels.values():
            ch.drain()

    def close(self) -> None:
        """Stop all delivery at once (a stale generation has no voice) and release the sockets."""
        if self.closed:
            return
        self.closed = True
        self._connected.clear()
        for name, monitor in self._monitors.items():
            ch = self._channels.get(name)
            if ch is not None and not ch.closed:
                ch.socket.disable_monitor()
            monitor.close()
        for ch in self._channels.values():
            ch.close()

    def _event(self, channel: str, frames: list[zmq.Frame]) -> None:
        event = parse_monitor_message([frame.bytes for frame in frames])["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._connected.add(channel)
        elif event == zmq.EVENT_DISCONNECTED:
            self._connected.discard(channel)
        self._changed.set()
        self._on_change()
