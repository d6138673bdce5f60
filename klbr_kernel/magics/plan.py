"""What `%klbr rebuild` would run: the cells that built a generation's namespace, read from the cell
log, in the order they ran, with the code as it ran (`rebuild_plan`), and the plan as the notebook
reads it (`plan_text`). No I/O here but the log's reads (`CellLog`).

A generation's namespace was built by the cells it ran that ended `ok`: not the cell that ended it
(lost, killed, timed out, or one that asked for a restart or a move: `host.restart`), not klbr's own
`%klbr` cells (no worker ran them), not silent or `store_history=false` executes (never cells), not
errors unless asked (`include_errors`: their effects up to the error are in the namespace too). A
cell with a line `# klbr: no-rebuild` is listed, and skipped. A cell that was itself rebuilt is
listed as the `In[n]` of the cell it repeats.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime

from ..cell_log.recording import CellLog
from .parse import MagicError, cell_timeout

# A line of its own: `# klbr: no-rebuild`, spaces as one likes, words after it allowed (`# klbr: no-rebuild
# (it sends mail)`).
NO_REBUILD = re.compile(r"^[ \t]*#[ \t]*klbr:[ \t]*no-rebuild\b", re.MULTILINE)
# Statuses of cells that ran and raised: their effects up to the error are in the namespace.
ERRORS = ("error", "interrupted")
FIRST_LINE = 48  # characters of a cell's first line the plan shows


@dataclass(frozen=True)
class PlanCell:
    """One cell of a plan: the run it repeats, and whether it runs."""

    record_id: int  # its row in the cell log (`cells.id`): the run it repeats
    count: int | None  # its `In[n]` as the notebook showed it (a rebuilt cell's: its first run's)
    code: str  # as recorded (a `%%klbr timeout=` first line included)
    body: str  # what the worker runs
    timeout: float | None  # a `%%klbr timeout=SECONDS` first line's deadline
    status: str  # how it ended then
    seconds: float | None  # how long it took then
    skipped: str | None = None  # why it does not run, if it does not

    @property
    def label(self) -> str:
        return f"In[{self.count}]" if self.count is not None else f"cell {self.record_id}"

    @property
    def first_line(self) -> str:
        """Its first line that is not blank, shortened, and how many more it has."""
        lines = [line for line in self.body.splitlines() if line.strip()] or [""]
        first = lines[0].strip()
        if len(first) > FIRST_LINE:
            first = first[:FIRST_LINE - 1] + "…"
        more = len(lines) - 1
        return first + (f"  (+{more} line{'s' if more > 1 else ''})" if more else "")


@dataclass(frozen=True)
class Plan:
    """The cells that built generation `generation`'s namespace, in the order they ran."""

    generation: int
    placement: str
    end_reason: str | None  # `REASON: how`, as the generations table has it; None while it runs
    cells: tuple[PlanCell, ...]
    left_out: dict[str, int]  # cells that ran and are not in the plan, by status

    @property
    def runs(self) -> tuple[PlanCell, ...]:
        """The cells a rebuild runs, in order."""
        return tuple(cell for cell in self.cells if cell.skipped is None)

    @property
    def seconds(self) -> float:
        """How long the cells a rebuild runs took when they ran."""
        return sum(cell.seconds or 0.0 for cell in self.runs)


def _seconds(started: str | None, finished: str | None) -> float | None:
    if not started or not finished:
        return None
    return max(0.0, (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds())


def _cell(row: sqlite3.Row, skipped: str | None) -> PlanCell:
    code = row["code"]
    timed = None
    try:
        timed = cell_timeout(code)
    except MagicError:
        pass  # a malformed `%%klbr` first line never ran on a worker: such a cell is not in a generation
    timeout, body = timed if timed is not None else (None, code)
    if skipped is None and NO_REBUILD.search(code):
        skipped = "marked `# klbr: no-rebuild`"
    return PlanCell(row["id"], row["origin_count"], code, body, timeout, row["status"],
                    _seconds(row["started"], row["finished"]), skipped)


def previous_generation(numbers: list[int], current: int | None) -> int | None:
    """The generation before `current` among those that served (`numbers`, ascending): the last one
    when none is current. Spares take numbers too, so it is not `current - 1`."""
    earlier = [n for n in numbers if current is None or n < current]
    return earlier[-1] if earlier else None


def rebuild_plan(cell_log: CellLog, current: int | None, generation: int | None = None,
                 include_errors: bool = False) -> Plan:
    """The plan for `generation` (default: the one before `current`, whatever ended it). Raises
    `MagicError` when there is none to rebuild: no cell log, no such generation, or the current one
    (its namespace is here)."""
    if not cell_log.recording:
        msg = "the cell log is not available in this session: klbr does not know what built the namespace"
        raise MagicError(msg)
    served = {row["number"]: row for row in cell_log.served_generations()}
    if generation is None:
        generation = previous_generation(sorted(served), current)
        if generation is None:
            msg = "no earlier generation in this session: there is nothing to rebuild"
            raise MagicError(msg)
    elif generation == current:
        msg = f"generation {generation} is the current one: its namespace is here"
        raise MagicError(msg)
    elif generation not in served:
        known = ", ".join(str(n) for n in sorted(served) if n != current) or "none"
        msg = f"no generation {generation} in this session (earlier generations: {known})"
        raise MagicError(msg)
    rows = cell_log.generation_cells(generation)
    # A cell that asked for its generation's end (`host.restart`, `host.relocate`) was its last:
    # run again, it would end this one.
    asked_end = rows[-1]["id"] if rows and cell_log.ended_by_request(generation) else None
    wanted = ("ok", *ERRORS) if include_errors else ("ok",)
    cells: list[PlanCell] = []
    left_out: dict[str, int] = {}
    for row in rows:
        if row["status"] not in wanted:
            left_out[row["status"]] = left_out.get(row["status"], 0) + 1
            continue
        cells.append(_cell(row, "it asked for its generation's end" if row["id"] == asked_end else None))
    ended = served[generation]
    return Plan(generation, ended["placement"], ended["end_reason"], tuple(cells), left_out)


# -- as the notebook reads it -----------------------------------------------------------------------

def duration(seconds: float | None) -> str:
    """A cell's time, as a person reads it: `12 ms`, `2.1 s`, `3 min 05 s`."""
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _left_out(plan: Plan, include_errors: bool) -> str:
    if not plan.left_out:
        return ""
    parts = [f"{n} {status}" for status, n in sorted(plan.left_out.items())]
    raised = any(status in plan.left_out for status in ERRORS)
    hint = "; `--include-errors` adds those that raised" if raised and not include_errors else ""
    return f"Left out: {', '.join(parts)} (cells that did not end ok{hint}).\n"


def cell_line(cell: PlanCell, position: str) -> str:
    """One cell of a plan: `[2/3] In[5]  df = load()  (+3 lines)`."""
    return f"{position:>7} {cell.label:<8} {cell.first_line}"


def plan_text(plan: Plan, *, include_errors: bool, current: int | None, where: str) -> str:
    """What `%klbr rebuild --plan` prints: the cells in order, each with its `In[n]`, first line and
    how long it took then, the skipped ones marked, then the total and what would run where."""
    runs = plan.runs
    ended = f"ended {plan.end_reason}" if plan.end_reason else "still running"
    lines = [f"Generation {plan.generation} ({plan.placement}; {ended}) was built by {len(runs)} "
             f"cell{'s' if len(runs) != 1 else ''}, {duration(plan.seconds)} when they ran:"]
    width = max((len(cell_line(cell, "")) for cell in plan.cells), default=0)
    i = 0
    for cell in plan.cells:
        if cell.skipped is None:
            i += 1
            line = cell_line(cell, f"[{i}/{len(runs)}]")
            lines.append(f"{line:<{width + 2}}{duration(cell.seconds)}"
                         + (f"  (timeout {cell.timeout:g} s)" if cell.timeout else ""))
        else:
            lines.append(f"{cell_line(cell, '-'):<{width + 2}}skipped: {cell.skipped}")
    text = "\n".join(lines) + "\n" + _left_out(plan, include_errors)
    if not runs:
        return text + "Nothing to rebuild.\n"
    target = f"generation {current}" if current is not None else "the next generation"
    flags = f" --generation {plan.generation}" + (" --include-errors" if include_errors else "")
    return text + (f"`%klbr rebuild{flags}` runs them again in {target} ({where}), in this order, with the code as "
                   "it ran.\nWhat they do outside the namespace (files, messages, money) happens again.\n")
