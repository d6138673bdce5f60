"""Execution counts across generations (semantics 4): `In[n]` never repeats in a session.

No I/O. The frontend has been shown `last`. A worker assigns the counts of the cells it runs; a cell
the proxy answers itself (a `%klbr` cell, a refusal, a cell whose worker died) keeps the count the
worker gave it or takes the next one, and its code is kept so that the next worker, told where to
continue (`Supervisor.send_execute`'s `sync`), fills in its `In[n]` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request import Request


class ExecutionCounts:
    """The session's counts, and the one writer of each cell's (`Execute.count`)."""

    def __init__(self) -> None:
        self.last = 0
        self._texts: dict[int, str] = {}  # In[n] the current worker has not seen
        # The count the worker will give the cell it runs now, before it says so: (msg_id, count).
        # A cell answered meanwhile (a replay) must not take it.
        self._reserved: tuple[str, int] | None = None

    def reserve(self, msg_id: str) -> None:
        """A counted cell goes to the worker, which gives it the next count."""
        self._reserved = (msg_id, self.last + 1)

    def from_worker(self, count: int) -> None:
        """The current worker gave a cell `count`."""
        self.last = max(self.last, count)
        if self._reserved is not None and count >= self._reserved[1]:
            self._reserved = None

    def answered(self, code: str, count: int | None = None, msg_id: str | None = None) -> int:
        """A cell answered without the current worker: its count (`count`; the one reserved for
        it, if it is the cell `msg_id` the worker never numbered; else the next free one)."""
        if count is None:
            reserved = self._reserved
            if reserved is not None and reserved[0] == msg_id:
                count, self._reserved = reserved[1], None
            else:
                count = max(self.last, reserved[1] if reserved is not None else 0) + 1
        self.last = max(self.last, count)
        self._texts[count] = code
        return count

    def catch_up(self) -> dict[int, str]:
        """What a worker that continues after `last` must put into `In` (then forgotten here)."""
        texts, self._texts = self._texts, {}
        return texts

    def numbered(self, req: Request, count: int) -> None:
        """The worker's execute_input gave `req` its `count` (it moves the session's on, if `req`
        takes one: a replay answered meanwhile takes the next)."""
        if req.execute is not None:
            req.execute.count = count
        if req.counts:
            self.from_worker(count)

    def number_answered(self, req: Request) -> int | None:
        """`req`, a cell the proxy answers without the current worker, takes its count (see
        `answered`); its code fills that `In[n]` on the next worker."""
        if req.execute is not None:
            req.execute.count = self.answered(req.code, req.execute.count, req.msg_id)
        return req.count
