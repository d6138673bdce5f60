"""The cell running on the current generation, its deadline, and the interrupt ladder carried out.

Owned by the `Supervisor` as `cells`, which hands it the execute it sends (`sent`) and every message
of the current generation's worker as it passes (`message`): the cell's busy starts its deadline,
an `input_request` pauses it (the next message to the worker's stdin resumes it), its execution
count tells the generation where the next one goes, and its reply and idle end it. The decisions
(grace, deadlines, poison) are the `Policy`'s; here they are carried out: an interrupt that has not
ended the cell after `interrupt_grace` seconds, or a deadline whose interrupt did not, stops the
generation (WorkerKilled, CellTimeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .policy import Policy
from .running import RunningCell
from .states import EndReason

if TYPE_CHECKING:
    from .generation import Generation
    from .messages.wire import Wire
    from .tasks import Tasks


class CellWatch:
    def __init__(self, policy: Policy, kill_grace: float, log: logging.Logger,
                 on_finished: Callable[[RunningCell], None]):
        """`on_finished(cell)` is called when a cell ends with a reply from its worker."""
        self.policy = policy
        self.kill_grace = kill_grace
        self.log = log
        self._on_finished = on_finished
        self.tasks: Tasks | None = None  # set by the supervisor once its task group runs
        self.cell: RunningCell | None = None

    def sent(self, msg_id: str, code: str, gen: Generation, timeout: float | None, cell_id: int | None,
             counts: bool = False) -> RunningCell:
        """An execute went to `gen`: from now until it ends, a loss of `gen` is this cell's. A cell
        still watched (its worker never sent its reply or its idle: the proxy answered it instead)
        ended before this one was sent."""
        if self.cell is not None:
            self.finished(self.cell.msg_id)
        cell = RunningCell(msg_id, code, gen, timeout, self._deadline_passed, cell_id, counts)
        self.cell = cell
        # Provisional: a worker that hangs at once (holding the GIL) never reports busy, and its
        # deadline must still come. `started` starts the clock again from busy.
        cell.clock(self.policy.deadline_for(timeout))
        return cell

    def message(self, channel: str, wire: Wire) -> None:
        """A message from the current generation's worker, on its way to the listener."""
        cell = self.cell
        if cell is None:
            return
        if channel == "stdin":
            if wire.msg_type == "input_request":  # a person is thinking: the deadline pauses
                cell.waiting_for_input(True)
            return
        if wire.parent_id != cell.msg_id:
            return
        if channel == "iopub":
            msg_type = wire.msg_type
            if msg_type == "status":
                state = wire.execution_state
                if state == "busy":
                    self.started(cell.msg_id)
                elif state == "idle":
                    cell.idle = True
            elif msg_type == "execute_input" and cell.counts:
                self._counted(cell, wire)
        elif channel == "shell" and wire.msg_type == "execute_reply":
            cell.replied = True
            if cell.counts and wire.content.get("status") != "aborted":
                self._counted(cell, wire)
        if cell.replied and cell.idle:
            self.finished(cell.msg_id)

    @staticmethod
    def _counted(cell: RunningCell, wire: Wire) -> None:
        """The worker numbered the cell: its next counted cell gets the number after."""
        count = wire.content.get("execution_count")
        if isinstance(count, int):
            cell.generation.next_count = count + 1

    def started(self, msg_id: str) -> None:
        """The worker reported busy for the execute; its deadline starts now (semantics 11)."""
        cell = self.cell
        if cell is None or cell.msg_id != msg_id or cell.started:
            return
        cell.started = True
        cell.generation.mark_busy(True)
        if cell.deadline is not None:
            cell.clock(self.policy.deadline_for(cell.timeout))

    def waiting_for_input(self, waiting: bool) -> None:
        """The running cell asked for input (the deadline pauses) or got its answer (it resumes)."""
        if self.cell is not None:
            self.cell.waiting_for_input(waiting)

    def finished(self, msg_id: str) -> None:
        """The execute ended with a reply from its worker (not a loss), or the next was sent."""
        cell = self.cell
        if cell is None or cell.msg_id != msg_id:
            return
        self.cell = None
        cell.end()
        self.policy.note_outcome(cell.code, lost=False)
        cell.generation.mark_busy(False)
        self._on_finished(cell)

    def ended(self, gen: Generation, reason: EndReason) -> None:
        """`gen` ended: its cell, if it had one, ended with it (a loss counts towards poison)."""
        cell = self.cell
        if cell is not None and cell.generation is gen:
            self.cell = None
            cell.end()
            if reason is EndReason.LOST:
                self.policy.note_outcome(cell.code, lost=True)

    def interrupted(self, gen: Generation) -> None:
        """An interrupt went to `gen`: its cell has `interrupt_grace` seconds to end."""
        cell = self.cell
        if cell is not None and cell.generation is gen and not cell.interrupted:
            cell.interrupted = True
            assert self.tasks is not None  # the supervisor's group runs before any cell is sent
            self.tasks.start(self._kill_unless_finished(cell, EndReason.KILLED), "the interrupt ladder")

    def _deadline_passed(self, cell: RunningCell) -> None:
        assert cell.deadline is not None and self.tasks is not None  # it rang; the supervisor's group runs
        self.log.warning("cell %s passed its deadline of %.0f s", cell.msg_id, cell.deadline.seconds)
        cell.timed_out = True
        cell.interrupted = True
        self.tasks.start(self._interrupt_then_kill(cell), "the deadline's ladder")

    async def _interrupt_then_kill(self, cell: RunningCell) -> None:
        await cell.generation.interrupt()
        await self._kill_unless_finished(cell, EndReason.DEADLINE)

    async def _kill_unless_finished(self, cell: RunningCell, reason: EndReason) -> None:
        """The ladder's second step: called right after the interrupt went out."""
        clock = self.policy.clock
        try:
            async with asyncio.timeout(self.policy.kill_at(clock()) - clock()):
                await cell.finished.wait()
        except TimeoutError:
            if cell.generation.ending is None:
                self.log.warning("generation %d ignored the interrupt: killing it", cell.generation.number)
                await cell.generation.stop(reason, self.kill_grace)
