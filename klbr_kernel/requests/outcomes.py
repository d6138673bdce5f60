"""The errors a request can end with: named once, with the store status each means, worded for the notebook.

The names and statuses are part of the public contract (docs/errors.md, and the store's cell statuses in
docs/store-schema.md). `ERRORS` is the one table that ties each of klbr's error names to the
status it carries when klbr answers with it and to the generation endings it reports; everything else
is derived from it (a refusal is `refused` whatever its name: nothing ran).

A cell's status never comes from the name in a reply: a cell can raise its own `WorkerLost`. The
proxy's own errors carry their status from where they are made (`CellError.status`); a worker's
reply is `ok`, `aborted` or `error`, and `interrupted` only when klbr interrupted that cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from klbr_supervisor.policy import Refusal
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.store import StoreError

# ename -> (the cell's status in the store, the endings of its generation it reports)
ERRORS: dict[str, tuple[str, frozenset[EndReason]]] = {
    "CellTimeout": ("timeout", frozenset({EndReason.DEADLINE})),
    "WorkerLost": ("lost", frozenset({EndReason.LOST, EndReason.RESTART, EndReason.RELOCATED})),
    "WorkerKilled": ("killed", frozenset({EndReason.KILLED})),
    "WorkerStartFailed": ("error", frozenset({EndReason.START_FAILED})),
    "PlacementLost": ("unknown", frozenset({EndReason.LINK_LOST})),
    "PoisonedCell": ("refused", frozenset()),
    "CrashLoop": ("refused", frozenset()),
    "SessionPaused": ("refused", frozenset()),
    "InternalError": ("error", frozenset()),
    "RebuildFailed": ("error", frozenset()),
}
_ENAME_BY_REASON = {reason: ename for ename, (_, reasons) in ERRORS.items() for reason in reasons}

_RED, _RESET = "\x1b[0;31m", "\x1b[0m"

# The errors a cell ends with when it obeyed an interrupt: ipykernel raises KeyboardInterrupt in a
# cell that runs, and cancels one that awaits (its SIGINT handler cancels the cell's task).
OBEYED_INTERRUPT = frozenset({"KeyboardInterrupt", "CancelledError"})


def obeyed_interrupt(content: dict[str, Any]) -> bool:
    """Whether the reply `content` is how a cell ends when it obeyed an interrupt."""
    return content.get("status") == "error" and content.get("ename") in OBEYED_INTERRUPT


def cell_status(content: dict[str, Any], *, own: str | None, interrupted: bool) -> str:
    """The store status of a cell that ended with the reply `content`.

    `own`: the status of an answer the proxy wrote itself (a `CellError`'s, or `ok`/`aborted`), which
    stands. Otherwise the reply is the worker's: `ok`, `aborted` or `error`, whatever the error's name,
    except a KeyboardInterrupt (or an awaiting cell's CancelledError) after klbr `interrupted` the
    cell (an interrupt_request or SIGINT while it ran), which is `interrupted`; one the cell raised
    by itself is an error like any other."""
    if own is not None:
        return own
    status = content.get("status", "ok")
    if status == "error":
        return "interrupted" if interrupted and obeyed_interrupt(content) else "error"
    return "aborted" if status == "aborted" else "ok"


def _error(ename: str, evalue: str, detail: str = "") -> CellError:
    """One of klbr's own errors, with the status the table gives its name: `evalue` in a user's
    words (one line: what happened, what was kept, what to do), then the operator's `detail`."""
    return CellError(ename, f"{evalue}\n{detail}" if detail else evalue, ERRORS[ename][0])


@dataclass(frozen=True)
class CellError:
    """An error the proxy answers a request with; `status`: the cell's in the store, if it is one."""

    ename: str
    evalue: str
    status: str = "error"

    @property
    def traceback(self) -> list[str]:
        return [f"{_RED}{self.ename}{_RESET}: {self.evalue}"]

    def content(self) -> dict[str, Any]:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": self.traceback}


def next_generation(refusal: Refusal | None) -> str:
    """What follows a worker's end, for the cell that was running: a new generation, unless the
    supervisor starts none now (the crash-loop limit reached with this death)."""
    if refusal is not None and refusal.reason == "crash_loop":
        return (f"klbr starts no new generation now: it started {_generations(refusal.count)} for workers that "
                f"ended within {refusal.window:.0f} s (Supervisor.restart_limit), and stops rather than loop. Fix "
                "the cause, then run `%klbr restart`.")
    return "the next cell runs in a new generation."


def _generations(count: int) -> str:
    return "1 new generation" if count == 1 else f"{count} new generations"


# What a generation's end (other than a failed start or a lost link) did to the cell, by its reason.
_ENDED = {
    EndReason.KILLED: "did not stop when interrupted: it ignored the interrupt for {grace}, so klbr ended its worker",
    EndReason.RESTART: "did not finish: its worker was ended for a restart",
    EndReason.RELOCATED: "did not finish: its worker was ended for a move to another placement",
    EndReason.DEADLINE: "did not finish: its worker was ended at a cell's deadline",
}


def ending_error(ending: Ending, *, generation: int, pid: int | None, cell: str, grace: float | None = None,
                 refusal: Refusal | None = None) -> CellError:
    """The error for a request that was waiting on a generation when it ended.

    `cell` names the request for the reader, e.g. "cell [5]" or "this request"; `grace`: the
    `Supervisor.interrupt_grace` an interrupt had (for a worker killed when it ignored one);
    `refusal`: what requests are refused with from now on (a crash loop: no new generation).
    The first line says it in a user's words; the generation, its pid and how it ended follow.
    """
    ename = _ENAME_BY_REASON.get(ending.reason, "WorkerLost")
    cell = cell[0].upper() + cell[1:]
    who = f"Generation {generation} (pid {pid})" if pid else f"Generation {generation}"
    if ending.reason is EndReason.START_FAILED:
        detail = f"{who}: its worker did not start: it {ending.how}."
        if ending.stderr_tail:
            detail += "\nLast lines of its stderr:\n" + ending.stderr_tail
        return _error(ename, f"{cell} did not run: the worker to run it did not start, so nothing ran. The next "
                             "cell tries to start a new one; fix what stopped this one first (below).", detail)
    if ending.reason is EndReason.LINK_LOST:
        return _error(ename, f"{cell}'s outcome is unknown: klbr lost the link to the worker running it, which may "
                             "have run it in part or whole, and it is not re-run. Run `%klbr reconnect` for a new "
                             "generation on the same placement, or `%klbr placement SPEC` to move.",
                      f"{who} was running it when the link to it was lost: {ending.how}.")
    waited = f"{grace:g} s (Supervisor.interrupt_grace)" if grace is not None else "its grace (Supervisor.interrupt_grace)"
    what = _ENDED.get(ending.reason, "did not finish: its worker process died").format(grace=waited)
    return _error(ename, f"{cell} {what}. Its namespace is gone and nothing was re-run; {next_generation(refusal)}",
                  f"{who}: {ending.how}.")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def refusal_error(refusal: Refusal) -> CellError:
    """The error for a cell the supervisor would not run (see `Supervisor.refusal`): `refused`,
    whatever its name, since nothing ran (a PlacementLost that ends a running cell is `unknown`)."""
    if refusal.reason == "placement_lost":
        return CellError(
            "PlacementLost",
            "Nothing ran: klbr lost the link to this session's worker elsewhere, and starts no second one while "
            "the first may still run. Run `%klbr reconnect` for a new generation on the same placement, or "
            f"`%klbr placement SPEC` to move.\nThe link that was lost: {refusal.detail}.",
            status="refused",
        )
    if refusal.reason == "crash_loop":
        return CellError(
            "CrashLoop",
            f"Nothing ran: klbr started {_generations(refusal.count)} for workers that ended within "
            f"{refusal.window:.0f} s, and then stopped rather than loop. Fix the cause, then run `%klbr restart` to "
            f"start a fresh generation.\n{refusal.count} automatic new generations within {refusal.window:.0f} s reached "
            "Supervisor.restart_limit (counted over Supervisor.restart_window).",
            status="refused",
        )
    return CellError(
        "PoisonedCell",
        f"Nothing ran, and the namespace is as it was: this exact code killed its worker {_times(refusal.count)} in "
        "a row, so it was not run again. Change the code, or run `%klbr restart` to allow it once more."
        f"\n{refusal.count} deaths in a row under this code reached Supervisor.poison_after.",
        status="refused",
    )


def timeout_error(count: int | None, seconds: float | None, *, killed: bool, generation: int | None = None,
                  pid: int | None = None, how: str = "", refusal: Refusal | None = None) -> CellError:
    """A cell past its deadline: interrupted (the namespace intact), or `killed` with its generation,
    followed by what `refusal` says (a crash loop: no new generation)."""
    cell = f"Cell [{count}]" if count is not None else "The cell"
    limit = f"{seconds:g} s" if seconds is not None else "its deadline"
    longer = ("For longer: `%%klbr timeout=SECONDS` as a cell's first line, or `%klbr timeout SECONDS` for the "
              "session (0: none).")
    setting = "The deadline: `%%klbr timeout=`, else `%klbr timeout`, else Supervisor.cell_timeout."
    if not killed:
        return _error("CellTimeout", f"{cell} ran past its deadline of {limit} and was interrupted; the namespace is "
                                     f"intact. {longer}", setting)
    return _error(
        "CellTimeout",
        f"{cell} ran past its deadline of {limit} and did not stop when interrupted, so klbr ended its worker. "
        f"Its namespace is gone and nothing was re-run; {next_generation(refusal)} {longer}",
        f"Generation {generation} (pid {pid}): {how}. {setting}",
    )


# What ends the message of a namespace that is gone (`WorkerLost`, `WorkerKilled`, a `CellTimeout` that
# killed): the way back, for frontends without the extension (which offers it itself).
REBUILD_LINE = ("The cells that built it, in the order they ran: `%klbr rebuild --plan` shows them, "
                "`%klbr rebuild` runs them again.")
# The names of a generation's end that takes its namespace (a `CellTimeout` at the end of a generation
# is one that killed it).
NAMESPACE_GONE = frozenset({"WorkerLost", "WorkerKilled", "CellTimeout"})


# The same, when klbr starts no generation until `%klbr restart` (a crash loop): a rebuild now is refused.
REBUILD_AFTER_RESTART = ("The cells that built it, in the order they ran: `%klbr rebuild --plan` shows them; after "
                         "`%klbr restart`, `%klbr rebuild` runs them again.")


def with_rebuild_line(error: CellError, refusal: Refusal | None = None) -> CellError:
    """`error`, a generation's end (`ending_error`, a killing `timeout_error`), with `REBUILD_LINE`
    after its user's words (its first line), before the operator's detail, when it took the namespace;
    `refusal`: what cells are refused with from now on (a crash loop: the rebuild waits for a restart)."""
    if error.ename not in NAMESPACE_GONE:
        return error
    user, _, detail = error.evalue.partition("\n")
    line = REBUILD_AFTER_RESTART if refusal is not None and refusal.reason == "crash_loop" else REBUILD_LINE
    return CellError(error.ename, "\n".join(part for part in (user, line, detail) if part), error.status)


def idle_loss_notice(generation: int, pid: int | None, how: str) -> str:
    """The stderr notice at the top of the cell after the current worker died between cells."""
    return ("klbr: the worker ended while idle, between cells: the namespace it held is gone (the outputs and the "
            f"cell log are kept), and this cell runs in a new generation.\n{REBUILD_LINE}\n"
            f"Generation {generation} (pid {pid}): {how}.\n")


def rebuild_failed(text: str, detail: str = "") -> CellError:
    """A `%klbr rebuild` that stopped before its last cell; `text` names the cell and what was rebuilt,
    `detail` the error that stopped it, in full."""
    return _error("RebuildFailed", text, detail)


def session_paused_error(error: StoreError) -> CellError:
    """`error` is the StoreError: it names the database path and what went wrong."""
    return _error(
        "SessionPaused",
        "This cell was not run, and the namespace is as it was: klbr runs nothing it cannot record, and the cell "
        "log cannot be written. Recording resumes by itself at the next cell once the file takes writes again "
        "(free some space, make it writable); `%klbr status` shows the state.",
        f"The cell log at {error.path} cannot be written ({error.cause}).",
    )


def internal_error(msg_type: str, exc: BaseException) -> CellError:
    """A bug in klbr while it handled a request: the request is still answered (semantics 1)."""
    return _error(
        "InternalError",
        f"klbr failed while handling this {msg_type}: a bug in klbr, not in your code. The kernel keeps serving "
        "and the worker's namespace is kept; please report it with the kernel's log, which has the traceback.",
        f"{type(exc).__name__}: {exc}",
    )


def no_reply_error(msg_type: str, seconds: float) -> CellError:
    """The worker went idle for a request and never replied to it (it dropped it)."""
    return _error(
        "InternalError",
        f"The worker finished this {msg_type} without replying to it, so klbr answers in its place; its outputs "
        "were kept, and the kernel keeps serving. The worker's log may say why.",
        f"It was still silent {seconds:g} s after going idle.",
    )


def worker_dropped_notice(count: int) -> str:
    """A cell whose worker (one klbr does not start itself) dropped messages before klbr read them."""
    return (f"klbr: the worker dropped {count} message{'s' if count != 1 else ''} of this cell before klbr "
            "could read them (outputs, "
            "most likely): a kernel klbr does not start itself keeps ipykernel's limit of 1000 waiting "
            "iopub messages, and loses what it publishes past it while the kernel cannot read. Neither "
            "this notebook nor the cell log has them.\n")


def unrecorded_notice(error: StoreError) -> str:
    return (f"klbr: the cell log at {error.path} could not be opened ({error.cause}); "
            "this session runs unrecorded.\n")
