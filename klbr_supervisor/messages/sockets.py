"""Callback delivery of ZMQ messages on the asyncio loop, shared by the proxy and the supervisor.

Sockets here are plain (non-asyncio) pyzmq sockets whose edge-triggered FD is watched with
``loop.add_reader``. Every message is handed to a synchronous callback on the loop thread, so the
forwarding path has no per-message futures or tasks. Sends never block: internal sockets have no
high-water mark; toward a frontend, `offer` says when a queue is full, and the caller keeps the
message (see `klbr_kernel.frontend.outbox`).

A callback is the error boundary of what it receives (the proxy answers a request whose handling
raised): a `LoopSocket` catches nothing. An exception that still escapes a callback reaches asyncio's
exception handler, which logs it, and the messages queued behind it are delivered all the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import zmq

from .protocol import Frames

log = logging.getLogger(__name__)

# A batch bound, so one flooding socket cannot starve the others on the loop.
_BATCH = 256
# Plain ints: pyzmq's flag enums cost more to combine than the sends themselves on this path.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
# Frames below this are received as bytes on a `copy` channel; larger ones stay Frames, forwarded
# without a copy (pyzmq's own threshold for sending uncopied).
_SMALL = zmq.COPY_THRESHOLD


class LoopSocket:
    """One ZMQ socket and the callback that receives its messages.

    Created by whoever owns the socket (the proxy for frontend sockets, a `Generation` for worker
    sockets); `close()` stops delivery at once, so a closed channel can never call back.
    """

    def __init__(self, name: str, socket: zmq.Socket[bytes], on_message: Callable[[Frames], None], *,
                 copy: bool = False):
        """`copy`: frames under 64 KiB are handed on as bytes, not `zmq.Frame`s (the path every
        cell takes: a Frame is a Python object whose every attribute goes through pyzmq's
        `__getattr__`, and its bytes are a copy anyway once a decision reads them)."""
        self.name = name
        self.socket = socket
        self._on_message = on_message
        self._copy = copy
        # Bound once: every attribute of a pyzmq socket is looked up through its `__getattr__` hook.
        # The send is the backend's own: pyzmq's Python-level `Socket.send` only adds the draft
        # API's routing_id and group (never used here) in front of it, and doubled its cost per frame.
        self._recv = socket.recv
        self._get = socket.get
        self._send = zmq.backend.Socket.send.__get__(socket)
        self._loop = asyncio.get_running_loop()
        self._fd = socket.fileno()  # the FD option, typed as the int it is
        self._scheduled = False
        self.closed = False
        self._loop.add_reader(self._fd, self._drain)
        # Messages may already be queued; the FD only signals edges.
        self._schedule()

    def send(self, frames: Sequence[bytes | zmq.Frame], *, copy: bool = False) -> bool:
        """Send one multipart message without blocking; False when it was dropped.

        On a ROUTER_MANDATORY socket, False without a word when the peer is not connected: the
        caller decides what that means."""
        if self.closed:
            return False
        try:
            self._put(frames, copy)
        except zmq.Again:
            log.warning("%s: send queue full, message dropped", self.name)
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                log.warning("%s: send failed: %s", self.name, e)
            return False
        return True

    def offer(self, frames: Sequence[bytes | zmq.Frame], *, copy: bool = False) -> bool:
        """Send one multipart message without blocking; False only when the queue is full (the
        caller keeps it, to offer again later). Other failures are logged, and the message counts
        as sent (there is nothing to retry)."""
        if self.closed:
            return True
        try:
            self._put(frames, copy)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            log.warning("%s: send failed: %s", self.name, e)
        return True

    def _put(self, frames: Sequence[bytes | zmq.Frame], copy: bool) -> None:
        send = self._send
        try:
            # A multipart message is queued atomically: if the first part goes, all parts go.
            for frame in frames[:-1]:
                send(frame, _NOBLOCK | _SNDMORE, copy=copy)
            send(frames[-1], _NOBLOCK, copy=copy)
        finally:
            self._after_send()

    def _after_send(self) -> None:
        """A send can consume the FD's edge for messages that arrived meanwhile: ask the socket
        (which re-arms the edge, as pyzmq's asyncio sockets do) and deliver on the next turn only if
        something is waiting, instead of a turn of the loop after every send."""
        if self._scheduled or self.closed:
            return
        try:
            waiting = self._get(_EVENTS) & _POLLIN  # type: ignore[operator]  # EVENTS is an int
        except zmq.ZMQError:
            waiting = True  # the next turn's receive reports what is wrong
        if waiting:
            self._schedule()

    def drain(self) -> None:
        """Deliver every message already queued on the socket (used before a generation ends)."""
        try:
            while not self.closed and self._drain_batch():
                pass
        finally:
            self._schedule()  # if a callback raised, the rest is delivered on the next turn

    def close(self, linger: int = 0) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        self.socket.close(linger=linger)

    def _schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        more = True
        try:
            more = self._drain_batch()
        finally:
            if more:  # also when a callback raised: what is queued behind it is not stranded
                self._schedule()

    def _drain_batch(self) -> bool:
        """Deliver up to one batch; True when more may be waiting."""
        recv, get, copy = self._recv, self._get, self._copy
        for _ in range(_BATCH):
            if self.closed:
                return False
            try:
                # Ask first: a failed non-blocking recv raises, and exceptions cost more than asking.
                # EVENTS and RCVMORE are int options; pyzmq types every option's value int | bytes,
                # and narrowing here would cost on every frame.
                if not get(_EVENTS) & _POLLIN:  # type: ignore[operator]  # EVENTS is an int
                    return False
                # recv_multipart's loop, without its attribute lookups and its RCVMORE option call
                # per frame (pyzmq's `get` makes an enum of the option each time): a received
                # Frame carries that flag already.
                frames: Frames = []
                while True:
                    frame = recv(_NOBLOCK, copy=False)
                    frames.append(frame.bytes if copy and len(frame) < _SMALL else frame)
                    if not frame.more:
                        break
            except zmq.Again:
                return False
            except zmq.ZMQError as e:
                log.warning("%s: receive failed: %s", self.name, e)
                return False
            self._on_message(frames)
        return True
