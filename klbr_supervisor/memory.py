"""A local worker's memory: its process tree's resident set, sampled as the system reports it
(`system.facts`: /proc, or psutil), and what that says about a worker that died.

`MemoryWatch` is made by a `Generation` whose worker runs on this machine once it serves. It
samples on the loop's own timer (about once a second; ten times a second while the worker holds
half of what it could have, so the last sample before an out-of-memory kill is a recent one), and
when a cell ends; never per message. A sample reads each process of the tree and what the machine
has available (on Linux the worker's statm and /proc/meminfo are held open: one pread each, about
2 us); who is in the tree is read again every `RESCAN` samples, and at every sample while the worker
has children.

`verdict` is the rule, no I/O: what an unasked end of the worker says about memory, if anything.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from dataclasses import dataclass
from typing import TypedDict

from .system import facts, limits

INTERVAL = 1.0  # seconds between samples
CLOSE_INTERVAL = 0.1  # while the worker holds at least half of what it could have
RESCAN = 10  # samples between reads of the whole tree (on Linux, a scan of /proc where no children are listed)
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
        self._system = facts.memory_of(pid)
        self._could_have: int | None = None  # MemAvailable and the tree's resident set, at the last full sample
        self._samples = 0
        self._oom_kills = self._system.oom_kills()
        self.past_limit: int | None = None  # what it used when the samples found it past its limit
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
                found = self._system.tree(scan=self._samples % RESCAN == 0)
                if found is not None:
                    self._pids = found
            self._samples += 1
        each = [self._system.usage(p) for p in self._pids]
        now = sum(resident for resident, _ in each)
        if now == 0:  # gone: the last sample stands (its end is judged by it)
            return self.now
        if self.limit:
            self.last = Sample(now, max(data for _, data in each), self.limit)
            # Where the system takes the limit and does not enforce it (macOS), the samples hold it,
            # and a worker found past it is ended. (Asked only then: Linux's limit is never passed.)
            if self.last.used > self.limit and self.past_limit is None and not limits.enforced():
                self.past_limit = self.last.used
                try:
                    os.kill(self.pid, signal.SIGKILL)  # its exit ends the generation, and its group
                except ProcessLookupError:
                    pass
        else:
            if not quick or self._could_have is None:
                free = self._system.available()
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
        after = self._system.oom_kills()
        return after is not None and after > (self._oom_kills or 0)

    def verdict(self, returncode: int | None, *, asked: bool) -> str | None:
        """See `verdict`: called once, as the worker's end is recorded."""
        if self.past_limit is not None and self.limit and not asked and returncode == -signal.SIGKILL:
            return (f"past its memory limit: it used {size_text(self.past_limit)} of {size_text(self.limit)} "
                    "(Supervisor.memory_limit), which this system does not enforce itself, so klbr ended it")
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
        self._system.close()

    def _tick(self) -> None:
        self.sample()
        last = self.last
        close = last is not None and last.could_have and last.used >= last.could_have / 2
        self._timer = self._loop.call_later(CLOSE_INTERVAL if close else INTERVAL, self._tick)
