"""The `plan` op of the klbr comm (docs/comm-protocol.md): what the JupyterLab extension needs to
offer `%klbr rebuild` after a generation ends, and to mark the cells whose results have no
variables behind them any more. It only reads the cell log, as `%klbr rebuild --plan` does.
"""

from __future__ import annotations

from klbr_supervisor.states import EndReason
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..magics.parse import MagicError
from ..magics.plan import plan_text, rebuild_plan
from ..requests.outcomes import refusal_error
from .restore import Json

# Ends the user asked for (the namespace went because they said so): no offer pops up for them.
_ASKED = frozenset({EndReason.RESTART.value, EndReason.RELOCATED.value, EndReason.SHUTDOWN.value})


def plan_answer(cell_log: CellLog, supervisor: Supervisor) -> Json:
    """`current` (the serving generation's number, or null), `generations` (each frontend cell id of
    this session: the last generation that has what it made) and `plan` (the previous generation's,
    as `%klbr rebuild --plan` has it, or null when there is none): `generation`, `end_reason`,
    `asked` (it ended because the user or a cell asked), `rebuilt` (the current generation ran a
    rebuild of it already, in part or whole), `cells` (how many a rebuild runs),
    `skipped`, `seconds` (what they took when they ran) and `text` (the plan as the magic prints it);
    `refusal`: while klbr starts no generation until the user acts (a crash loop, a lost link), the
    error a cell gets meanwhile (`ename`, `evalue`), which a rebuild would get too; else null."""
    current = supervisor.current
    number = current.number if current is not None else None
    try:
        plan = rebuild_plan(cell_log, number)
    except MagicError:  # no earlier generation: nothing to offer
        found: Json | None = None
    else:
        reason = (plan.end_reason or "").split(":", 1)[0]
        runs = {cell.record_id for cell in plan.runs}
        rebuilt = number is not None and any(
            row["rebuild_of"] in runs and row["status"] == "ok" for row in cell_log.generation_cells(number))
        found = {
            "generation": plan.generation, "end_reason": plan.end_reason,
            "asked": reason in _ASKED or cell_log.ended_by_request(plan.generation), "rebuilt": rebuilt,
            "cells": len(plan.runs), "skipped": len(plan.cells) - len(plan.runs), "seconds": plan.seconds,
            "text": plan_text(plan, include_errors=False, current=number, where=supervisor.where.spec)}
    refusal = supervisor.refusal(None)
    refused = refusal_error(refusal) if refusal is not None else None
    return {"current": number, "generations": cell_log.cell_generations(), "plan": found,
            "refusal": {"ename": refused.ename, "evalue": refused.evalue} if refused is not None else None}
