"""A worker dies with the kernel: its first act (`boot.worker`, and `boot.deathsig` in front of any
other kernelspec's command). Standard library only.

Linux: PR_SET_PDEATHSIG, armed in the worker process itself (a `preexec_fn` could arm it between fork
and exec, but Python documents it as unsafe in a process with threads, and the kernel has several),
so the kernel's death SIGKILLs the worker however the kernel dies; it survives an exec. Where prctl is
missing (macOS) or refused, the reaper alone ends the worker (`boot.reaper`: it kills every
generation's process group when the kernel's pipe to it closes, on every system), which needs nothing
of the worker and so ends one hung in C as well. Either way a worker whose parent is already gone
exits at once.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with(parent_pid: int) -> str:
    """Called first thing in a worker process: arm its death with `parent_pid`; which way is armed."""
    way = "PR_SET_PDEATHSIG" if _pdeathsig() else "the reaper"
    if os.getppid() != parent_pid:  # the parent died before the death was armed
        os._exit(1)
    return way


def _pdeathsig() -> bool:
    """PR_SET_PDEATHSIG with SIGKILL, where the C library has prctl and the call is not refused."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        return False
    return bool(prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0)
