"""The supervisor: starts workbench generations, ends them when they must end, and replaces them.

Driven by the proxy (or a test) through `send`, `send_execute`, `cells` (the running cell: busy,
input, finished), `interrupt`, `restart` and `shutdown`; it reports back through a `WorkerListener`.
It never sees a frontend. Decisions (ladder, deadlines, budget, poison, refusals, retries) are the
`Policy`'s; this class and `CellWatch` carry them out.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile

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
from .settings import SupervisorSettings
from .states import Ending, EndReason
from .store import Store
from .targets import Given, check, kind_for, target_for
from .tasks import Tasks
from .wire import Wire

# Endings that count against the restart budget: the worker went away without being asked to.
_AUTOMATIC = frozenset({EndReason.LOST, EndReason.KILLED, EndReason.DEADLINE})


class Supervisor(SupervisorSettings):
    """Configured as `Supervisor.*` (see `settings`)."""

    def __init__(self, listener: WorkerListener, *, session: Session, notebook: str | None = None,
                 kernel_name: str | None = None, worker_options: tuple[str, ...] = (),
                 first: Early | None = None, **kwargs):
        """`session` carries the key, signature scheme and session id the workers share with the proxy;
        `notebook` and `kernel_name` label this session in the store; `worker_options` go on every
        worker's command line (`SupervisorSettings.worker_options`); `first` is what `boot.prelaunch`
        started before the imports, which generation 1 adopts if it is what is configured."""
        super().__init__(**kwargs)
        self.worker_options = tuple(worker_options)
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
        # Where generations run now; a spec that names no placement fails the first start, loudly
        # (never a silent fallback to local).
        self._bad_placement: str | None = None
        self._start_failed = False  # the last generation never served
        try:
            self.where: Placement = parse(self.placement)
        except PlacementError as e:
            self.where, self._bad_placement = Placement(self.placement, "invalid"), str(e)
        self.current: Generation | None = None
        self.spare: Generation | None = None
        # Generations not yet ended (current, spare, and any being stopped); an ended one is let go
        # of, and only its row in the store remains (issue I, defect 12).
        self._live: set[Generation] = set()
        self._numbers = itertools.count(1)
        self.crash_loop: int | None = None  # restarts used when the budget ran out
        self.link_lost: str | None = None  # how the link was lost; nothing starts until asked
        self.counts = ExecutionCounts()
        self.cells = CellWatch(self.policy, self.kill_grace, self.log, self._cell_finished)
        self.host = HostService(self, parent=self)
        self._stopping = False
        self._ending = False  # inside listener.generation_ended: the replacement is decided already
        self._stopped = asyncio.Event()
        self._tasks: Tasks | None = None
        self._zmq = zmq.Context.instance()
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
        given = Given(number=number, runtime_dir=self._runtime_dir, reaper=self._reaper, context=self._zmq,
                      log=self.log, ssh=self.ssh, link_timeout=self.link_timeout)
        target = target_for(self.where, self.worker_kernel, session=self.session.clone(), given=given, early=early)
        gen = Generation(
            number, target=target, session=self.session, worker_args=self.worker_args,
            worker_options=self.worker_options, zmq_context=self._zmq, on_message=self._message,
            on_end=self._ended, log=self.log, host=Credentials.from_environ(host), link_timeout=self.link_timeout)
        self.host.admit(gen, gen.host)
        self._live.add(gen)
        if spare:
            self.spare = gen
        else:
            self.current = gen
        self._tasks.start(self._bring_up(gen), f"starting generation {number}")
        return gen

    async def _bring_up(self, gen: Generation) -> None:
        try:
            # Checked first as `%klbr placement` checks: the configured placement, and again after
            # a failed start (the failure then names what is missing, not just the worker's exit).
            first = gen.number == 1 or self._bad_placement is not None or self._start_failed
            started = await gen.start(self.startup_timeout, self._check(gen.placement) if first else None)
        except Exception:
            # A bug here must cost one generation, not the kernel: it ends as a failed start.
            self.log.exception("generation %d: start failed", gen.number)
            await gen.stop(EndReason.START_FAILED, self.kill_grace)
            return
        if not started:
            return  # `_ended` has dealt with it
        if self._stopping:
            await gen.stop(EndReason.SHUTDOWN, self.kill_grace)
        elif gen is self.current:
            self._start_failed = False
            self._record_start(gen)
            self.listener.generation_ready(gen)
            # Warm the spare a moment later: started at once, its imports compete for the CPU with
            # the first cells, which the user is waiting for (start -> first cell, issue F).
            asyncio.get_running_loop().call_later(self.standby_delay, self._ensure_spare)
        # A spare stays ready, unused, until `_takeover`.

    async def _check(self, placement: Placement) -> None:
        """The configured first placement, checked as `%klbr placement` checks a new one (ssh://'s
        launch says the same itself: checked apart, it would cost a second connection to the host
        at every start)."""
        if self._bad_placement is not None:
            raise PlacementError(self._bad_placement)
        kind = kind_for(placement, self.worker_kernel)
        if not kind.checked_by_launch:
            await kind.check(placement, self.ssh)

    def _ensure_spare(self) -> None:
        if self.standby_on and self.spare is None and not self._stopping and self.crash_loop is None:
            self._launch(spare=True)

    def _takeover(self) -> None:
        """Make the spare current (at once if it is ready), or start a new generation."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self.current = spare
            if spare.alive:
                self._record_start(spare)
                self.listener.generation_ready(spare)
                self._ensure_spare()
            # else: still starting; `_bring_up` announces it, since it is current now
        else:
            self._launch(spare=False)

    def ensure_started(self) -> None:
        """Called by the proxy when a request waits: start a generation if none is alive or starting."""
        if (self.current is None and not self._stopping and self.crash_loop is None and self.link_lost is None
                and not self._ending):
            self._takeover()

    async def restart(self) -> None:
        """`%klbr restart`: a new generation now; the budget, a crash loop and poison start over."""
        self.policy.reset_restarts()
        self.policy.clear_poison()
        self.crash_loop = self.link_lost = None
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
            await check(target, self.ssh, self.worker_kernel)
        old, before = self.current, self.where
        self.where, self._bad_placement = target, None
        self.policy.reset_restarts()
        self.crash_loop = self.link_lost = None
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
        self._stopping = True
        self.host.shutdown()  # its commands end too: `run` waits for their tasks
        try:
            await asyncio.gather(*(g.stop(EndReason.SHUTDOWN, self.kill_grace) for g in list(self._live)))
        finally:
            self._stopped.set()  # nothing respawns; the reaper takes whatever is left

    # -- requests ----------------------------------------------------------------------------------

    def send(self, channel: str, frames: list) -> bool:
        """Send to the current generation; False when there is none ready."""
        gen = self.current
        return gen is not None and gen.alive and gen.send(channel, frames)

    def send_execute(self, frames: list, *, msg_id: str, code: str, counts: bool, timeout: float | None,
                     cell_id: int | None = None) -> bool:
        """Send an execute; first tell the worker where the count continues, if it does not know.

        `counts` is whether the execute takes an execution count (store_history and not silent);
        `timeout` a per-cell deadline; `cell_id` its row in the store. The worker runs shell messages in order, so the silent sync
        always runs first. From here until `cells.finished`, a loss of the worker is this cell's.
        """
        gen = self.current
        if gen is None or not gen.alive:
            return False
        if counts:
            if gen.next_count != self.counts.last + 1:
                gen.sync_count(self.counts.last, self.counts.catch_up())
            self.counts.reserve(msg_id)
        self.cells.sent(msg_id, code, gen, timeout, cell_id)
        return gen.send("shell", frames)

    def worker_count(self, count: int) -> None:
        """The current worker gave a cell `count` (its reply said so)."""
        self.counts.from_worker(count)
        if self.current is not None:
            self.current.next_count = count + 1

    def _cell_finished(self, cell) -> None:
        self.host.cell_ended(cell, stopping=self._stopping)

    def start_task(self, work, what: str, on_error=None) -> None:
        """Background work of the supervisor's side services (a host command), failure logged."""
        self._tasks.start(work, what, on_error)

    def refusal(self, code: str | None) -> Refusal | None:
        """Why a request must not run now, if it must not: the restart budget is spent (nothing can
        run until `%klbr restart`), or `code` (an execute's) killed its worker too often in a row."""
        if self.current is None and self.link_lost is not None:
            return Refusal("placement_lost", 0, detail=self.link_lost)
        if self.current is None and self.crash_loop is not None:
            return Refusal("crash_loop", self.crash_loop, self.restart_window)
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

    def status(self) -> dict:
        gen, spare = self.current, self.spare
        return {
            "generation": gen.number if gen else None,
            "pid": gen.pid if gen else None,
            "state": gen.state.shown if gen else ("stopped: link lost" if self.link_lost is not None
                                                  else "stopped: crash loop" if self.crash_loop is not None else "none"),
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
        }

    # -- from generations --------------------------------------------------------------------------

    def _message(self, gen: Generation, channel: str, wire: Wire) -> None:
        if gen is self.current:
            self.listener.worker_message(gen, channel, wire)

    def _record_start(self, gen: Generation) -> None:
        info = gen.kernel_info.get("language_info", {})
        identity = {**gen.identity(), "kernel": gen.kernel_name, "language": info.get("name")}
        self.store.generation_started(gen.number, gen.placement.spec, identity, gen.pid)

    def _ended(self, gen: Generation, ending: Ending) -> None:
        # Asked for (a shutdown, a restart): news, not a warning in the server's log at every exit.
        asked = ending.reason in (EndReason.SHUTDOWN, EndReason.RESTART, EndReason.RELOCATED)
        (self.log.info if asked else self.log.warning)(
            "generation %d (pid %s) ended: %s, %s", gen.number, gen.pid, ending.reason.value, ending.how)
        self._live.discard(gen)
        self.host.retire(gen.host)
        if ending.reason is EndReason.START_FAILED and gen is self.current:
            self._start_failed = True
        if gen.served:
            self.store.generation_ended(gen.number, f"{ending.reason.value}: {ending.how}")
        if gen is self.spare:
            self.spare = None  # replaced at the next takeover, not in a loop now
            return
        if gen is not self.current:
            return
        self.cells.ended(gen, ending.reason)
        self.current = None
        # Decide before telling the proxy, so it can answer what waits (a crash loop, a failed start).
        replace = not self._stopping and ending.reason not in (EndReason.START_FAILED, EndReason.LINK_LOST)
        if ending.reason is EndReason.LINK_LOST:
            # Never a second kernel while the first may still run, never a silent fallback: the
            # user says what next (`%klbr reconnect`, `%klbr placement`).
            self.link_lost = f"{gen.placement}: {ending.how}"
            self.store.event("link_lost", {"generation": gen.number, "placement": gen.placement.spec,
                                           "how": ending.how})
            self._stop_spare()
        if replace and ending.reason in _AUTOMATIC:
            if self.policy.may_restart():
                self.policy.note_restart()
            else:
                replace = False
                self.crash_loop = self.policy.restarts_in_window()
                self.log.error("%d new generations in %.0f s: not starting another until %%klbr restart",
                               self.crash_loop, self.restart_window)
                self._stop_spare()
        self._ending = True
        try:
            self.listener.generation_ended(gen, ending)
        finally:
            self._ending = False
        if replace:
            self._takeover()
        # A failed start is retried by the next request (`ensure_started`), never in a loop.

    def _stop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self._tasks.start(spare.stop(EndReason.SHUTDOWN, self.kill_grace), "stopping the spare")
