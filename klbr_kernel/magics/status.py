"""What `%klbr status` shows (and the klbr comm's `hello` and `state`): the supervisor's, the cell
log's and the frontend's state as rows, and the same as data for the status dialog's plain words
(`status_facts`); no I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from klbr_supervisor.memory import MemoryStatus, size_text
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..frontend import encryption, kernel_info
from ..frontend.sockets import Frontend


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _identity(identity: dict[str, Any] | None) -> str:
    if not identity:
        return "-"
    return (f"{identity.get('hostname')}, {identity.get('platform')} {identity.get('arch')}, python "
            f"{identity.get('version')} at {identity.get('interpreter')}, cwd {identity.get('cwd')}")


def _memory(memory: MemoryStatus | None, configured: int | None, applied: int | None, limits: bool | None) -> str:
    """The worker's memory now and at its peak, and its limit (`limits`: whether its placement
    applies one; one set since it started, `%klbr memory`, is the next generation's)."""
    if memory is None:
        if not configured:
            return "-"
        return (f"not sampled; limit {size_text(applied)}" if applied
                else f"not sampled; limit {size_text(configured)} (not on this placement)")
    limit = (f"limit {size_text(memory['limit'])}" if memory["limit"]
             else "no limit" if not configured
             else f"no limit (the next generation's: {size_text(configured)})" if limits
             else f"limit {size_text(configured)} not applied on this placement")
    return f"{size_text(memory['rss'])} now, {size_text(memory['peak'])} peak, {limit}"


def status_text(supervisor: Supervisor, cell_log: CellLog, frontend: Frontend | None = None) -> str:
    rows = status_rows(supervisor, cell_log, frontend)
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows)


def status_rows(supervisor: Supervisor, cell_log: CellLog, frontend: Frontend | None = None,
                st: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """What `%klbr status` shows, row by row (also the klbr comm's `hello`); `st`: the supervisor's
    `status()`, when the caller has it already."""
    st = st if st is not None else supervisor.status()
    timeout = st["cell_timeout"]
    rows = [
        ("generation", st["generation"] if st["generation"] is not None else "none"),
        ("pid", st["pid"] or "-"),
        ("state", st["state"]),
        ("uptime", _duration(st["uptime"])),
        ("placement", st["placement"]),
        ("worker", _identity(st["identity"])),
        ("key", st["key"] or "-"),
        ("signed", f"yes, {st['signing']}" if st["signing"] else
         "NO: the connection file's key is empty; anyone who can reach the kernel's sockets can run code"),
        ("encrypted", encryption.status(frontend.server_keys) if frontend is not None else "-"),
        ("standby", st["standby"]),
        ("restarts", f"{st['restarts']} of {st['restart_limit']} in the last {st['restart_window']:g} s"),
        ("cell timeout", f"{timeout:g} s" if timeout else "none"),
        ("interrupt grace", f"{st['interrupt_grace']:g} s"),
        ("memory", _memory(st["memory"], st["memory_limit"], st["memory_applied"], st["memory_limits"])),
        ("debugger", kernel_info.debugger_shown(st["debugger"], supervisor.current)),
        ("cell log", cell_log.state_text()),
        ("dropped", frontend.drops.status() if frontend is not None else "-"),
    ]
    return [(k, str(v)) for k, v in rows]


def status_facts(supervisor: Supervisor, cell_log: CellLog, st: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the status dialog says in a user's words, as data (the klbr comm's `facts`,
    docs/comm-protocol.md): since when the worker serves and on which host, the cell log's path and
    why it does not record, the restart budget, the deadlines and the next generation's memory limit.
    `st`: the supervisor's `status()`, when the caller has it already."""
    st = st if st is not None else supervisor.status()
    gen = supervisor.current
    path, problem = cell_log.where()
    began = (gen.serving_since or gen.started) if gen else None  # a spare serves from its takeover
    since = datetime.fromtimestamp(began, UTC).isoformat(timespec="milliseconds") if began else None
    return {
        "state": st["state"],
        "since": since.replace("+00:00", "Z") if since else None,
        "host": (st["identity"] or {}).get("hostname"),
        "cell_log": path,
        "cell_log_problem": problem,
        "restarts": st["restarts"],
        "restart_limit": st["restart_limit"],
        "restart_window": st["restart_window"],
        "cell_timeout": st["cell_timeout"] or None,
        "interrupt_grace": st["interrupt_grace"],
        "memory_limit_next": st["memory_limit"] or None,
        "memory_limit_applies": st["memory_limits"],
    }
