"""A local worker's memory: its process tree's resident set, sampled from /proc, and what that says
about a worker that died.

`MemoryWatch` is made by a `Generation` whose worker runs on this machine once it serves. It
samples on the loop's own timer (about once a second; ten times a second while the worker holds
half of what it could have, so the last sample before an out-of-memory kill is a recent one), and
when a cell ends; never per message. A sample reads the statm of each process of the tree and
/proc/meminfo (the worker's statm and meminfo are held open: one pread each, about 2 us); who is
in the tree is read from `/proc/PID/task/*/children` every `RESCAN` samples, and at every sample
while the worker has children, else from a scan of `/proc` (about 3 ms for 130 processes).

`verdict` is the rule, no I/O: what an unasked end of the worker says about memory, if anything.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from dataclasses import dataclass
from typing import TypedDict

PAGE = os.sysconf("SC_PAGE_SIZE")
INTERVAL = 1.0  # seconds between samples
CLOSE_INTERVAL = 0.1  # while the worker holds at least half of what it could have
RESCAN = 10  # samples between scans of /proc for the tree, where the kernel lists no children
# How close to what it could have the last sample must be for a SIGKILL to be called "most
# likely out of memory" (the OOM killer ends the largest process when the machine runs out).
NEAR = 0.8
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)
# How code that cannot take a failed allocation ends: an abort (C++'s bad_alloc, Rust's alloc
# error, a C library's own check), or a null pointer used.
_ALLOCATION_DEATHS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS})


def parse_size(text: str | int) -> int:
    """`Supervisor.memory_limit` in bytes: "512M", "8G", "1.5GiB" or a number of bytes; 0 = none."""
    if isinstance(text, int):
        return max(text, 0)
    match = _SIZE.fullmatch(text)
    if match is None:
        why = f"{text!r} is not a size: bytes, or a number with K, M, G or T (e.g. 512M, 8G)"
        raise ValueError(why)
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def size_text(n: int) -> str:
    """Bytes in the words `%klbr status` and errors use: GiB with one decimal, else MiB."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _read(path: str) -> bytes | None:
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


def usage(pid: int, statm: Reread | None = None) -> tuple[int, int]:
    """One process's resident set and its data (its private writable memory and stack: what
    RLIMIT_DATA counts, resident or not), bytes; (0, 0) once it is gone. `statm`: its
    /proc/PID/statm, kept open."""
    data = statm.read() if statm is not None else _read(f"/proc/{pid}/statm")
    try:
        fields = data.split() if data else []
        return int(fields[1]) * PAGE, int(fields[5]) * PAGE
    except (IndexError, ValueError):
        return 0, 0


def available(meminfo: Reread | None = None) -> int | None:
    """The machine's MemAvailable in bytes (what can be allocated without swapping); `meminfo`:
    /proc/meminfo, kept open."""
    data = (meminfo.read() if meminfo is not None else _read("/proc/meminfo")) or b""
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
        data = _read(f"/proc/{pid}/task/{tid}/children")
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
        data = _read(f"/proc/{name}/stat")
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
    """The memory cgroup's directory of `pid` when it is not the kernel's own (a cgroup of the
    worker's, where an OOM kill counted is this worker's), else None."""
    def memory_line(p: int | str) -> tuple[str, str] | None:
        data = _read(f"/proc/{p}/cgroup")
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
    data = _read(events) if events else None
    for line in (data or b"").splitlines():
        if line.startswith(b"oom_kill "):
            return int(line.split()[1])
    return None


class MemoryStatus(TypedDict):
    """`%klbr status` and `host.inspect()`: a worker's memory, bytes."""
    rss: int  # its process tree's resident set at the last sample
    peak: int  # the largest sample since it started
    limit: int | None  # `Supervisor.memory_limit` as its worker applied it; None: none


@dataclass(frozen=True)
class Sample:
    rss: int  # the tree's resident set, bytes
    # What it could have and how much of it it used: under a limit (which counts each process's
    # data, resident or not), the limit and its largest process's data; else the machine's
    # MemAvailable plus the tree's resident set, and that resident set.
    used: int
    could_have: int | None


def verdict(returncode: int | None, *, asked: bool, last: Sample | None, limit: int | None,
            oom_killed: bool) -> str | None:
    """What the end of a worker nobody asked to end says about memory, in words added to how it
    ended; None when it says nothing. A SIGKILL is called out of memory only with a sign: the
    cgroup's own count of OOM kills, or a last sample close to what the worker could have."""
    if asked or returncode is None or (returncode >= 0 and not limit):
        return None
    if returncode == -signal.SIGKILL:
        if oom_killed:
            at = f" at its memory limit of {size_text(limit)} (Supervisor.memory_limit)" if limit else ""
            return f"out of memory (the system killed it{at})"
        if last is not None and last.could_have and last.used >= NEAR * last.could_have:
            where = " (Supervisor.memory_limit)" if limit else ""
            return (f"most likely out of memory: it used {size_text(last.used)}, with about "
                    f"{size_text(last.could_have)} available{where}")
        return None
    if limit and (returncode > 0 or -returncode in _ALLOCATION_DEATHS):
        return (f"its memory limit is {size_text(limit)} (Supervisor.memory_limit): code that ends "
                f"when an allocation past it fails ends this way")
    return None


class MemoryWatch:
    """One generation's worker's memory, sampled; read by `%klbr status`, the store and the end."""

    def __init__(self, pid: int, limit: int | None):
        """Called on the loop once the worker serves; the first sample is taken now."""
        self.pid = pid
        self.limit = limit
        self.now = 0
        self.peak = 0
        self.last: Sample | None = None
        self._cell_peak: int | None = None  # None: no cell running
        self._pids: list[int] = [pid]
        self._statm = Reread(f"/proc/{pid}/statm")  # the worker's own; the rest of its tree by path
        self._meminfo = Reread("/proc/meminfo")
        self._could_have: int | None = None  # MemAvailable and the tree's resident set, at the last full sample
        self._samples = 0
        self._events = own_cgroup(pid)
        self._oom_kills = oom_kills(self._events)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._tick()

    def sample(self, *, quick: bool = False) -> int:
        """The tree's resident set now (bytes), kept as the last sample and counted in the peaks.

        `quick`, as a cell ends: the processes the last full sample found, and what the worker
        could have as that sample saw it (MemAvailable and the tree's resident set then: the
        worker's own growth since does not change that sum), one pread for a worker with no
        children, where reading /proc/meminfo costs four times a statm."""
        if not quick:
            if self._samples % RESCAN == 0 or len(self._pids) > 1:
                found = tree(self.pid, scan=self._samples % RESCAN == 0)
                if found is not None:
                    self._pids = found
            self._samples += 1
        each = [usage(p, self._statm if p == self.pid else None) for p in self._pids]
        now = sum(resident for resident, _ in each)
        if now == 0:  # gone: the last sample stands (its end is judged by it)
            return self.now
        if self.limit:
            self.last = Sample(now, max(data for _, data in each), self.limit)
        else:
            if not quick or self._could_have is None:
                free = available(self._meminfo)
                self._could_have = free + now if free is not None else None
            self.last = Sample(now, now, self._could_have)
        self.now = now
        self.peak = max(self.peak, now)
        if self._cell_peak is not None:
            self._cell_peak = max(self._cell_peak, now)
        return now

    def cell_started(self) -> None:
        """A cell was sent to the worker: its peak counts from the last sample."""
        self._cell_peak = self.now

    def cell_ended(self) -> int | None:
        """The running cell's outcome is being recorded: a sample now, and the cell's peak (None if no
        cell was running)."""
        if self._timer is not None:
            self.sample(quick=True)
        peak, self._cell_peak = self._cell_peak, None
        return peak

    def oom_killed(self) -> bool:
        """The worker's own cgroup counted an OOM kill since the worker started."""
        after = oom_kills(self._events)
        return after is not None and after > (self._oom_kills or 0)

    def verdict(self, returncode: int | None, *, asked: bool) -> str | None:
        """See `verdict`: called once, as the worker's end is recorded."""
        return verdict(returncode, asked=asked, last=self.last, limit=self.limit,
                       oom_killed=not asked and returncode == -signal.SIGKILL and self.oom_killed())

    def status(self) -> MemoryStatus:
        """`%klbr status` and `host.inspect()`: bytes now, the peak, the limit (None: none)."""
        return {"rss": self.now, "peak": self.peak, "limit": self.limit}

    def close(self) -> None:
        """The worker has ended: no more samples."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._statm.close()
        self._meminfo.close()

    def _tick(self) -> None:
        self.sample()
        last = self.last
        close = last is not None and last.could_have and last.used >= last.could_have / 2
        self._timer = self._loop.call_later(CLOSE_INTERVAL if close else INTERVAL, self._tick)
