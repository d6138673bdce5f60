"""Linux's facts about processes and the machine, read from /proc (and a cgroup's files in /sys).

A worker's statm and /proc/meminfo are held open and read again with one pread each (about 2 us); a
process tree is read from `/proc/PID/task/*/children`, else from a scan of every process's parent in
/proc (about 3 ms for 130 processes). Each reader answers None (or nothing) where /proc does not
show what it asks, so `facts` can take the portable way instead.
"""

from __future__ import annotations

import os
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def read(path: str) -> bytes | None:
    """A small file's contents (at most 4 KiB), or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


class Reread:
    """A /proc file kept open and read again from its start: one pread per sample, where opening,
    reading and closing it were three system calls. A process's file held open stays that process's
    (it reads nothing once the process is gone, even if its pid is reused)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._closed = False

    def read(self) -> bytes | None:
        """Its contents now; None when it cannot be read (gone), or once closed."""
        if self._closed:
            return None
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._closed = True  # gone: never opened again, where a reused pid might answer
                return None
        try:
            return os.pread(self._fd, 4096, 0)
        except OSError:
            return None

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def usage(pid: int, statm: Reread | None = None) -> tuple[int, int] | None:
    """One process's resident set and its data (its private writable memory and stack: what
    RLIMIT_DATA counts, resident or not), bytes; None when /proc does not show it. `statm`: its
    /proc/PID/statm, kept open."""
    data = statm.read() if statm is not None else read(f"/proc/{pid}/statm")
    try:
        fields = data.split() if data else []
        return int(fields[1]) * PAGE, int(fields[5]) * PAGE
    except (IndexError, ValueError):
        return None


def available(meminfo: Reread | None = None) -> int | None:
    """The machine's MemAvailable in bytes (what can be allocated without swapping); `meminfo`:
    /proc/meminfo, kept open."""
    data = (meminfo.read() if meminfo is not None else read("/proc/meminfo")) or b""
    at = data.find(b"\nMemAvailable:")
    if at < 0:
        return None
    try:
        return int(data[at + 14:data.index(b"\n", at + 14)].split()[0]) * 1024
    except (IndexError, ValueError):
        return None


def _children(pid: int) -> list[int] | None:
    """`pid`'s children as its threads list them; None where the kernel keeps no such list."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        data = read(f"/proc/{pid}/task/{tid}/children")
        if data is None:
            if not os.path.exists(f"/proc/{pid}/task/{tid}/children"):
                return None
            continue
        found += [int(word) for word in data.split()]
    return found


def _scanned_descendants(root: int) -> list[int]:
    """Every descendant of `root`, from each process's parent in /proc/PID/stat."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        data = read(f"/proc/{name}/stat")
        if not data:
            continue
        try:
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def tree(root: int, *, scan: bool) -> list[int] | None:
    """`root` and its descendants: from the children lists, or (`scan`) from /proc's parents where
    there are none; None when there are none and `scan` is False (keep the last tree)."""
    pids, todo = [root], [root]
    while todo:
        kids = _children(todo.pop())
        if kids is None:
            return [root, *_scanned_descendants(root)] if scan else None
        pids += kids
        todo += kids
    return pids


def own_cgroup(pid: int) -> str | None:
    """The memory cgroup's events file of `pid` when its cgroup is not the kernel's own (a cgroup of
    the worker's, where an OOM kill counted is this worker's), else None."""
    def memory_line(p: int | str) -> tuple[str, str] | None:
        data = read(f"/proc/{p}/cgroup")
        lines = (data or b"").decode(errors="replace").splitlines()
        for line in lines:  # cgroup v1's memory controller
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return f"/sys/fs/cgroup/memory{path}", "memory.oom_control"
        for line in lines:  # cgroup v2's one hierarchy
            if line.startswith("0::"):
                return f"/sys/fs/cgroup{line[3:]}", "memory.events"
        return None

    worker, ours = memory_line(pid), memory_line("self")
    if worker is None or worker == ours:
        return None
    return os.path.join(*worker)


def oom_kills(events: str | None) -> int | None:
    """The `oom_kill` count of a cgroup's memory events file (v2 memory.events, v1 memory.oom_control)."""
    data = read(events) if events else None
    for line in (data or b"").splitlines():
        if line.startswith(b"oom_kill "):
            return int(line.split()[1])
    return None


def command_line(pid: int) -> list[str] | None:
    """`pid`'s argv as it was started (a venv's python, not the binary it links to); None when
    /proc does not show it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return None
    return [w.decode("utf-8", "replace") for w in (words[:-1] if words[-1:] == [b""] else words)]


def link(pid: int, name: str) -> str | None:
    """Where `/proc/PID/NAME` points (`cwd`, `exe`); None when /proc does not show it."""
    try:
        return os.readlink(f"/proc/{pid}/{name}")
    except OSError:
        return None


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding `path`, from /proc/mounts; None when there is none."""
    best, fstype = "", ""
    try:
        target = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1].replace("\\040", " ")
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, parts[2]
    except OSError:
        return None
    return fstype
