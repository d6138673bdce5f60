"""Workers die with the proxy: armed in the worker process itself, before its code runs
(`klbr_supervisor.system.death`: PR_SET_PDEATHSIG, or the reaper where there is none).

- the default worker starts as `python -m klbr_supervisor.boot.worker PARENT_PID ...` (see `worker`),
  which calls `die_with(PARENT_PID)` and then runs ipykernel in the same process: no extra exec;
- any other kernelspec's command runs behind this file as a script,
  ``python -I -S deathsig.py PARENT_PID COMMAND...``, which calls `die_with` and execs COMMAND
  (the death signal survives exec); about 20 ms more on that worker's start.

The process group is `Popen(start_new_session=True)`'s, which is safe. If the parent is already gone
when the child gets here, the child exits at once. Standard library only.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # a script under -I -S: klbr's packages are where this file is
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from klbr_supervisor.system.death import die_with

__all__ = ["command", "die_with"]  # `die_with` for `boot.worker`


def command(parent_pid: int, argv: list[str]) -> list[str]:
    """`argv` run behind this file, as the supervisor launches kernelspec workers."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(parent_pid), *argv]


if __name__ == "__main__":
    die_with(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])  # noqa: S606 — the kernelspec's argv, as `command` wrote it
