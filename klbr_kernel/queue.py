"""The proxy's shell queue: one request in flight per generation, stop_on_error applied here.

No I/O: the proxy pushes requests, takes the next one when the worker is free, and tells the queue
when the one in flight is done; the queue says which waiting executes are aborted, as ipykernel
aborts the executes queued behind an error (DESIGN.md semantics 11).
"""

from __future__ import annotations

from collections import deque

from .requests import Request


class ShellQueue:
    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.inflight: Request | None = None

    def push(self, req: Request) -> None:
        self.waiting.append(req)

    def take(self) -> Request | None:
        """The next request to send, if none is in flight."""
        if self.inflight is None and self.waiting:
            self.inflight = self.waiting.popleft()
            return self.inflight
        return None

    def put_back(self, req: Request) -> None:
        """The request in flight goes back to the head (it is retried, or waits for a generation)."""
        if req is self.inflight:
            self.inflight = None
        self.waiting.appendleft(req)

    def drop(self, req: Request) -> None:
        """`req` leaves the queue, wherever it is in it."""
        if req is self.inflight:
            self.inflight = None
        elif req in self.waiting:
            self.waiting.remove(req)

    def finish(self, req: Request, status: str) -> list[Request]:
        """`req` (in flight) ended with reply `status`; returns the waiting executes to abort."""
        if req is self.inflight:
            self.inflight = None
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
