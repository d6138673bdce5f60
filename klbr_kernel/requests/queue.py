"""The proxy's shell queue: one request in flight per generation, stop_on_error applied here.

No I/O: the proxy pushes requests, takes the next one when the worker is free, and tells the queue
when the one in flight is done; the queue says which waiting executes are aborted, as ipykernel
aborts the executes queued behind an error (semantics 11).

Its state (`states.QueueState`) is free, busy with the request in flight, or abandoned: the error
boundary answered the request in flight while its worker still runs it, and nothing starts until
that worker's idle for it comes, or its generation ends (`abandon`, `worker_free`).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .request import Request
from .states import QUEUE_TRANSITIONS, IllegalMove, Machine, QueueState

if TYPE_CHECKING:
    from klbr_supervisor.generation import Generation


class ShellQueue:
    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.inflight: Request | None = None
        # The request the boundary answered while its worker runs it, and that worker's generation.
        self.abandoned: tuple[str, Generation] | None = None
        self._state = Machine("shell queue", QUEUE_TRANSITIONS, QueueState.FREE)

    @property
    def state(self) -> QueueState:
        return self._state.state

    @property
    def free(self) -> bool:
        """Whether the next request may start."""
        return self._state.state is QueueState.FREE

    def push(self, req: Request) -> None:
        self.waiting.append(req)

    def take(self) -> Request | None:
        """The next request to send, if the queue is free."""
        if self.free and self.waiting:
            self.inflight = self.waiting.popleft()
            self._state.move(QueueState.BUSY, self.inflight.msg_id)
            return self.inflight
        return None

    def put_back(self, req: Request) -> None:
        """The request in flight goes back to the head (it is retried, or waits for a generation)."""
        self._release(req, "put back")
        self.waiting.appendleft(req)

    def drop(self, req: Request) -> None:
        """`req` leaves the queue, wherever it is in it."""
        if req is self.inflight:
            self._release(req, "dropped")
        elif req in self.waiting:
            self.waiting.remove(req)

    def abandon(self, req: Request, generation: Generation) -> None:
        """The boundary answered `req`, in flight, while the worker of `generation` still runs it."""
        if req is not self.inflight:
            msg = f"shell queue: {req.msg_id} is not the request in flight"
            raise IllegalMove(msg)
        self.inflight = None
        self.abandoned = (req.msg_id, generation)
        self._state.move(QueueState.ABANDONED, req.msg_id)

    def worker_free(self, why: str) -> None:
        """The abandoned request's worker is free again (its idle came, or its generation ended)."""
        self.abandoned = None
        self._state.move(QueueState.FREE, why)

    def finish(self, req: Request, status: str) -> list[Request]:
        """`req` (in flight, or abandoned) ended with reply `status`; returns the waiting executes
        to abort."""
        if req is self.inflight:
            self._release(req, status)
        stops = (
            req.msg_type == "execute_request"
            and status == "error"
            and req.stop_on_error
            and not req.silent
        )
        if not stops:
            return []
        aborted = [r for r in self.waiting if r.msg_type == "execute_request"]
        self.waiting = deque(r for r in self.waiting if r.msg_type != "execute_request")
        return aborted

    def clear(self) -> list[Request]:
        """Everything not yet sent, in order (at shutdown, or when no worker can start)."""
        waiting = list(self.waiting)
        self.waiting.clear()
        return waiting

    def _release(self, req: Request, why: str) -> None:
        """The request in flight is no longer: the queue is free."""
        if req is not self.inflight:
            msg = f"shell queue: {req.msg_id} is not the request in flight"
            raise IllegalMove(msg)
        self.inflight = None
        self._state.move(QueueState.FREE, f"{req.msg_id} {why}")
