"""A child's exit and the end of the kernel's parent, watched on the loop. Standard library only.

Linux: a pidfd, readable once the process has ended; exact, and no thread. Where `os.pidfd_open` is
missing (macOS, Linux before 5.3) or refused at run time (valgrind answers ENOSYS, a seccomp filter
EPERM), the portable way: a thread blocked in the child's `Popen.wait`, and the parent's end seen as
`getppid` changing (the kernel is handed to another parent), polled as ipykernel's parent poller
does. A pidfd refused for a lack of resources (EMFILE, ENOMEM) is raised, not hidden behind a thread.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from typing import Protocol

# How often the portable way asks for the kernel's parent (ipykernel's poller asks every second), so
# that the kernel, and its workers with it, are gone within 2 s of the process that started it.
PARENT_POLL = 0.2
# What says the system does not offer pidfds here (as against a lack of resources, raised).
_REFUSED = frozenset({errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EINVAL})


class Child(Protocol):
    """A child process of this one, as `subprocess.Popen` is."""

    pid: int

    def wait(self) -> int: ...


class Watch(Protocol):
    def stop(self) -> None:
        """Stop watching: the callback is not called after this."""


def child_exit(child: Child, on_exit: Callable[[], None]) -> Watch:
    """Call `on_exit()` once, on the running loop, when `child` has ended. Its status stays for its
    `Popen` to read (`poll()`): a pidfd reaps nothing, and the thread's `wait` is the Popen's own."""
    loop = asyncio.get_running_loop()
    fd = pidfd(child.pid)
    if fd is not None:
        return _Readable(loop, fd, on_exit)
    return _Waiting(loop, child, on_exit)


def parent_end(parent: int, on_end: Callable[[], None]) -> Watch:
    """Call `on_end()` once, on the running loop, when `parent` (this process's parent) has ended."""
    loop = asyncio.get_running_loop()
    fd = pidfd(parent)
    if fd is not None:
        return _Readable(loop, fd, on_end)
    return _Polling(loop, parent, on_end)


def pidfd(pid: int) -> int | None:
    """A pidfd of `pid`; None where the system does not offer one."""
    open_pidfd = getattr(os, "pidfd_open", None)
    if open_pidfd is None:
        return None
    try:
        return int(open_pidfd(pid))
    except OSError as e:
        if e.errno in _REFUSED:
            return None
        raise


class _Readable:
    """A pidfd on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, then: Callable[[], None]):
        self._loop, self._fd, self._then = loop, fd, then
        loop.add_reader(fd, self._ended)

    def _ended(self) -> None:
        self.stop()
        self._then()

    def stop(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class _Waiting:
    """A daemon thread in the child's `wait`, which hands its end to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, child: Child, then: Callable[[], None]):
        self._loop, self._child, self._then = loop, child, then
        self._stopped = False
        threading.Thread(target=self._wait, name=f"exit of {child.pid}", daemon=True).start()

    def _wait(self) -> None:
        self._child.wait()
        try:
            self._loop.call_soon_threadsafe(self._ended)
        except RuntimeError:
            pass  # the loop is closed: the kernel is ending, and no one is left to tell

    def _ended(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._then()

    def stop(self) -> None:
        self._stopped = True


class _Polling:
    """`getppid` asked on the loop's timer until it is no longer `parent`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, parent: int, then: Callable[[], None]):
        self._loop, self._parent, self._then = loop, parent, then
        self._timer: asyncio.TimerHandle | None = loop.call_later(PARENT_POLL, self._ask)

    def _ask(self) -> None:
        if os.getppid() == self._parent:
            self._timer = self._loop.call_later(PARENT_POLL, self._ask)
        else:
            self._timer = None
            self._then()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
