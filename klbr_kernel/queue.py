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

    def __len__(self) -> int:
        return len(self.waiting) + (self.inflight is not None)

    def push(self, req: Request) -> None:
        self.waiting.append(req)

    def push_front(self, req: Request) -> None:
        """Put a request back at the head (a retry after its generation was lost)."""
        self.waiting.appendleft(req)

    def take(self) -> Request | None:
        """The next request to send, if none is in flight."""
        if self.inflight is None and self.waiting:
            self.inflight = self.waiting.popleft()
            return self.inflight
        return None

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
