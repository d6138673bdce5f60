"""A worker's exit is reported once and exactly, also where `os.pidfd_open` is missing or refused.

macOS has no such call; under valgrind (the proxy's instruction-count benchmark) it answers ENOSYS.
The process is then watched by a thread in its `Popen.wait` (`klbr_supervisor.system.watch`). Each
way is run here on real processes: an exit code and a signal, each reported once, with its return code.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys

import pytest

from klbr_supervisor.targets.process import WorkerProcess


def _no_pidfd(pid: int, flags: int = 0) -> int:
    raise OSError(errno.ENOSYS, "Function not implemented")


async def _exit_of(argv: list[str], kill: bool) -> list[int]:
    reported: list[int] = []
    done = asyncio.Event()

    def on_exit(returncode: int) -> None:
        reported.append(returncode)
        done.set()

    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    watched = WorkerProcess(process, None, None, on_exit)  # type: ignore[arg-type]  # no group: no reaper
    if kill:
        process.kill()
    else:
        assert process.stdin is not None
        process.stdin.close()  # the child exits once its stdin ends
    await asyncio.wait_for(done.wait(), timeout=60)
    await asyncio.sleep(0)  # a second report would come on the loop, right after the first
    watched.close()
    return reported


@pytest.mark.parametrize("pidfd", ["pidfd", "pidfd refused (ENOSYS)", "no pidfd_open"])
@pytest.mark.parametrize("kill", [False, True], ids=["exit 3", "SIGKILL"])
def test_exit_reported_once_and_exactly(monkeypatch, pidfd, kill):
    if pidfd == "pidfd refused (ENOSYS)":
        monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    elif pidfd == "no pidfd_open":
        monkeypatch.delattr(os, "pidfd_open")
    argv = [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"]
    assert asyncio.run(_exit_of(argv, kill)) == ([-9] if kill else [3])


def test_other_pidfd_errors_are_not_hidden(monkeypatch):
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "pidfd_open", refused)
    with pytest.raises(OSError, match="Too many"):
        asyncio.run(_exit_of([sys.executable, "-c", "pass"], kill=False))
