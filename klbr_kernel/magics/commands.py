"""What each `%klbr` command does and prints (`magic_output`); `%klbr replay` is `replay`'s, and a
cell of them is carried out by `klbr_kernel.proxy.magic_cells`."""

from __future__ import annotations

from typing import Any

from klbr_supervisor.generation import Generation
from klbr_supervisor.memory import size_text
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..frontend.sockets import Frontend
from .parse import Magic, MagicError
from .status import status_text


def _worker(identity: dict[str, Any], language: str | None) -> str:
    """A generation's worker in a few words, for the move messages: language and version, its
    interpreter, its pid (a remote one's own)."""
    what = " ".join(str(part) for part in (language or "kernel", identity.get("version")) if part)
    where = f" at {identity['interpreter']}" if identity.get("interpreter") else ""
    pid = identity.get("pid")
    return f"{what}{where}, pid {pid if pid is not None else 'unknown'}"


def history_text(supervisor: Supervisor, cell_log: CellLog, n: int) -> str:
    """`%klbr history [N]`: the notebook's last cells, with the ids `%klbr replay` takes."""
    if not cell_log.recording:
        return "The cell log is not available in this session.\n"
    lines = []
    for row in cell_log.recent_cells(n, supervisor.notebook):
        first, *rest = row["code"].splitlines() or [""]
        outputs = f"{row['outputs']} output{'s' if row['outputs'] != 1 else ''}"
        lines.append(f"[{row['session_id']}:{row['execution_count']}]  cell {row['id']}  {row['status']}  {outputs}  "
                     f"{first}" + (f"   (+{len(rest)} lines)" if rest else ""))
    return "\n".join(lines) + "\n" if lines else "No cells recorded yet.\n"


def restarted_text(old: Generation | None, new: Generation | None) -> str:
    """What a restart says it did (`%klbr restart`, the extension's Restart), from which generation to which."""
    before = f"generation {old.number} ended" if old else "no generation was running"
    pid = f" (pid {new.pid})" if new is not None and new.pid else ""
    after = f"generation {new.number}{pid} takes over" if new is not None else "a new generation is starting"
    return f"Restarted: {before}; {after} with a fresh namespace."


def _limit(n: int | None) -> str:
    return size_text(n) if n else "none"


def memory_text(supervisor: Supervisor, limit: str | None) -> str:
    """`%klbr memory [LIMIT]`: the next generation's memory limit set (`none` or 0: no limit), or said."""
    current = supervisor.current
    applied = _limit(current.memory_limit) if current is not None else None
    if limit is not None:
        supervisor.set_memory_limit("" if limit.lower() == "none" else limit)  # a bad one: TraitError, a ValueError
    nxt = _limit(supervisor.memory_limit_bytes)
    text = f"The next generation's memory limit is {nxt}"
    if current is not None and applied != nxt:
        text += (f"; generation {current.number} keeps {'no limit' if applied == 'none' else applied} until it ends "
                 "(`%klbr restart` starts the next one now)")
    elif current is not None:
        text += f", as generation {current.number}'s"
    if supervisor.memory_limit_bytes and current is not None and not current.target.limits_memory:
        text += f". The {supervisor.where} placement does not apply one"
    return text + ".\n"


def _moved(what: str, old: Generation | None, new: Generation | None, supervisor: Supervisor) -> str:
    """What `%klbr placement SPEC` and `%klbr reconnect` print: from where to where, and how it went."""
    before = f"generation {old.number} ended" if old else "no generation was running"
    if new is None or new.ending is not None:
        how = f": {new.ending.how}" if new is not None and new.ending is not None else ""
        tail = f"\n{new.ending.stderr_tail}" if new is not None and new.ending and new.ending.stderr_tail else ""
        msg = f"{before}; the new generation on {supervisor.where} did not start{how}{tail}"
        raise MagicError(msg)
    language = new.kernel_info.get("language_info", {}).get("name")
    return (f"{what}: {before}; generation {new.number} runs on {supervisor.where} "
            f"({_worker(new.identity(), language)}) with a fresh namespace.\n")


async def magic_output(magic: Magic, supervisor: Supervisor, cell_log: CellLog,
                       frontend: Frontend | None = None) -> str:
    """Carry out one `%klbr` command; its printed answer."""
    if magic.command == "status":
        return status_text(supervisor, cell_log, frontend)
    if magic.command == "restart":
        old = supervisor.current
        await supervisor.restart()
        return restarted_text(old, supervisor.current) + "\n"
    if magic.command == "memory":
        return memory_text(supervisor, magic.args[0] if magic.args else None)
    if magic.command == "timeout":
        seconds = float(magic.args[0])
        supervisor.set_session_timeout(seconds)
        return f"Cells now time out after {seconds:g} s.\n" if seconds else "Cells have no time limit now.\n"
    if magic.command == "history":
        return history_text(supervisor, cell_log, int(magic.args[0]) if magic.args else 10)
    if magic.command == "placement":
        if not magic.args:
            return f"placement: {supervisor.where}\n"
        old = supervisor.current
        new = await supervisor.relocate(magic.args[0])  # a PlacementError is a ValueError: UsageError
        return _moved("Moved", old, new, supervisor)
    if magic.command == "reconnect":
        old = supervisor.current
        return _moved("Reconnected", old, await supervisor.reconnect(), supervisor)
    msg = f"unknown %klbr command {magic.command!r}"
    raise MagicError(msg)
