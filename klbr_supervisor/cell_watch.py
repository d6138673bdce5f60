"""The cell running on the current generation, its deadline, and the interrupt ladder carried out.

Owned by the `Supervisor` as `cells`, which hands it the execute it sends (`sent`) and every message
of the current generation's worker as it passes (`message`): the cell's busy starts its deadline,
an `input_request` pauses it (the next message to the worker's stdin resumes it), its execution
count tells the generation where the next one goes, and its reply and idle end it. The decisions
(grace, deadlines, poison) are the `Policy`'s; here they are carried out: an interrupt that has not
ended the cell after `interrupt_grace` seconds, or a deadline whose interrupt did not, stops the
generation (WorkerKilled, CellTimeout).

An interrupt waits for its cell to begin: ipykernel ignores SIGINT between cells (SIG_IGN) and
installs its handler only once it runs the execute, after its busy, so a signal sent before was
lost, the cell ran on and the grace killed the worker. It goes out at the cell's execute_input
(published from inside the handler); a silent execute has none: at its busy, and once more
`RESEND` later if the cell has not ended; a worker not yet seen to publish an execute_input (a
kernelspec's kernel may publish none): `interrupt_grace` after its busy; and whatever the worker
publishes, `interrupt_grace` after the interrupt at the latest (a worker hung holding the GIL as the
cell began publishes nothing more, and is still ended). The grace counts from the signal
(decision 68).
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

# How long after a silent execute's busy its interrupt is sent again: ipykernel installs its SIGINT
# handler right after publishing busy, and a signal that came first was ignored.
RESEND = 0.25


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
        self.last: RunningCell | None = None  # the last execute sent, ended or not
        self._announcing: Generation | None = None  # the last generation seen publishing execute_input

    def sent(self, msg_id: str, code: str, gen: Generation, timeout: float | None, cell_id: int | None,
             counts: bool = False, silent: bool = False) -> RunningCell:
        """An execute went to `gen`: from now until it ends, a loss of `gen` is this cell's. A cell
        still watched (its worker never sent its reply or its idle: the proxy answered it instead)
        ended before this one was sent."""
        if self.cell is not None:
            self.finished(self.cell.msg_id)
        cell = RunningCell(msg_id, code, gen, timeout, self._deadline_passed, cell_id, counts, silent)
        self.cell = self.last = cell
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
            elif msg_type == "execute_input":
                self.began(cell.msg_id)
                if cell.counts:
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
        if cell.silent:
            self._begun(cell)
        elif cell.interrupt_asked:
            self._overdue_after_grace(cell)

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

    async def interrupt(self, gen: Generation) -> None:
        """Interrupt `gen` now, or, if its cell has not begun, once it has (see the docstring)."""
        cell = self.cell
        if cell is not None and cell.generation is gen and not cell.begun:
            if not cell.interrupt_asked:
                cell.interrupt_asked = True
                if cell.started:
                    self._overdue_after_grace(cell)
                # Whatever it publishes, it goes within the grace: a worker that hung as the cell
                # began, holding the GIL, publishes nothing more (its execute_input included).
                assert self.tasks is not None  # the supervisor's group runs before any cell is sent
                self.tasks.start(self._begin_late(cell), "an interrupt whose cell has not begun")
            return
        await gen.interrupt()
        if cell is not None and cell.generation is gen:
            self._ladder(cell)

    def began(self, msg_id: str) -> None:
        """The worker published the execute's execute_input: it runs it, its SIGINT handler installed."""
        if self.cell is not None and self.cell.msg_id == msg_id:
            self._announcing = self.cell.generation
            self._begun(self.cell)

    def _begun(self, cell: RunningCell) -> None:
        """The worker runs `cell` with its SIGINT handler installed: an interrupt waiting goes."""
        if cell.begun or cell.finished.is_set():
            return
        cell.begun = True
        if cell.interrupt_asked:
            assert self.tasks is not None  # the supervisor's group runs before any cell is sent
            self.tasks.start(self._interrupt_begun(cell), "an interrupt that waited for its cell")

    def _overdue_after_grace(self, cell: RunningCell) -> None:
        """A cell busy with an interrupt waiting, on a worker not seen to publish execute_input: if
        none comes within the grace (it publishes none), the interrupt goes anyway."""
        if cell.generation is not self._announcing:
            assert self.tasks is not None  # the supervisor's group runs before any cell is sent
            self.tasks.start(self._begin_late(cell), "an interrupt for a cell with no execute_input")

    async def _begin_late(self, cell: RunningCell) -> None:
        await asyncio.sleep(self.policy.interrupt_grace)
        self._begun(cell)

    async def _interrupt_begun(self, cell: RunningCell) -> None:
        gen = cell.generation
        await gen.interrupt()
        if cell.silent:  # its busy came just before ipykernel's handler: once more, unless it has ended
            try:
                async with asyncio.timeout(RESEND):
                    await cell.finished.wait()
                return
            except TimeoutError:
                await gen.interrupt()
        self._ladder(cell)

    def _ladder(self, cell: RunningCell) -> None:
        """An interrupt went to `cell`'s worker: it has `interrupt_grace` seconds to end."""
        if not cell.interrupted and not cell.finished.is_set():
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
