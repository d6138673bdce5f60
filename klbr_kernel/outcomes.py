"""The error a cell ends with when its generation ends under it: named once, worded for the notebook.

The names are part of the public contract (DESIGN.md, "Errors a cell can end with").
"""

from __future__ import annotations

from dataclasses import dataclass

from klbr_supervisor.states import Ending, EndReason

ENAMES = {
    EndReason.LOST: "WorkerLost",
    EndReason.KILLED: "WorkerKilled",
    EndReason.DEADLINE: "CellTimeout",
    EndReason.START_FAILED: "WorkerStartFailed",
    EndReason.RESTART: "WorkerLost",
    EndReason.RELOCATED: "WorkerLost",
}

_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


@dataclass(frozen=True)
class CellError:
    ename: str
    evalue: str

    @property
    def traceback(self) -> list[str]:
        return [f"{_RED}{self.ename}{_RESET}: {self.evalue}"]

    def content(self) -> dict:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": self.traceback}


def ending_error(ending: Ending, *, generation: int, pid: int | None, cell: str) -> CellError:
    """The error for a request that was waiting on a generation when it ended.

    `cell` names the request for the reader, e.g. "cell [5]" or "this cell".
    """
    ename = ENAMES.get(ending.reason, "WorkerLost")
    who = f"generation {generation} (pid {pid})" if pid else f"generation {generation}"
    if ending.reason is EndReason.START_FAILED:
        text = f"The worker for {who} did not start: it {ending.how}."
        if ending.stderr_tail:
            text += "\nLast lines of its stderr:\n" + ending.stderr_tail
        text += "\nThe next cell tries to start a new one."
        return CellError(ename, text)
    text = (
        f"{cell} was running in {who} when its worker ended: {ending.how}. "
        f"Its namespace is gone and nothing was re-run; the next cell runs in a new generation."
    )
    return CellError(ename, text[0].upper() + text[1:])
