"""Workers die with the proxy: PR_SET_PDEATHSIG set in the worker process itself, before its code runs.

A `preexec_fn` could do it between fork and exec, but Python documents `preexec_fn` as unsafe in a
process with threads, and the proxy has several. So the child sets it:

- the default worker starts as `python -m klbr_supervisor.boot.worker PARENT_PID ...` (see `worker`),
  which calls `die_with(PARENT_PID)` and then runs ipykernel in the same process: no extra exec;
- any other kernelspec's command runs behind this file as a script,
  ``python -I -S deathsig.py PARENT_PID COMMAND...``, which calls `die_with` and execs COMMAND
  (the death signal survives exec); about 20 ms more on that worker's start.

The process group is `Popen(start_new_session=True)`'s, which is safe. If the parent is already gone
when the child gets here, the child exits at once. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """Called first thing in a worker process: SIGKILL when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)


def command(parent_pid: int, argv: list[str]) -> list[str]:
    """`argv` run behind this file, as the supervisor launches kernelspec workers."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(parent_pid), *argv]


if __name__ == "__main__":
    die_with(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])  # noqa: S606 — the kernelspec's argv, as `command` wrote it
