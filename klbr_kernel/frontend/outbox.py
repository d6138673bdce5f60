"""iopub toward the frontends: what closes a request is not dropped for a frontend that keeps
reading, and memory stays bounded.

ipykernel's iopub is a PUB socket: a subscriber that falls 1000 messages behind loses what comes
next, silently, and when that is a cell's `idle`, nbclient and papermill wait for it forever. The
proxy's iopub is an XPUB with ``XPUB_NODROP``: a send that finds a subscriber's queue full
(`standin.IOPUB_QUEUE` messages) fails instead, and the message waits here, in order, and is offered
again every `_RETRY` seconds. Waiting outputs are bounded by `max_bytes`: past it, the oldest
outputs (stream, displays, results) are dropped and counted per request (`dropped`, noticed before
the request's idle); status, execute_input, errors and comm traffic are kept. The cell log keeps
every output whatever happens here.

A subscriber that takes nothing at all for `STALL` seconds (a suspended console, a client that never
reads iopub) must not hold back the others: from then on outputs it cannot take are sent past it, as
a PUB would (whoever is full loses them), until it takes messages again; what closes a request
(status, errors) still waits up to `CATCH_UP` seconds for every subscriber to have room, so a
frontend that is only slow has that long to make room before even those go past. The same happens when what
waits passes `max_bytes` twice over (comm traffic can be large).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque

import zmq

from klbr_supervisor.messages import protocol
from klbr_supervisor.messages.sockets import LoopSocket

log = logging.getLogger(__name__)

# Bytes of outputs that may wait here for a slow frontend before the oldest are dropped.
MAX_BYTES = 64 * 2**20
# Outputs: what may be dropped (and replayed from the cell log). Everything else is kept.
DROPPABLE = frozenset({"stream", "display_data", "update_display_data", "execute_result", "clear_output"})
# Seconds without any message taken before a stalled subscriber stops holding back the others.
STALL = 10.0
# Seconds a message that closes a request waits for room everywhere once a subscriber is stalled.
CATCH_UP = 1.0
# How often what waits is offered again.
_RETRY = 0.05


# What waits: frames, droppable size (0: never dropped), copy, when it began to wait.
_Entry = tuple[protocol.Frames, int, bool, float]


def _parent_id(frames: protocol.Frames) -> str:
    try:
        msg_id = json.loads(protocol.as_bytes(protocol.split(frames)[1][2])).get("msg_id", "")
    except (ValueError, AttributeError):  # no message, or a parent header that is no JSON object
        return ""
    return msg_id if isinstance(msg_id, str) else ""  # a request's is a str (the door admits no other)


class Outbox:
    def __init__(self, channel: LoopSocket, max_bytes: int = MAX_BYTES):
        self._channel = channel
        self._waiting: deque[_Entry] = deque()
        self._bytes = 0  # of the droppable ones waiting
        self._all_bytes = 0  # of everything waiting
        self.max_bytes = max_bytes
        self.dropped: dict[str, int] = {}  # parent msg_id -> outputs dropped for it
        self._timer: asyncio.TimerHandle | None = None
        self._stuck_since: float | None = None  # when the socket last refused with nothing taken since
        self._past_stalled = False  # sending past a stalled subscriber

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def send(self, frames: protocol.Frames, msg_type: str, *, copy: bool = False, keep: bool = False) -> None:
        """Send now, or keep in order until the socket takes it; `keep`: never drop it."""
        output = msg_type in DROPPABLE and not keep
        if not self._waiting and self._offer(frames, copy, past=output):
            return
        size = sum(len(f) for f in frames)  # what waits is counted; what went out at once never is
        droppable = size if output else 0
        if droppable and self._bytes + droppable > self.max_bytes:
            self._make_room(droppable)
            if self._bytes + droppable > self.max_bytes:
                self._drop(frames)
                return
        self._waiting.append((frames, droppable, copy, time.monotonic()))
        self._bytes += droppable
        self._all_bytes += size
        if self._all_bytes > 2 * self.max_bytes and not self._past_stalled:
            log.warning("iopub: %d MiB wait for a frontend that is not reading; sending past it",
                        self._all_bytes >> 20)
            self._past_stalled = True
        self._arm()

    def flush(self) -> None:
        """Send what waits, in order, until the socket is full again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if (not self._past_stalled and self._stuck_since is not None
                and time.monotonic() - self._stuck_since > STALL):
            log.warning("iopub: a frontend has taken nothing for %.0f s; what it cannot take goes past it", STALL)
            self._past_stalled = True
        now = time.monotonic()
        while self._waiting:
            frames, droppable, copy, since = self._waiting[0]
            if not self._offer(frames, copy, past=bool(droppable) or now - since > CATCH_UP):
                break
            self._waiting.popleft()
            self._bytes -= droppable
            self._all_bytes -= sum(len(f) for f in frames)
        self._arm()

    def take_dropped(self, parent_id: str) -> int:
        """How many outputs of request `parent_id` were dropped (counted once)."""
        return self.dropped.pop(parent_id, 0)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._waiting and self._timer is None and not self._channel.closed:
            self._timer = asyncio.get_running_loop().call_later(_RETRY, self.flush)

    def _offer(self, frames: protocol.Frames, copy: bool, past: bool) -> bool:
        """Offered to every subscriber; while one is stalled and `past` is allowed, sent to those
        with room only."""
        if self._channel.offer(frames, copy=copy):
            self._stuck_since = None
            self._past_stalled = False  # every subscriber takes messages again
            return True
        if self._past_stalled and past:
            sock = self._channel.socket
            sock.setsockopt(zmq.XPUB_NODROP, 0)  # a PUB's way, for this message
            try:
                return self._channel.offer(frames, copy=copy)
            finally:
                sock.setsockopt(zmq.XPUB_NODROP, 1)
        if self._stuck_since is None:
            self._stuck_since = time.monotonic()
        return False

    def _make_room(self, size: int) -> None:
        """Drop the oldest waiting outputs until `size` more bytes fit (or none is left)."""
        kept: deque[_Entry] = deque()
        while self._waiting and self._bytes + size > self.max_bytes:
            entry = self._waiting.popleft()
            if entry[1]:
                self._bytes -= entry[1]
                self._all_bytes -= entry[1]  # an output's whole size
                self._drop(entry[0])
            else:
                kept.append(entry)
        kept.extend(self._waiting)
        self._waiting = kept

    def _drop(self, frames: protocol.Frames) -> None:
        parent = _parent_id(frames)
        count = self.dropped.get(parent, 0)
        if count == 0:
            log.warning("iopub: a frontend is not reading; outputs of %s are dropped (the cell log keeps them)",
                        parent or "a request")
        self.dropped[parent] = count + 1
        if len(self.dropped) > 10_000:  # requests that never asked: forget the oldest
            del self.dropped[next(iter(self.dropped))]

