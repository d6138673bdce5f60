"""A process on this machine that a target runs: its pid and group, its stderr tail, and its exit.

A local worker's, a provisioner helper's, an ``ssh://`` generation's ssh.

The group is the reaper's to kill if the kernel dies however it dies; the exit is reported once, as
the system sees it (`system.watch`: the process's pidfd, or a thread in its wait; exact either way:
no polling, no guessing from a provisioner's `poll()`). What the process started goes with it: its
group is SIGKILLed as soon as it exits, and again at `close`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from typing import IO

from ..boot.reaper import Reaper
from ..boot.worker import NOTICE
from ..system import watch

_NOTICE = NOTICE.encode()
_noticed: set[bytes] = set()  # the bootstrap's lines this kernel has logged (see `boot.worker.NOTICE`)


def _said_once(data: bytes) -> bytes:
    """`data` without the bootstrap's lines this kernel has logged already: every generation on an
    ipykernel that lacks a patch target says so as it starts; the kernel's log says it once."""
    if _NOTICE not in data:
        return data
    fresh = []
    for line in data.splitlines(keepends=True):
        if line.startswith(_NOTICE):
            said = line.rstrip(b"\r\n")  # its newline may come in a read of its own
            if said in _noticed:
                continue
            _noticed.add(said)
        fresh.append(line)
    return b"".join(fresh)


class WorkerProcess:
    def __init__(self, process: subprocess.Popen[bytes], pgid: int | None, reaper: Reaper,
                 on_exit: Callable[[int], None]):
        """Watch `process` (its group `pgid`); `on_exit(returncode)` is called once, on the loop."""
        self.pid = process.pid
        self.pgid = pgid
        self._process = process
        self._reaper = reaper
        self._on_exit = on_exit
        if pgid:
            reaper.watch(pgid)
        self.stderr = StderrTail(process.stderr) if process.stderr is not None else None
        watch.child_exit(process, self._exited)

    def killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pgid or self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self) -> str:
        """The last lines of its stderr, with whatever the pipe holds right now."""
        if self.stderr is None:
            return ""
        self.stderr.read_now()
        return self.stderr.text()

    def close(self) -> None:
        """Its generation has ended: whatever it started goes too, and so do its files."""
        if self.pgid:
            self.killpg(signal.SIGKILL)
            self._reaper.forget(self.pgid)
        if self.stderr is not None:
            self.stderr.close()
        # ipykernel's per-process cell files (used by the debugger)
        shutil.rmtree(os.path.join(tempfile.gettempdir(), f"ipykernel_{self.pid}"), ignore_errors=True)

    def _exited(self) -> None:
        returncode = self._process.poll()
        if returncode is None:  # cannot happen once it exited, but never report a live worker as ended
            returncode = self._process.wait()
        if self.pgid:
            # Whatever the worker started goes with it, now: a child it forked would hold its end
            # of the channels open, and the drain waits for their ends.
            self.killpg(signal.SIGKILL)
        self._on_exit(returncode)


class StderrTail:
    """Copies a worker's stderr through to ours and keeps its last `limit` bytes.

    Read on the loop with add_reader; closed at EOF (when the worker and all it started are gone).
    """

    def __init__(self, pipe: IO[bytes], limit: int = 8192):
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._tail: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        os.set_blocking(self._fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._read)
        self.closed = False

    def _read(self) -> int:
        """Read what the pipe has (the loop calls this when it is readable); bytes read."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if not data:
            self.close()
            return 0
        try:
            sys.stderr.buffer.write(_said_once(data))
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        self.keep(data)
        return len(data)

    def keep(self, data: bytes) -> None:
        """Add `data` to the tail (also what the worker published on iopub about no request)."""
        self._tail.append(data)
        self._size += len(data)
        while self._size - len(self._tail[0]) >= self._limit:
            self._size -= len(self._tail.popleft())

    def read_now(self) -> None:
        """Take in whatever the pipe holds right now (before reporting a tail)."""
        while not self.closed and self._read():
            pass

    def text(self, max_lines: int = 20) -> str:
        data = b"".join(self._tail)[-self._limit :]
        lines = data.decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-max_lines:])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self._fd)
            self._pipe.close()
