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


def crash_loop_error(restarts: int, window: float) -> CellError:
    return CellError(
        "CrashLoop",
        f"The worker was lost {restarts} times within {window:.0f} s, so klbr stopped starting new ones "
        "rather than loop. Nothing ran. Fix the cause, then run `%klbr restart` to start a fresh generation.",
    )


def poisoned_error(losses: int) -> CellError:
    return CellError(
        "PoisonedCell",
        f"This exact code killed its worker {losses} times in a row, so it was not run again. "
        "Change the code, or run `%klbr restart` to allow it once more.",
    )


def timeout_error(count: int | None, seconds: float | None, *, killed: bool, generation: int | None = None,
                  pid: int | None = None, how: str = "") -> CellError:
    cell = f"Cell [{count}]" if count is not None else "The cell"
    limit = f"{seconds:g} s" if seconds is not None else "its deadline"
    if not killed:
        return CellError("CellTimeout", f"{cell} ran past its deadline of {limit} and was interrupted; "
                                        "the namespace is intact.")
    return CellError(
        "CellTimeout",
        f"{cell} ran past its deadline of {limit} and did not stop when interrupted, so generation "
        f"{generation} (pid {pid}) was ended: {how}. Its namespace is gone and nothing was re-run; "
        "the next cell runs in a new generation.",
    )


def session_paused_error(error) -> CellError:
    """`error` is the StoreError: it names the database path and what went wrong."""
    return CellError(
        "SessionPaused",
        f"The cell log at {error.path} cannot be written ({error.cause}), so this cell was not run: "
        "klbr runs nothing it cannot record. Recording resumes by itself at the next cell once the file "
        "takes writes again (free some space, make it writable); `%klbr status` shows the state.",
    )


def unrecorded_notice(error) -> str:
    return (f"klbr: the cell log at {error.path} could not be opened ({error.cause}); "
            "this session runs unrecorded.\n")
