"""Which cell a host call is made for, also from another thread: the cell during which the work
making it was handed over (`cell`).

Work is handed over at two points, each stamped with the cell running then: a thread started and a
callable submitted to a `ThreadPoolExecutor`. Nothing user code calls is replaced to see them:
`follow` replaces `threading`'s own start of an OS thread and the pool's work item, below anything
user code calls, so threading, `ThreadPoolExecutor` and their tracebacks are as under ipykernel.
This module replaces nothing by being imported; the package's `__init__` calls `follow` as cell code
imports `klbr_kernel.host`. Standard library only.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextvars
import sys
import threading
from collections.abc import Callable
from typing import Any


def _parent_msg_id() -> str | None:
    """The msg_id of the request ipykernel runs this code for (the running cell, in its own thread)."""
    header = getattr(sys.stdout, "parent_header", None)  # ipykernel's OutStream knows, per context
    if isinstance(header, dict):
        msg_id = header.get("header", header).get("msg_id")
        return msg_id if isinstance(msg_id, str) and msg_id else None
    return None


_handed: contextvars.ContextVar[str | None] = contextvars.ContextVar("klbr_cell", default=None)


def cell() -> str | None:
    """The cell a call is made for: the cell during which the work making it was handed over.

    Work is handed over at two points, both stamped with the cell running then: a thread started
    (its whole run) and a callable submitted to a `ThreadPoolExecutor` (asyncio's default executor
    is one), for as long as that callable runs. The innermost stamp wins; with none (the main
    thread, a thread started before `follow`), ipykernel's parent header.

    Why not the parent header alone: no ipykernel answers it right for both hand-overs. In
    ipykernel 7 it is a context variable set in the context the cell runs in, and a thread (before
    Python 3.14) starts in an empty context, where ipykernel falls back to its global parent: the
    latest request, whichever cell that is. Right for pooled work submitted during the running cell;
    wrong for a thread left over from an earlier cell, which must be told `not_running`. ipykernel
    6.29 (as a stamp on the thread alone would) gives a thread the cell it started in: right for the
    leftover thread, wrong for a pool's thread started in an earlier cell. Stamping each hand-over
    gets both right.
    """
    handed = _handed.get()
    if handed is not None:
        return handed
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        stamped = getattr(thread, "_klbr_cell", None)
        if isinstance(stamped, str):
            return stamped
    return _parent_msg_id()


# The hand-overs are seen where the standard library itself passes them on, below anything user
# code calls: user code sees `Thread.__init__`, `Thread.start`, `ThreadPoolExecutor.submit` and the
# tracebacks of pooled work exactly as under ipykernel. A `sys.addaudithook` on the thread start
# would replace nothing, but it cannot be removed and runs for every audited event of the process:
# a Python hook made `id()` 8x slower here (28 -> 230 ns), and it sees no pooled hand-over at all.

def _starting(function: Callable[..., object], *args: object, **kwargs: object) -> object:
    """`threading`'s own start of a thread's OS thread; its function is `Thread._bootstrap`, bound."""
    thread = getattr(function, "__self__", None)
    if isinstance(thread, threading.Thread):
        # an attribute, as ipykernel stamps threads: a subclass may be unhashable (an attribute of
        # our own, which typeshed's Thread does not declare)
        thread._klbr_cell = cell()  # type: ignore[attr-defined]
    return _started[0](function, *args, **kwargs)


class _HandedWork(concurrent.futures.thread._WorkItem[Any]):
    """The work item `ThreadPoolExecutor.submit` makes (in the submitting thread) and a pool's
    thread runs: it carries the cell it was submitted in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._klbr_cell = cell()

    def run(self, *args: Any, **kwargs: Any) -> None:
        token = _handed.set(self._klbr_cell)
        try:
            return super().run(*args, **kwargs)
        finally:
            _handed.reset(token)


# Python 3.11 and 3.12 start a thread's OS thread through `threading._start_new_thread`, 3.13 on
# through `_start_joinable_thread`.
_START = "_start_joinable_thread" if hasattr(threading, "_start_joinable_thread") else "_start_new_thread"
_started: list[Callable[..., object]] = []  # threading's own start, while `follow` has replaced it


def follow() -> None:
    """From now on, threads and pooled work know the cell they were handed over in: `threading`'s
    start of an OS thread and the pool's work item are replaced (once; again changes nothing).
    Called by `klbr_kernel.host` as cell code imports it, never by the kernel process."""
    if not _started:
        _started.append(getattr(threading, _START))
        setattr(threading, _START, _starting)
        concurrent.futures.thread._WorkItem = _HandedWork  # type: ignore[misc]  # replacing the class is the point

