"""The supervisor: starts workbench generations, ends them when they must end, and replaces them.

Driven by the proxy (or a test, with no proxy: `tests/test_supervisor.py`) through `send`,
`send_execute`, `interrupt`, `restart`, `relocate` and `shutdown`; it reports back through a
`WorkerListener`, each message of the current generation after its own watch of the running cell
has seen it (`cells`: busy, input, count, reply and idle). It never sees a frontend.
Decisions (ladder, deadlines, budget, poison, refusals, retries) are the `Policy`'s; this class and
`CellWatch` carry them out. Which generations there are, its state, and what follows a generation's
end are its `succession`'s (`Succession`, which owns them).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import zmq
from jupyter_client.session import Session

from .boot.early import Early
from .boot.placement import Placement, PlacementError, parse
from .boot.prelaunch import host_endpoint, host_environ
from .boot.reaper import Reaper
from .cell_watch import CellWatch
from .generation import Generation
from .host import HostService
from .host.channel import Credentials
from .listener import WorkerListener
from .messages.protocol import Frames
from .messages.wire import Wire
from .policy import Policy, Refusal
from .running import RunningCell
from .settings import SupervisorSettings
from .spare_rest import SpareRest
from .states import HALTED, EndReason, SupervisorState
from .store import Store
from .succession import Succession
from .targets.base import Given
from .targets.factory import check, kind_for, target_for
from .tasks import Tasks


class Supervisor(SupervisorSettings):
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
        # Where generations run now. A spec that names no placement is kept as such: every start
        # fails saying why (`targets.factory.Nowhere`), never a silent fallback to local.
        try:
            self.where: Placement = parse(self.placement)
        except PlacementError:
            self.where = Placement(self.placement, "invalid")
        self._numbers = itertools.count(1)
        self.cells = CellWatch(self.policy, self.kill_grace, self.log, self._cell_finished)
        self.host = HostService(self, parent=self)
        self.succession = Succession(
            listener=listener, policy=self.policy, store=self.store, host=self.host, cells=self.cells, log=self.log,
            launch=lambda spare: self._launch(spare=spare), record_start=self._record_start,
            standby=lambda: self.standby_on and not self.rest.resting, kill_grace=self.kill_grace,
            restart_window=self.restart_window)
        self.rest = SpareRest(self.standby_idle_timeout, self.standby_delay, kept=lambda: self.standby_on,
                              last_cell=lambda: self.cells.last, stop=self.succession.stop_spare,
                              start=self.succession.ensure_spare, log=self.log)
        self._stopped = asyncio.Event()
        self._tasks: Tasks | None = None
        self._zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._reaper: Reaper | None = None
        if first is not None and not first.matches(self, session.session):
            # The configuration (a config file, options only traitlets read) asks for another one.
            self.log.info("the first worker started early is not the one configured: discarded (%s)", first)
            first.discard()
            first = None
        elif first is not None:
            self.log.info("generation 1 adopts what was started before the imports (%s)", type(first).__name__)
        self._first = first  # generation 1's target adopts it
        self._runtime_dir = first.runtime_dir if first is not None else tempfile.mkdtemp(prefix="klbr-")

    @property
    def current(self) -> Generation | None:
        """The generation that serves, or will once it has started (its succession's)."""
        return self.succession.current

    def ensure_started(self) -> None:
        """Called by the proxy when a request waits: start a generation if none is alive or starting."""
        self.succession.ensure_started()

    @property
    def _background(self) -> Tasks:
        """Where background work runs: made by `run` before any generation starts."""
        assert self._tasks is not None, "no background work before Supervisor.run"
        return self._tasks

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the first generation and serve until `shutdown` has ended them all."""
        self._reaper = Reaper.start(self._runtime_dir)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = self.cells.tasks = self.succession.tasks = Tasks(tg, self.log)
                self.rest.watch()
                self.host.start(host_endpoint(self._runtime_dir), self._zmq, self._reaper)
                self._launch(spare=False)  # first: the worker starts while the store opens
                self.store.open(uuid=self.session.session, **self._labels)
                await self._stopped.wait()
        finally:
            self.rest.close()
            self._reaper.close()
            self.host.close()
            self.store.close()
            shutil.rmtree(self._runtime_dir, ignore_errors=True)

    def _launch(self, *, spare: bool) -> Generation:
        number = next(self._numbers)
        early, self._first = self._first, None  # generation 1 adopts what was started early
        host = early.host_channel if early is not None and early.host_channel else host_environ(self._runtime_dir)
        assert self._reaper is not None, "run() starts the reaper before any generation"
        given = Given(number=number, runtime_dir=self._runtime_dir, reaper=self._reaper, context=self._zmq,
                      log=self.log, ssh=self.ssh, link_timeout=self.link_timeout, engines=self.engines,
                      client=self._host_client,
                      host_tcp=self.host.tcp, debugger=self.debugger)
        target = target_for(self.where, self.worker_kernel, session=self.session.clone(), given=given, early=early)
        gen = Generation(
            number, target=target, session=self.session, worker_args=self.worker_args,
            worker_options=self.worker_options, zmq_context=self._zmq, on_message=self._message,
            on_end=self.succession.ended, log=self.log, credentials=Credentials.from_environ(host), link_timeout=self.link_timeout,
            memory_limit=self.memory_limit_bytes)
        self.host.admit(gen, gen.credentials)
        self.succession.add(gen, spare=spare)
        self._background.start(self._bring_up(gen), f"starting generation {number}")
        return gen

    async def _bring_up(self, gen: Generation) -> None:
        try:
            # Checked first as `%klbr placement` checks: the configured placement, and again after
            # a failed start (the failure then names what is missing, not just the worker's exit).
            first = gen.number == 1 or self.succession.state is SupervisorState.START_FAILED
            started = await gen.start(self.startup_timeout, self._check(gen.placement) if first else None)
        except Exception:
            # A bug here must cost one generation, not the kernel: it ends as a failed start.
            self.log.exception("generation %d: start failed", gen.number)
            await gen.stop(EndReason.START_FAILED, self.kill_grace)
            return
        if not started:
            return  # its end has been dealt with (`Succession.ended`)
        succession = self.succession
        if succession.state is SupervisorState.STOPPING:
            await gen.stop(EndReason.SHUTDOWN, self.kill_grace)
        elif gen is succession.current:
            succession.set_state(SupervisorState.SERVING, f"generation {gen.number} serves")
            self._record_start(gen)
            self.listener.generation_ready(gen)
            # Warm the spare a moment later: started at once, its imports compete for the CPU with
            # the first cells, which the user is waiting for (start -> first cell).
            asyncio.get_running_loop().call_later(self.standby_delay, succession.ensure_spare)
        # A spare stays ready, unused, until `Succession.takeover`.

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
        self.succession.resume("restart")
        gen = self.current
        self.store.event("restart", {"generation": gen.number if gen else None})
        if gen is not None and gen.ending is None:
            await gen.stop(EndReason.RESTART, self.kill_grace)  # its end hands over to the spare
        else:
            self.succession.takeover()

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
        self.succession.resume("placement")
        self.store.event("placement", {"from": before.spec, "to": target.spec,
                                       "generation": old.number if old else None})
        self.log.info("placement %s -> %s", before, target)
        self.succession.stop_spare()  # it waits on the old placement
        if old is not None and old.ending is None:
            await old.stop(EndReason.RELOCATED, self.kill_grace)  # its end starts the new one
        else:
            self.succession.takeover()
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
        self.succession.set_state(SupervisorState.STOPPING, "shutdown")
        self.host.shutdown()  # its commands end too: `run` waits for their tasks
        try:
            await asyncio.gather(*(g.stop(EndReason.SHUTDOWN, self.kill_grace) for g in list(self.succession.live)))
        finally:
            self._stopped.set()  # nothing respawns; the reaper takes whatever is left

    # -- requests ----------------------------------------------------------------------------------

    def send(self, channel: str, frames: Frames) -> bool:
        """Send to the current generation; False when there is none ready. On stdin (an
        input_reply), the running cell's deadline runs again."""
        gen = self.current
        if channel == "stdin":
            self.cells.waiting_for_input(False)
        return gen is not None and gen.alive and gen.send(channel, frames)

    def send_execute(self, frames: Frames, *, msg_id: str, code: str, counts: bool, timeout: float | None,
                     cell_id: int | None = None, sync: tuple[int, dict[int, str]] | None = None,
                     silent: bool = False) -> RunningCell | None:
        """Send an execute; `sync` first, if the worker is to continue after another count.

        `counts` is whether the execute takes an execution count (store_history and not silent),
        `silent` whether it is silent (its worker publishes no execute_input: see `CellWatch`);
        `timeout` a per-cell deadline; `cell_id` its row in the store; `sync` (last count, `In[n]`
        texts the worker never saw) what the generation's `sync_count` tells it, the driver's to
        decide (it knows what the frontend was shown; the generation's `next_count` says where its
        worker goes on). The worker runs shell messages in order, so the silent sync always runs
        first. From here until its reply and idle, a loss of the worker is this cell's: returns it
        as the supervisor watches it (its deadline, whether the deadline's interrupt hit it), or
        None when there is no generation to send to.
        """
        gen = self.current
        if gen is None or not gen.alive:
            return None
        if sync is not None:
            gen.sync_count(*sync)
        cell = self.cells.sent(msg_id, code, gen, timeout, cell_id, counts, silent)
        self.rest.cell_sent()
        if gen.memory is not None:
            gen.memory.cell_started()
        return cell if gen.send("shell", frames) else None

    def _cell_finished(self, cell: RunningCell) -> None:
        self.host.cell_ended(cell, stopping=self.succession.state is SupervisorState.STOPPING)

    def start_task(self, work: Coroutine[Any, Any, Any], what: str,
                   on_error: Callable[[Exception], None] | None = None) -> None:
        """Background work of the supervisor's side services (a host command), failure logged."""
        self._background.start(work, what, on_error)

    def refusal(self, code: str | None) -> Refusal | None:
        """Why a request must not run now, if it must not: the restart budget is spent or the link
        lost (nothing can run until the user says), or `code` (an execute's) killed its worker too
        often in a row."""
        succession = self.succession
        if succession.current is None and succession.refusal is not None:
            return succession.refusal
        if code is not None and self.policy.is_poisoned(code):
            return Refusal("poisoned", self.policy.poison_count())
        return None

    async def interrupt(self) -> None:
        """Interrupt the current generation (once its cell has begun: `CellWatch.interrupt`); kill it if
        its cell has not ended within the grace."""
        gen = self.current
        if gen is None or not gen.alive:
            return
        self.store.event("interrupt", {"generation": gen.number})
        await self.cells.interrupt(gen)

    def notebook_moved(self, path: str) -> None:
        """The notebook this session serves is at `path` now (the driver was told: a rename, a move,
        a save-as): the store files the session under it, and the host service's values and
        workspace follow it."""
        if path == self.notebook:
            return
        old, self.notebook = self.notebook, path
        self.log.info("the notebook moved: %s -> %s", old, path)
        self.store.notebook_moved(old, path)

    def set_memory_limit(self, limit: str) -> None:
        """`%klbr memory LIMIT`: the next generation's worker gets `limit` (as `memory_limit` takes
        it; a bad one raises `TraitError`); the current one keeps its own until it ends, and a
        spare started under the old limit is replaced."""
        before = self.memory_limit_bytes
        self.memory_limit = limit
        if self.memory_limit_bytes == before:
            return
        self.store.event("memory_limit", {"limit": self.memory_limit_bytes})
        if self.succession.spare is not None:
            self.succession.stop_spare()
            self.succession.ensure_spare()

    # -- status ------------------------------------------------------------------------------------

    def set_session_timeout(self, seconds: float) -> None:
        """`%klbr timeout SECONDS` (0 = none) for the cells that follow."""
        self.policy.session_timeout = seconds

    def status(self) -> dict[str, Any]:
        gen, refusal = self.current, self.succession.refusal
        stopped = {"placement_lost": "stopped: link lost", "crash_loop": "stopped: crash loop"}
        return {
            "generation": gen.number if gen else None,
            "pid": gen.pid if gen else None,
            "state": gen.state.shown if gen else stopped.get(refusal.reason if refusal else "", "none"),
            "uptime": gen.uptime if gen else None,
            "placement": self.where.spec,
            "standby": self._standby_shown(),
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
            "memory_limits": gen.target.limits_memory if gen else None,  # whether its placement applies one
            "debugger": self.debugger,  # as configured; what the worker has, its kernel_info says
        }

    def _standby_shown(self) -> str:
        """The spare's state for `%klbr status`: off, resting (an idle kernel's: `SpareRest`), none
        (not started yet, or taken over and not yet replaced), or the spare generation's state."""
        spare = self.succession.spare
        if not self.standby_on:
            return "off"
        if spare is not None:
            return spare.state.shown
        if self.rest.resting:
            rests = f"resting (no cell for {self.rest.after:g} s)"
            # Halted (a crash loop, a lost link), the next cell is refused: `%klbr restart` comes first.
            return rests if self.succession.state in HALTED else f"{rests}; the next cell starts it"
        return "none"

    # -- from generations --------------------------------------------------------------------------

    def _message(self, gen: Generation, channel: str, wire: Wire) -> None:
        if gen is self.current:
            self.cells.message(channel, wire)
            self.listener.worker_message(gen, channel, wire)

    def _record_start(self, gen: Generation) -> None:
        """`gen` serves from now on (a spare: it took over): noted on it, and in the store."""
        gen.serving_since = time.time()
        info = gen.kernel_info.get("language_info", {})
        identity = {**gen.identity(), "kernel": gen.kernel_name, "language": info.get("name")}
        self.store.generation_started(gen.number, gen.placement.spec, identity, gen.pid)
