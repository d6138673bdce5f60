"""The supervisor: starts workbench generations, replaces lost ones, and ends them all on shutdown.

Driven by the proxy (or a test) through `send`, `interrupt`, `shutdown` and `note_execution_count`;
it reports back through a `WorkerListener`. It never sees a frontend.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from typing import Protocol

import zmq
from jupyter_client.session import Session
from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from .generation import Generation
from .reaper import Reaper
from .states import Ending, EndReason
from .wire import Wire


class WorkerListener(Protocol):
    """What the supervisor tells its driver (the proxy kernel)."""

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        """A message from a live generation's shell, control, stdin or iopub channel."""

    def generation_ready(self, generation: Generation) -> None:
        """`generation` is the current one and takes requests."""

    def generation_ended(self, generation: Generation, ending: Ending) -> None:
        """`generation` ended; everything it sent before was delivered first."""


class Supervisor(LoggingConfigurable):
    worker_kernel = Unicode(
        "",
        config=True,
        help="Kernelspec name of the workbench; empty means ipykernel on the proxy's own interpreter.",
    )
    placement = Unicode("local", config=True, help="Where generations run. Only 'local' for now.")
    startup_timeout = Float(60.0, config=True, help="Seconds a new generation has to answer kernel_info.")
    shutdown_grace = Float(
        1.0, config=True, help="Seconds between SIGTERM and SIGKILL when generations are ended."
    )

    def __init__(self, listener: WorkerListener, *, session: Session, **kwargs):
        """`session` carries the key, signature scheme and session id the workers share with the proxy."""
        super().__init__(**kwargs)
        self.listener = listener
        self.session = session
        self.current: Generation | None = None
        self.generations: list[Generation] = []
        self._count = 0  # the last execution count the frontend saw
        self._stopping = False
        self._stopped = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._zmq = zmq.Context.instance()
        self._runtime = tempfile.TemporaryDirectory(prefix="klbr-")
        self._reaper: Reaper | None = None

    async def run(self) -> None:
        """Start the first generation and serve until `shutdown` has ended them all."""
        self._reaper = Reaper.start()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self.launch()
                await self._stopped.wait()
        finally:
            self._reaper.close()
            self._runtime.cleanup()

    def launch(self) -> None:
        """Start the next generation in the background; it becomes current when ready."""
        self._tg.create_task(self._start_next())

    async def _start_next(self) -> None:
        number = len(self.generations) + 1
        gen = Generation(
            number,
            kernel_name=self.worker_kernel,
            placement=self.placement,
            session=self.session.clone(),
            runtime_dir=self._runtime.name,
            zmq_context=self._zmq,
            reaper=self._reaper,
            on_message=self._message,
            on_end=self._ended,
            log=self.log,
        )
        self.generations.append(gen)
        self.current = gen
        if not await gen.start(self.startup_timeout):
            return
        if self._count and not await gen.continue_count(self._count, self.startup_timeout):
            return
        if self._stopping:
            await gen.stop(EndReason.SHUTDOWN, self.shutdown_grace)
            return
        self.listener.generation_ready(gen)

    def send(self, channel: str, frames: list) -> bool:
        """Send to the current generation; False when there is none ready."""
        gen = self.current
        return gen is not None and gen.alive and gen.send(channel, frames)

    @property
    def last_count(self) -> int:
        """The highest execution count the frontend has been shown in this session."""
        return self._count

    def note_execution_count(self, count: int) -> None:
        """The proxy showed `count`; a later generation continues after it (DESIGN.md semantics 4)."""
        self._count = max(self._count, count)

    async def interrupt(self) -> None:
        if self.current is not None:
            await self.current.interrupt()

    async def shutdown(self) -> None:
        """End every generation (SIGTERM, SIGKILL after `shutdown_grace`); nothing respawns."""
        self._stopping = True
        await asyncio.gather(
            *(g.stop(EndReason.SHUTDOWN, self.shutdown_grace) for g in self.generations if g.ending is None)
        )
        self._stopped.set()

    def _message(self, gen: Generation, channel: str, wire: Wire) -> None:
        if gen is self.current:
            self.listener.worker_message(gen, channel, wire)

    def _ended(self, gen: Generation, ending: Ending) -> None:
        self.log.warning("generation %d (pid %s) ended: %s, %s", gen.number, gen.pid, ending.reason.value, ending.how)
        if gen is not self.current:
            return
        self.listener.generation_ended(gen, ending)
        if ending.reason is EndReason.START_FAILED:
            self.current = None  # no retry loop: the next request starts another (`ensure_started`)
        elif not self._stopping:
            self.launch()

    def ensure_started(self) -> None:
        """Called by the proxy when a request waits: start a generation if none is alive or starting."""
        if self.current is None and not self._stopping:
            self.launch()
