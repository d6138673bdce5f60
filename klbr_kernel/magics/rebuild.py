"""`%klbr rebuild [--plan] [--generation N] [--include-errors]`: the cells that built an earlier
generation's namespace (`plan.rebuild_plan`), shown (`--plan`), or run again in the current one.

Never automatic (semantics 2): a rebuild runs only when a cell asks for it, and `--plan` shows first
what it would run. Each cell runs as a cell of its own in the log, linked to the one it repeats
(`cells.rebuild_of`), through `run_cell` (the proxy's `RebuiltCells`): its outputs go to the log, not
to the notebook; the rebuild cell prints one line per cell as it goes. The first cell that does not
end `ok` stops the rebuild: its error is shown, and the rebuild cell ends `RebuildFailed`, naming it
and what was and was not rebuilt; a cell in the plan because it raised (`--include-errors`) may
raise again, as it did. An interrupt stops it inside a cell (the cell's own KeyboardInterrupt) or
between two; deadlines and the poison rule apply to each cell, as to any.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from klbr_supervisor.generation import Generation
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..cell_log.replay import Show
from ..requests.outcomes import NAMESPACE_GONE, CellError, rebuild_failed, refusal_error
from ..requests.request import Phase, Request
from .parse import RebuildSpec
from .plan import ERRORS, Plan, PlanCell, duration, plan_text, rebuild_plan

# Refusals that mean no generation serves (a crash loop, a lost link): what was rebuilt went with the last one.
_NO_GENERATION = frozenset({"CrashLoop", "PlacementLost"})


@dataclass(frozen=True)
class Rerun:
    """How a rebuilt cell ended (`RunCell`'s answer)."""

    record_id: int | None  # its row in the cell log (None: it got none, and did not run)
    status: str  # the store's status it was recorded with
    seconds: float
    error: CellError | None = None  # why it did not end ok: the worker's error, or klbr's own
    traceback: tuple[str, ...] = ()  # the worker's traceback of that error, as the notebook shows it


# Run one cell of the plan on the generation given; its end.
RunCell = Callable[[PlanCell, Generation, Request], Awaitable[Rerun]]


def interrupted(req: Request) -> bool:
    """Whether the rebuild cell `req` was interrupted (`Lifecycle` marks it), or answered meanwhile
    (a shutdown): no cell of its plan is sent after that."""
    return (req.execute is not None and req.execute.interrupted) or req.phase is not Phase.PROXY


class RebuildStopped(Exception):  # noqa: N818 — what happened to the rebuild; `error` is its name
    """The rebuild ended before its last cell: the rebuild cell ends with `error`."""

    def __init__(self, error: CellError):
        super().__init__(error.evalue)
        self.error = error


class Rebuild:
    def __init__(self, cell_log: CellLog, supervisor: Supervisor, show: Show, run_cell: RunCell):
        """`show(req, msg_type, content)`: an output of the rebuild cell's own, shown and recorded
        (`OwnAnswers.output`); `run_cell`: one cell of the plan run again, in the log."""
        self._cell_log = cell_log
        self._supervisor = supervisor
        self._show = show
        self._run_cell = run_cell

    async def run(self, req: Request, spec: RebuildSpec) -> None:
        """Carry out one `%klbr rebuild` line of the cell `req`. Raises `MagicError` (a UsageError)
        when there is nothing to rebuild, `RebuildStopped` when a cell of the plan did not end ok."""
        cell_log, supervisor = self._cell_log, self._supervisor
        if cell_log.recording:
            await cell_log.settled()  # the generations and cells recorded so far are readable
        current = supervisor.current
        number = current.number if current is not None else None
        plan = rebuild_plan(cell_log, number, spec.generation, spec.include_errors)
        if spec.plan or not plan.runs:
            self._print(req, plan_text(plan, include_errors=spec.include_errors, current=number,
                                       where=supervisor.where.spec))
            return
        generation = await self._generation()
        await self._rebuild(req, plan, generation)

    async def _generation(self) -> Generation:
        """The generation the plan runs in: the current one, once it serves."""
        supervisor = self._supervisor
        if supervisor.current is None:
            refusal = supervisor.refusal(None)
            if refusal is not None:  # a crash loop, a lost link: nothing starts until the user says
                raise RebuildStopped(refusal_error(refusal))
            supervisor.ensure_started()
        generation = supervisor.current
        if generation is None or not await generation.wait_started() or not generation.alive:
            how = f": {generation.ending.how}" if generation is not None and generation.ending else ""
            raise RebuildStopped(rebuild_failed(
                "Nothing was rebuilt, and nothing was run: no worker serves to rebuild in. Run a cell to start "
                "one, then `%klbr rebuild` again.", f"The generation did not start{how}."))
        return generation

    async def _rebuild(self, req: Request, plan: Plan, generation: Generation) -> None:
        runs = plan.runs
        self._print(req, f"Rebuilding generation {plan.generation}'s namespace in generation {generation.number} "
                         f"({generation.placement.spec}): {len(runs)} cell{'s' if len(runs) != 1 else ''}, "
                         f"{duration(plan.seconds)} when they ran.\n")
        done: list[PlanCell] = []
        seconds = 0.0
        for cell in plan.cells:
            if cell.skipped is not None:
                self._print(req, f"{'-':>7} {cell.label:<8} {cell.first_line} … skipped: {cell.skipped}\n")
                continue
            position = f"[{len(done) + 1}/{len(runs)}]"
            stopped = self._stop_before(req, cell, generation)
            if stopped is not None:
                self._stopped(plan, done, cell, position, stopped)
            self._print(req, f"{position:>7} {cell.label:<8} {cell.first_line} … ")
            rerun = await self._run_cell(cell, generation, req)
            seconds += rerun.seconds
            logged = f" (cell {rerun.record_id})" if rerun.record_id is not None else ""
            # A cell in the plan because it raised (`--include-errors`) that raises again ended as it did.
            as_then = cell.status in ERRORS and rerun.status == "error"
            self._print(req, f"{rerun.status} {duration(rerun.seconds)}{logged}"
                             f"{f' (as when it ran: {rerun.error.ename})' if as_then and rerun.error else ''}\n")
            if rerun.error is not None and not as_then:
                if rerun.traceback:
                    self._show(req, "stream", {"name": "stderr", "text": "\n".join(rerun.traceback) + "\n"})
                self._stopped(plan, done, cell, position, rerun.error, rerun.record_id)
            done.append(cell)
        self._print(req, f"Rebuilt: {len(done)} cell{'s' if len(done) != 1 else ''} in {duration(seconds)}; "
                         f"generation {generation.number} has what they made.\n")

    def _stop_before(self, req: Request, cell: PlanCell, generation: Generation) -> CellError | None:
        """Why `cell` must not be sent, if it must not: the rebuild cell was interrupted (between two
        cells), its generation ended, or this code is refused (poisoned)."""
        if interrupted(req):
            return CellError("KeyboardInterrupt", "the rebuild was interrupted", "interrupted")
        if not generation.alive or self._supervisor.current is not generation:
            how = f": {generation.ending.how}" if generation.ending is not None else ""
            return CellError("WorkerLost", f"its generation, {generation.number}, ended{how}", "lost")
        refusal = self._supervisor.refusal(cell.body)
        return refusal_error(refusal) if refusal is not None else None

    @staticmethod
    def _stopped(plan: Plan, done: list[PlanCell], cell: PlanCell, position: str, why: CellError,
                 record_id: int | None = None) -> None:
        """The rebuild ends at `cell`: the error naming it, what was rebuilt and what was not."""
        left = plan.runs[len(done):]
        rebuilt = ", ".join(c.label for c in done) or "none"
        not_rebuilt = ", ".join(c.label for c in left)
        ran = f" (rebuilt as cell {record_id})" if record_id is not None else " (not run)"
        if why.ename in NAMESPACE_GONE or why.ename in _NO_GENERATION:
            kept = (f"The namespace it was building is gone with its generation: `%klbr rebuild --generation "
                    f"{plan.generation}` runs the whole plan again in the next one"
                    f"{' (after `%klbr restart`)' if why.ename == 'CrashLoop' else ''}.")
        else:
            kept = ("The namespace has what the rebuilt cells made; fix the cause and run the rest yourself, or "
                    f"`%klbr restart` and `%klbr rebuild --generation {plan.generation}` to start over.")
        text = (f"The rebuild of generation {plan.generation} stopped at {position} {cell.label}{ran}: "
                f"{why.ename}. Rebuilt: {rebuilt}. Not rebuilt: {not_rebuilt}. {kept}")
        raise RebuildStopped(rebuild_failed(text, f"{why.ename}: {why.evalue}"))

    def _print(self, req: Request, text: str) -> None:
        if not req.silent and req.phase is Phase.PROXY:
            self._show(req, "stream", {"name": "stdout", "text": text})
