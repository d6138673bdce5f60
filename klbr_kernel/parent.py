"""Ending with the process that started the kernel, as ipykernel does.

jupyter_client puts its own pid in a kernel's environment (`JPY_PARENT_PID`); ipykernel polls for
that parent's end and exits. A Jupyter server or a papermill run that is SIGKILLed leaves no one to
shut the kernel down, and a klbr kernel would otherwise serve on, its workers (and their GPU memory)
with it. Here the parent's end (its pidfd, or `getppid` polled where there is none: see
`klbr_supervisor.system.watch`) is a shutdown as on SIGTERM: generations ended, the cell log closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from klbr_supervisor.system.watch import Watch, parent_end

log = logging.getLogger(__name__)


def watch(loop: asyncio.AbstractEventLoop, shut_down: Callable[[], None]) -> Watch | None:
    """Call `shut_down` once the process that started the kernel ends; the watch, or None.

    Only with `JPY_PARENT_PID` set, as ipykernel: the parent is that process if it is ours, else
    whatever process our parent is (a launcher in between); a kernel already orphaned (its parent
    is init) shuts down at once."""
    given = os.environ.get("JPY_PARENT_PID", "")
    if not given.isdigit():
        return None
    parent = os.getppid()
    if parent == 1 and int(given) != 1:
        log.warning("klbr kernel: the process that started it (pid %s) is gone: shutting down", given)
        loop.call_soon(shut_down)
        return None

    def ended() -> None:
        log.warning("klbr kernel: the process that started it (pid %d) has ended: shutting down", parent)
        shut_down()

    return parent_end(parent, ended)
