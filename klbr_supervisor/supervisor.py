"""The supervisor: starts workbench generations, ends them when they must end, and replaces them.

Driven by the proxy (or a test, with no proxy: `tests/test_supervisor.py`) through `send`,
`send_execute`, `cells` (the running cell: busy, input, finished), `interrupt`, `restart`,
`relocate` and `shutdown`; it reports back through a `WorkerListener`. It never sees a frontend.
Decisions (ladder, deadlines, budget, poison, refusals, retries) are the `Policy`'s; this class and
`CellWatch` carry them out. Its own state, and what follows a generation's end, are `succession`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import zmq
from jupyter_client.session import Session

from .boot.placement import Placement, PlacementError, parse
from .boot.prelaunch import Early, host_environ
from .boot.reaper import Reaper
from .counts import ExecutionCounts
from .generation import Generation
from .host import HostService
from .host.channel import Credentials
from .ladder import CellWatch
from .listener import WorkerListener
from .policy import Policy, Refusal
from .protocol import Frames
from .running import RunningCell
from .settings import SupervisorSettings
from .states import EndReason, SupervisorState
from .store import Store
from .succession import Succession
from .targets.base import Given
from .targets.factory import check, kind_for, target_for
from .tasks import Tasks
from .wire import Wire


class Supervisor(Succession, SupervisorSettings):
    """Configured as `Supervisor.*` (see `settings`)."""

    def __init__(self, listener: WorkerListener, *, session: Session, notebook: str | None = None,
                 kernel_name: str | None = None, worker_options: tuple[str, ...] = (),
                 first: Early | None = None, host_client: Mapping[str, str] | None = None, **kwargs: Any):
        """`session` carries the key, signature scheme and session id the workers share with the proxy;
        `notebook` and `kernel_name` label this session in the store; `worker_options` go on every
        worker's command line (`SupervisorSettings.worker_options`); `first` is what `boot.prelaunch`
        started before the imports, which generation 1 adopts if it is what is configured;
        `host_client` the host client's files, placed for workers that may have no klbr (`targets.client`)."""
        super().__init__(**kwargs)
        self.worker_options = tuple(worker_options)
        self._host_client = dict(host_client or {})
        self.listener = listener
        self.session = session
        self.store = Store(parent=self)
        self.notebook = notebook
        self._labels = {"notebook": notebook, "kernel": kernel_name}
        self.policy = Policy(
            interrupt_grace=self.interrupt_grace,
            cell_timeout=self.cell_timeout,
            restart_limit=self.restart_limit,
            restart_window=self.restart_window,
            poison_after=self.poison_after,
        )
        self.state = SupervisorState.SERVING
        self._refusal: Refusal | None = None  # in a HALTED state: what requests are told
        # Where generations run now. A spec that names no placement is kept as such: every start
        # fails saying why (`targets.factory.Nowhere`), never a silent fallback to local.
        try:
            self.where: Placement = parse(self.placement)
        except PlacementError:
            self.where = Placement(self.placement, "invalid")
        self.current: Generation | None = None
        self.spare: Generation | None = None
        # Generations not yet ended (current, spare, and any being stopped); an ended one is let go
        # of, and only its row in the store remains.
        self._live: set[Generation] = set()
        self._numbers = itertools.count(1)
        self.counts = ExecutionCounts()
        self.cells = CellWatch(self.policy, self.kill_grace, self.log, self._cell_finished)
        self.host = HostService(self, parent=self)
        self._stopped = asyncio.Event()
        self._tasks: Tasks | None = None
        self._zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._reaper: Reaper | None = None
        if first is not None and not first.matches(self, session.session):
            # The configuration (a config file, options only traitlets read) asks for another one.
            self.log.info("the first worker started early is not the one configured: discarded")
            first.discard()
            first = None
        self._first = first  # generation 1's target adopts it
        self._runtime_dir = first.runtime_dir if first is not None else tempfile.mkdtemp(prefix="klbr-")

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the first generation and serve until `shutdown` has ended them all."""
        self._reaper = Reaper.start(self._runtime_dir)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = self.cells.tasks = Tasks(tg, self.log)
                self.host.start(f"ipc://{os.path.join(self._runtime_dir, 'host')}", self._zmq, self._reaper)
                self._launch(spare=False)  # first: the worker starts while the store opens
                self.store.open(uuid=self.session.session, **self._labels)
                await self._stopped.wait()
        finally:
            self._reaper.close()
            self.host.close()
            self.store.close()
            shutil.rmtree(self._runtime_dir, ignore_errors=True)

    def _launch(self, *, spare: bool) -> Generation:
        number = next(self._numbers)
        early, self._first = self._first, None  # generation 1 adopts what was started early
        host = early.host if early is not None and early.host else host_environ(self._runtime_dir)
        assert self._reaper is not None, "run() starts the reaper before any generation"
        given = Given(number=number, runtime_dir=self._runtime_dir, reaper=self._reaper, context=self._zmq,
                      log=self.log, ssh=self.ssh, link_timeout=self.link_timeout, engines=self.engines,
                      client=self._host_client,
                      host_tcp=self.host.tcp)
        target = target_for(self.where, self.worker_kernel, session=self.session.clone(), given=given, early=early)
        gen = Generation(
            number, target=target, session=self.session, worker_args=self.worker_args,
            worker_options=self.worker_options, zmq_context=self._zmq, on_message=self._message,
            on_end=self._ended, log=self.log, host=Credentials.from_environ(host), link_timeout=self.link_timeout,
            memory_limit=self.memory_limit_bytes)
        self.host.admit(gen, gen.host)
        self._live.add(gen)
        if spare:
            self.spare = gen
        else:
            self.current = gen
        self._background.start(self._bring_up(gen), f"starting generation {number}")
        return gen

    async def _bring_up(self, gen: Generation) -> None:
        try:
            # Checked first as `%klbr placement` checks: the configured placement, and again after
            # a failed start (the failure then names what is missing, not just the worker's exit).
            first = gen.number == 1 or self.state is SupervisorState.START_FAILED
            started = await gen.start(self.startup_timeout, self._check(gen.placement) if first else None)
        except Exception:
            # A bug here must cost one generation, not the kernel: it ends as a failed start.
            self.log.exception("generation %d: start failed", gen.number)
            await gen.stop(EndReason.START_FAILED, self.kill_grace)
            return
        if not started:
            return  # `_ended` has dealt with it
        if self.state is SupervisorState.STOPPING:
            await gen.stop(EndReason.SHUTDOWN, self.kill_grace)
        elif gen is self.current:
            self._set_state(SupervisorState.SERVING, f"generation {gen.number} serves")
            self._record_start(gen)
            self.listener.generation_ready(gen)
            # Warm the spare a moment later: started at once, its imports compete for the CPU with
            # the first cells, which the user is waiting for (start -> first cell).
            asyncio.get_running_loop().call_later(self.standby_delay, self._ensure_spare)
        # A spare stays ready, unused, until `_takeover`.

    async def _check(self, placement: Placement) -> None:
        """The configured first placement, checked as `%klbr placement` checks a new one (ssh://'s
        launch checks the same itself: checked apart, it would cost a second connection to the
        host at every start)."""
        kind = kind_for(placement, self.worker_kernel)
        if not kind.checked_by_launch:
            await kind.check(placement, self.ssh)

    async def restart(self) -> None:
        """`%klbr restart`: a new generation now; the budget, a crash loop and poison start over."""
        self.policy.reset_restarts()
        self.policy.clear_poison()
        self._resume("restart")
        gen = self.current
        self.store.event("restart", {"generation": gen.number if gen else None})
        if gen is not None and gen.ending is None:
            await gen.stop(EndReason.RESTART, self.kill_grace)  # `_ended` hands over to the spare
        else:
            self._takeover()

    async def relocate(self, spec: str, *, check_first: bool = True) -> Generation | None:
        """`%klbr placement SPEC`, between cells: the current generation ends (`relocated`) and a new
        one starts on `spec`; the namespace does not move. A spec that is malformed, or names a place
        where no worker can start (no interpreter, no ipykernel in it, no such kernelspec), raises
        `PlacementError` and the session stays where it was. The new generation, once it serves or
        has failed to start (its `ending` says why)."""
        target = parse(spec)
        if check_first:
            await check(target, self.ssh, self.worker_kernel, self.engines)
        old, before = self.current, self.where
        self.where = target
        self.policy.reset_restarts()
        self._resume("placement")
        self.store.event("placement", {"from": before.spec, "to": target.spec,
                                       "generation": old.number if old else None})
        self.log.info("placement %s -> %s", before, target)
        self._stop_spare()  # it waits on the old placement
        if old is not None and old.ending is None:
            await old.stop(EndReason.RELOCATED, self.kill_grace)  # `_ended` starts the new one
        else:
            self._takeover()
        new = self.current
        if new is None:
            return None
        await new.wait_started()
        return new

    async def reconnect(self) -> Generation | None:
        """`%klbr reconnect`: a new generation on the same placement, once it serves (or failed)."""
        return await self.relocate(self.where.spec, check_first=False)

    async def shutdown(self) -> None:
        """End every generation (SIGTERM, SIGKILL after `kill_grace`); nothing respawns."""
        self._set_state(SupervisorState.STOPPING, "shutdown")
        self.host.shutdown()  # its commands end too: `run` waits for their tasks
        try:
            await asyncio.gather(*(g.stop(EndReason.SHUTDOWN, self.kill_grace) for g in list(self._live)))
        finally:
            self._stopped.set()  # nothing respawns; the reaper takes whatever is left

    # -- requests ----------------------------------------------------------------------------------

    def send(self, channel: str, frames: Frames) -> bool:
        """Send to the current generation; False when there is none ready."""
        gen = self.current
        return gen is not None and gen.alive and gen.send(channel, frames)

    def send_execute(self, frames: Frames, *, msg_id: str, code: str, counts: bool, timeout: float | None,
                     cell_id: int | None = None) -> bool:
        """Send an execute; first tell the worker where the count continues, if it does not know.

        `counts` is whether the execute takes an execution count (store_history and not silent);
        `timeout` a per-cell deadline; `cell_id` its row in the store. The worker runs shell messages
        in order, so the silent sync always runs first. From here until `cells.finished`, a loss of
        the worker is this cell's.
        """
        gen = self.current
        if gen is None or not gen.alive:
            return False
        if counts:
            if gen.next_count != self.counts.last + 1:
                gen.sync_count(self.counts.last, self.counts.catch_up())
            self.counts.reserve(msg_id)
        self.cells.sent(msg_id, code, gen, timeout, cell_id)
        if gen.memory is not None:
            gen.memory.cell_started()
        return gen.send("shell", frames)

    def worker_count(self, count: int) -> None:
        """The current worker gave a cell `count` (its reply said so)."""
        self.counts.from_worker(count)
        if self.current is not None:
            self.current.next_count = count + 1

    def _cell_finished(self, cell: RunningCell) -> None:
        self.host.cell_ended(cell, stopping=self.state is SupervisorState.STOPPING)

    def start_task(self, work: Coroutine[Any, Any, Any], what: str,
                   on_error: Callable[[Exception], None] | None = None) -> None:
        """Background work of the supervisor's side services (a host command), failure logged."""
        self._background.start(work, what, on_error)

    def refusal(self, code: str | None) -> Refusal | None:
        """Why a request must not run now, if it must not: the restart budget is spent or the link
        lost (nothing can run until the user says), or `code` (an execute's) killed its worker too
        often in a row."""
        if self.current is None and self._refusal is not None:
            return self._refusal
        if code is not None and self.policy.is_poisoned(code):
            return Refusal("poisoned", self.policy.poison_count())
        return None

    async def interrupt(self) -> None:
        """Interrupt the current generation; kill it if its cell has not ended within the grace."""
        gen = self.current
        if gen is None or not gen.alive:
            return
        self.store.event("interrupt", {"generation": gen.number})
        await gen.interrupt()
        self.cells.interrupted(gen)

    # -- status ------------------------------------------------------------------------------------

    def set_session_timeout(self, seconds: float) -> None:
        """`%klbr timeout SECONDS` (0 = none) for the cells that follow."""
        self.policy.session_timeout = seconds

    def status(self) -> dict[str, Any]:
        gen, spare = self.current, self.spare
        stopped = {"placement_lost": "stopped: link lost", "crash_loop": "stopped: crash loop"}
        return {
            "generation": gen.number if gen else None,
            "pid": gen.pid if gen else None,
            "state": gen.state.shown if gen else stopped.get(self._refusal.reason if self._refusal else "", "none"),
            "uptime": gen.uptime if gen else None,
            "placement": self.where.spec,
            "standby": (spare.state.shown if spare else "none") if self.standby_on else "off",
            "key": ("shared with the frontend" if gen.shares_key else "its own, re-signed by the proxy") if gen else None,
            "restarts": self.policy.restarts_in_window(),
            "restart_limit": self.restart_limit,
            "restart_window": self.restart_window,
            "cell_timeout": self.policy.timeout_for(),
            "interrupt_grace": self.policy.interrupt_grace,
            "identity": gen.identity() if gen and gen.alive else None,
            "signing": self.session.signature_scheme if self.session.key else None,
            "memory": gen.memory.status() if gen and gen.memory else None,
            "memory_limit": self.memory_limit_bytes,
            "memory_applied": gen.memory_limit if gen else None,  # the limit its worker started under
        }

    # -- from generations --------------------------------------------------------------------------

    def _message(self, gen: Generation, channel: str, wire: Wire) -> None:
        if gen is self.current:
            self.listener.worker_message(gen, channel, wire)

    def _record_start(self, gen: Generation) -> None:
        info = gen.kernel_info.get("language_info", {})
        identity = {**gen.identity(), "kernel": gen.kernel_name, "language": info.get("name")}
        self.store.generation_started(gen.number, gen.placement.spec, identity, gen.pid)
