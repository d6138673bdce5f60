"""Execution counts across generations (DESIGN.md semantics 4): `In[n]` never repeats in a session.

No I/O. The frontend has been shown `last`. A worker assigns the counts of the cells it runs; a cell
the proxy answers itself (a `%klbr` cell, a refusal, a cell whose worker died) keeps the count the
worker gave it or takes the next one, and its code is kept so that the next worker, told where to
continue, fills in its `In[n]` too.
"""

from __future__ import annotations


class ExecutionCounts:
    def __init__(self) -> None:
        self.last = 0
        self._texts: dict[int, str] = {}  # In[n] the current worker has not seen

    def from_worker(self, count: int) -> None:
        """The current worker gave a cell `count`."""
        self.last = max(self.last, count)

    def answered(self, code: str, count: int | None = None) -> int:
        """A cell answered without the current worker: its count (`count`, else the next one)."""
        if count is None:
            count = self.last + 1
        self.last = max(self.last, count)
        self._texts[count] = code
        return count

    def catch_up(self) -> dict[int, str]:
        """What a worker that continues after `last` must put into `In` (then forgotten here)."""
        texts, self._texts = self._texts, {}
        return texts
