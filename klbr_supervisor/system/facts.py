"""Facts about this machine's processes, each taken from /proc where it shows them (`proc`), else from
psutil (the portable way: macOS's own calls there, /proc again on Linux), else told as unknown.

Which way serves is tried, not assumed: a worker's memory is /proc's when its statm reads, and a
command line /proc's when its cmdline does. psutil is imported only when the portable way is taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from . import proc

if TYPE_CHECKING:
    import psutil

T = TypeVar("T")


class Memory(Protocol):
    """One worker's memory and the machine's, as `memory.MemoryWatch` samples them."""

    def usage(self, pid: int) -> tuple[int, int]:
        """A process's resident set and its data (private writable memory: what RLIMIT_DATA counts;
        the resident set where the system does not say), bytes; (0, 0) once it is gone."""

    def available(self) -> int | None:
        """What the machine can still allocate without swapping, bytes; None: not known."""

    def tree(self, *, scan: bool) -> list[int] | None:
        """The worker and its descendants; None: not known without a scan, and `scan` is False."""

    def oom_kills(self) -> int | None:
        """The OOM kills counted by the worker's own memory cgroup; None: it has none of its own."""

    def close(self) -> None: ...


def memory_of(pid: int) -> Memory:
    """The way to sample worker `pid`'s memory here (it runs on this machine)."""
    statm = proc.Reread(f"/proc/{pid}/statm")
    if proc.usage(pid, statm) is not None:
        return _ProcMemory(pid, statm)
    statm.close()
    return _PsutilMemory(pid)


@dataclass(frozen=True)
class Started:
    """How a process was started and where it runs; None where the system does not say."""

    argv: list[str] | None
    executable: str | None
    cwd: str | None


def started(pid: int) -> Started:
    """`pid`'s command line, executable and working directory."""
    argv = proc.command_line(pid)
    if argv is not None:
        return Started(argv, proc.link(pid, "exe"), proc.link(pid, "cwd"))
    process = _process(pid)
    if process is None:
        return Started(None, None, None)
    return Started(_asked(process.cmdline), _asked(process.exe), _asked(process.cwd))


def command_line(pid: int) -> list[str] | None:
    """`pid`'s argv; None when nothing here shows it (gone, another user's, no /proc, no psutil)."""
    argv = proc.command_line(pid)
    if argv is not None:
        return argv
    process = _process(pid)
    return None if process is None else _asked(process.cmdline)


def exists(pid: int) -> bool:
    """Whether a process `pid` exists (any user's): POSIX's signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` ('' when not known)."""
    fstype = proc.filesystem_type(path)
    if fstype is not None:
        return fstype
    import psutil  # noqa: PLC0415 — the portable way only

    partitions = _asked(lambda: psutil.disk_partitions(all=True)) or []
    target = str(path.resolve())
    best, found = "", ""
    for part in partitions:
        mount = part.mountpoint
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, found = mount, part.fstype
    return found


class _ProcMemory:
    """Linux's: the worker's statm and /proc/meminfo held open, its tree from /proc."""

    def __init__(self, pid: int, statm: proc.Reread):
        self._pid = pid
        self._statm = statm
        self._meminfo = proc.Reread("/proc/meminfo")
        self._events = proc.own_cgroup(pid)

    def usage(self, pid: int) -> tuple[int, int]:
        return proc.usage(pid, self._statm if pid == self._pid else None) or (0, 0)

    def available(self) -> int | None:
        return proc.available(self._meminfo)

    def tree(self, *, scan: bool) -> list[int] | None:
        return proc.tree(self._pid, scan=scan)

    def oom_kills(self) -> int | None:
        return proc.oom_kills(self._events)

    def close(self) -> None:
        self._statm.close()
        self._meminfo.close()


class _PsutilMemory:
    """The portable way: psutil's process (kept, so a reused pid is never taken for the worker)."""

    def __init__(self, pid: int):
        self._processes: dict[int, psutil.Process] = {}
        self._root = pid
        root = _process(pid)
        if root is not None:
            self._processes[pid] = root

    def usage(self, pid: int) -> tuple[int, int]:
        process = self._processes.get(pid)
        if process is None:
            return 0, 0
        info = _asked(process.memory_info)
        if info is None:
            return 0, 0
        return info.rss, getattr(info, "data", info.rss)  # macOS reports no data segment

    def available(self) -> int | None:
        import psutil  # noqa: PLC0415 — the portable way only

        memory = _asked(psutil.virtual_memory)
        return None if memory is None else int(memory.available)

    def tree(self, *, scan: bool) -> list[int] | None:
        root = self._processes.get(self._root)
        if root is None:
            return [self._root]
        children = _asked(lambda: root.children(recursive=True))
        if children is None:
            return [self._root]
        # A child seen before keeps its Process (its start time is how psutil knows it for the same).
        self._processes = {self._root: root, **{c.pid: self._processes.get(c.pid, c) for c in children}}
        return [self._root, *(c.pid for c in children)]

    def oom_kills(self) -> int | None:
        return None  # no memory cgroup of its own is known this way

    def close(self) -> None:
        self._processes.clear()


def _process(pid: int) -> psutil.Process | None:
    import psutil  # noqa: PLC0415 — the portable way only

    return _asked(lambda: psutil.Process(pid))


def _asked(call: Callable[[], T]) -> T | None:
    """psutil's answer, or None where it cannot give one (gone, another user's, not supported here)."""
    import psutil  # noqa: PLC0415 — the portable way only

    try:
        return call()
    except (psutil.Error, OSError, NotImplementedError):
        return None
