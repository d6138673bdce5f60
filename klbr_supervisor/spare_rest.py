"""When the warm spare rests: a kernel that has run no cell for `Supervisor.standby_idle_timeout`
seconds stops its spare, and the next cell starts it again (decision 73).

The spare is kept so that a lost worker's next cell runs at once. Workers are lost while they run
cells (a segfault, the memory they asked for); a kernel left idle, as most of a shared server's
kernels are most of the time, holds a second worker (~30 MiB) that is unlikely to be needed before
its user comes back. So an idle kernel lets its spare go, and costs what one with `standby` off
costs; the cell that ends the rest starts it, `standby_delay` after that cell is sent (its start
would compete with the cell for the CPU), so a worker lost later in that cell, or after it, is
replaced at once again. A worker lost while the spare rests is replaced by a cold start, as with
`standby` off.

A cell is an execute sent to the worker (`Supervisor.send_execute`), silent ones included: requests
the proxy answers itself, completions and comm messages are not. "Idle" counts from the end of the
last cell (its reply, or its worker's end), or from the start when none has run. One timer, re-armed
when it fires (at most once per `standby_idle_timeout` while cells run), does the watching: nothing is
added to a cell but a check of `resting` as it is sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .running import RunningCell


class SpareRest:
    def __init__(self, after: float, delay: float, *, kept: Callable[[], bool],
                 last_cell: Callable[[], RunningCell | None], stop: Callable[[], None], start: Callable[[], None],
                 log: logging.Logger):
        """`after`: the idle seconds before the spare rests (0: never); `delay`: seconds between the
        cell that ends a rest and its spare's start; `kept()`: whether a spare is kept at all now
        (`Supervisor.standby`, or the placement's default); `last_cell()`: the last execute sent,
        ended or not; `stop()` and `start()` stop the spare and start one if none is kept."""
        self.after = after
        self.resting = False
        self._delay = delay
        self._kept = kept
        self._last_cell = last_cell
        self._stop = stop
        self._start = start
        self._log = log
        self._since = time.monotonic()  # idle from here while no cell has run
        self._timer: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        """Start watching, on the running loop (`Supervisor.run`)."""
        self._since = time.monotonic()
        self._arm(self.after)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def cell_sent(self) -> None:
        """An execute goes to the worker: a resting spare is started again."""
        if not self.resting:
            return
        self.resting = False
        self._arm(self.after)
        if self._kept():
            self._log.info("a cell after the rest: the spare starts again in %g s", self._delay)
            asyncio.get_running_loop().call_later(self._delay, self._start)

    def _idle_since(self) -> float | None:
        """When the kernel went idle (the last cell's end, or the start); None while a cell runs."""
        cell = self._last_cell()
        if cell is None:
            return self._since
        return cell.ended_at

    def _arm(self, seconds: float) -> None:
        self.close()
        if self.after > 0:
            self._timer = asyncio.get_running_loop().call_later(seconds, self._check)

    def _check(self) -> None:
        self._timer = None
        since = self._idle_since()
        if since is None:  # a cell runs: look again once it could have been idle long enough
            self._arm(self.after)
            return
        idle = time.monotonic() - since
        if not self._kept():  # no spare to let go: look again later, the placement may change
            self._arm(self.after)
            return
        if idle < self.after:
            self._arm(self.after - idle)
            return
        self.resting = True
        self._log.info("no cell for %.0f s: the spare rests until the next cell", idle)
        self._stop()
