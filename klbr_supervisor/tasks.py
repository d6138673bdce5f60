"""Background work on the event loop whose failure is logged, never the end of the kernel.

A task of an `asyncio.TaskGroup` that raises cancels the whole group, and for the proxy or the
supervisor that means the kernel exits. `Tasks.start` runs a coroutine in the group behind a guard:
an exception is logged with its traceback and handed to `on_error` (which answers the request the work
was for, if any), and the kernel keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any


class Tasks:
    """Created by the owner of a task group (the proxy, the supervisor) once the group runs."""

    def __init__(self, group: asyncio.TaskGroup, log: logging.Logger):
        self._group = group
        self._log = log

    def start(self, work: Coroutine[Any, Any, Any], what: str,
              on_error: Callable[[Exception], None] | None = None) -> asyncio.Task[None]:
        """Run `work` in the group; `what` names it in the log if it fails."""
        return self._group.create_task(self._guarded(work, what, on_error))

    async def _guarded(self, work: Coroutine[Any, Any, Any], what: str,
                       on_error: Callable[[Exception], None] | None) -> None:
        try:
            await work
        except Exception as e:
            self._log.error("%s failed; the kernel keeps serving", what, exc_info=e)
            if on_error is not None:
                try:
                    on_error(e)
                except Exception:
                    self._log.exception("answering the failure of %s failed too", what)
