"""`%klbr rebuild [--plan] [--generation N] [--include-errors]`: the cells that built an earlier
generation's namespace (`plan.rebuild_plan`), shown (`--plan`), or run again in the current one.

Never automatic (semantics 2): a rebuild runs only when a cell asks for it, and `--plan` shows first
what it would run.
"""

from __future__ import annotations

from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..cell_log.replay import Show
from ..requests.request import Request
from .parse import MagicError, RebuildSpec
from .plan import plan_text, rebuild_plan


class Rebuild:
    def __init__(self, cell_log: CellLog, supervisor: Supervisor, show: Show):
        """`show(req, msg_type, content)`: an output of the rebuild cell's own, shown and recorded
        (`OwnAnswers.output`)."""
        self._cell_log = cell_log
        self._supervisor = supervisor
        self._show = show

    async def run(self, req: Request, spec: RebuildSpec) -> None:
        """Carry out one `%klbr rebuild` line of the cell `req`; raises `MagicError` (a UsageError)
        when there is nothing to rebuild."""
        cell_log, supervisor = self._cell_log, self._supervisor
        if cell_log.recording:
            await cell_log.settled()  # the generations and cells recorded so far are readable
        current = supervisor.current
        number = current.number if current is not None else None
        if not spec.plan:
            msg = "only `%klbr rebuild --plan` is available yet"
            raise MagicError(msg)
        plan = rebuild_plan(cell_log, number, spec.generation, spec.include_errors)
        text = plan_text(plan, include_errors=spec.include_errors, current=number, where=supervisor.where.spec)
        self._print(req, text)

    def _print(self, req: Request, text: str) -> None:
        if not req.silent:
            self._show(req, "stream", {"name": "stdout", "text": text})
