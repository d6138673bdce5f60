"""The proxy's state machines, as data: each lists its states and the moves it allows.

Every change of state goes through one door, which refuses a move its table does not list and logs
each move at debug level (as `Generation._set_state` does). A refused move is a bug in klbr: it
raises `IllegalMove`, and the error boundary answers the request it concerned with an InternalError
(semantics 1); the kernel keeps serving.

- `Phase`: one request's life, from arrival to its last reply and idle (`requests.Request.move`);
- `ProxyState`: the proxy's own: serving, then stopping once a shutdown begins (semantics 13);
- `QueueState`: the shell queue's: free, one request in flight (semantics 11), or waiting for a
  worker that still runs a request the boundary answered (`queue.ShellQueue`);
- `LinkState`: the current generation as the proxy sees it (`current.Current`).

Imports nothing of ours.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Generic, TypeVar

log = logging.getLogger(__name__)


class IllegalMove(RuntimeError):  # noqa: N818 — named for what happened, as the tables name moves
    """A move a state machine does not make: a bug in klbr."""


class Phase(enum.Enum):
    # Members hash by identity, as they compare: enum's own __hash__ is a Python function, and
    # every move looks its state up in a table and a set (dozens of calls per cell).
    __hash__ = object.__hash__
    QUEUED = "queued"  # in the shell queue, or held until a generation is ready
    RECORDING = "recording"  # a cell whose `running` row is committing before the worker sees it
    SENT = "sent"  # with the worker, which has sent neither its reply nor its idle for it yet
    AWAITING_IDLE = "awaiting_idle"  # with the worker, whose reply is in: its idle is on its way
    AWAITING_REPLY = "awaiting_reply"  # with the worker, whose idle came first: its reply is awaited
    PROXY = "proxy"  # being answered by the proxy itself (a `%klbr` cell is carried out)
    ANSWERED = "answered"  # its answer is complete, held until its outcome is committed (semantics 3)
    DONE = "done"  # the frontend has its reply and idle; nothing more happens to it


# Sent to a worker and not finished: its reply (if it has one) and its idle are not both in.
WITH_WORKER = frozenset({Phase.SENT, Phase.AWAITING_IDLE, Phase.AWAITING_REPLY})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.RECORDING, Phase.SENT, Phase.PROXY, Phase.ANSWERED}),
    Phase.RECORDING: frozenset({Phase.SENT, Phase.QUEUED, Phase.ANSWERED}),
    # Sent again once after a loss (QUEUED), or answered: by the worker, or by the proxy when the
    # worker ended, never replied, or its idle never came.
    Phase.SENT: frozenset({Phase.AWAITING_IDLE, Phase.AWAITING_REPLY, Phase.QUEUED, Phase.ANSWERED}),
    Phase.AWAITING_IDLE: frozenset({Phase.QUEUED, Phase.ANSWERED}),
    Phase.AWAITING_REPLY: frozenset({Phase.QUEUED, Phase.ANSWERED}),
    Phase.PROXY: frozenset({Phase.ANSWERED}),
    Phase.ANSWERED: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}

# The error boundary ends a request from whatever phase a failure left it in (`Proxy.internal_error`
# answers it at once): the one move besides the table, through the same door.
ENDED_BY_BOUNDARY = frozenset(Phase) - {Phase.DONE}


class ProxyState(enum.Enum):
    __hash__ = object.__hash__  # as Phase's
    SERVING = "serving"
    STOPPING = "stopping"  # a shutdown has begun: nothing new runs, what waits is aborted
    STOPPED = "stopped"  # everything is answered: `Proxy.run` returns


PROXY_TRANSITIONS: dict[ProxyState, frozenset[ProxyState]] = {
    ProxyState.SERVING: frozenset({ProxyState.STOPPING}),
    ProxyState.STOPPING: frozenset({ProxyState.STOPPED}),
    ProxyState.STOPPED: frozenset(),
}


class QueueState(enum.Enum):
    __hash__ = object.__hash__  # as Phase's
    FREE = "free"  # nothing in flight: the next request may start
    BUSY = "busy"  # one request in flight
    # The boundary answered the request in flight while its worker still runs it: the next request
    # waits for that worker's idle (or its end), and what the worker still says of it goes nowhere.
    ABANDONED = "abandoned"


QUEUE_TRANSITIONS: dict[QueueState, frozenset[QueueState]] = {
    QueueState.FREE: frozenset({QueueState.BUSY}),
    QueueState.BUSY: frozenset({QueueState.FREE, QueueState.ABANDONED}),
    QueueState.ABANDONED: frozenset({QueueState.FREE}),
}


class LinkState(enum.Enum):
    __hash__ = object.__hash__  # as Phase's
    NONE = "none"  # no generation serves: forwarded traffic waits, the queue waits
    SERVING = "serving"
    DEBUGGING = "debugging"  # serving, with a debug session on it, which ends with the generation


LINK_TRANSITIONS: dict[LinkState, frozenset[LinkState]] = {
    LinkState.NONE: frozenset({LinkState.SERVING}),
    LinkState.SERVING: frozenset({LinkState.DEBUGGING, LinkState.NONE}),
    LinkState.DEBUGGING: frozenset({LinkState.NONE}),
}

S = TypeVar("S", bound=enum.Enum)


class Machine(Generic[S]):
    """A state and its one door, `move`: for the proxy's, the queue's and the link's state."""

    __slots__ = ("_table", "state", "what")

    def __init__(self, what: str, table: Mapping[S, frozenset[S]], state: S):
        self.what = what
        self.state = state
        self._table = table

    def move(self, to: S, why: str) -> None:
        if to not in self._table[self.state]:
            msg = f"{self.what}: {self.state.value} -> {to.value} ({why})"
            raise IllegalMove(msg)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s -> %s (%s)", self.what, self.state.value, to.value, why)
        self.state = to
