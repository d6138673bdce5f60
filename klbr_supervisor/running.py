"""The execute running on a generation, as far as deadlines and the interrupt ladder care.

Its deadline clock (semantics 11) runs provisionally from the send (a worker that hangs at
once never reports busy), starts again at busy, and pauses while the cell waits for `input()`. When
it runs out, `on_deadline(cell)` is called on the loop; the `Supervisor` carries out the ladder.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .generation import Generation
    from .policy import Deadline


@dataclass(eq=False)
class RunningCell:
    msg_id: str
    code: str
    generation: Generation
    timeout: float | None  # a `%%klbr timeout=` override
    on_deadline: Callable[[RunningCell], None]
    cell_id: int | None = None  # its row in the store (what `host.inspect` calls the cell)
    counts: bool = False  # it takes an execution count (its worker numbers the next cell after it)
    silent: bool = False  # a silent execute: its worker publishes no execute_input for it
    deadline: Deadline | None = None
    started: bool = False  # the worker reported busy for it
    begun: bool = False  # a SIGINT lands on it: its execute_input came (a silent one's busy)
    interrupt_asked: bool = False  # an interrupt for it waits for it to begin (see `CellWatch.interrupt`)
    replied: bool = False  # the worker's reply to it has come
    idle: bool = False  # the worker's idle for it has come
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: bool = False
    timed_out: bool = False
    timer: asyncio.TimerHandle | None = None
    ended_at: float | None = None  # time.monotonic() at its end

    def clock(self, deadline: Deadline | None) -> None:
        """Run the deadline clock afresh with `deadline` (None: the cell has no deadline)."""
        self._disarm()
        self.deadline = deadline
        self._arm()

    def waiting_for_input(self, waiting: bool) -> None:
        """The clock pauses while the cell waits for `input()` and resumes with the answer."""
        if self.deadline is None:
            return
        if waiting:
            self.deadline.pause()
            self._disarm()
        else:
            self.deadline.resume()
            self._arm()

    def end(self) -> None:
        """It ended (a reply, or the end of its generation): nothing waits on it any more."""
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        self.finished.set()
        self._disarm()

    def _arm(self) -> None:
        if self.deadline is not None and not self.deadline.paused:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(max(0.0, self.deadline.remaining()), self._ring)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _ring(self) -> None:
        if self.finished.is_set() or self.timed_out:
            return
        assert self.deadline is not None  # armed only with one
        if self.deadline.remaining() > 0:  # resumed after a pause: not yet
            self._arm()
            return
        self.on_deadline(self)
