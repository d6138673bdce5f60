"""One workbench generation: a worker kernel, the channels to it, its state, and how it ended.

Created and driven by the `Supervisor`. Messages the worker sends are handed, parsed, to the
supervisor's listener, except the generation's own bookkeeping: its readiness probe, the worker's
``iopub_welcome`` and ``starting`` status, and what it publishes about no request at all (start-up
noise such as debugpy's warnings), which goes to the kernel's log and the stderr tail instead
(DESIGN.md semantics 10). Every change of state goes through `_set_state`; the end is recorded once,
as an `Ending`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from .connection import CHANNELS, WorkerChannels
from .exits import describe_exit
from .host.channel import Credentials
from .counts import continue_code
from .launch import WorkerManager, popen_options, takes_ipykernel_options, worker_manager
from .placement import Placement, PlacementError
from .process import WorkerProcess
from .reaper import Reaper
from .identity import snapshot
from .link import LinkWatch, endpoint
from .readiness import Readiness
from .resign import Resigner
from .states import TRANSITIONS, Ending, EndReason, GenerationState
from .wire import Wire

MessageHandler = Callable[["Generation", str, Wire], None]
EndHandler = Callable[["Generation", Ending], None]

# How long the channels of a worker that exited may take to report their last byte read (a bound,
# not a wait: they report it within microseconds unless a process that escaped the group holds them).
DRAIN_BOUND = 2.0
# Published with no parent and still the frontend's business: the debugger's events.
_UNPARENTED_FOR_FRONTEND = frozenset({"debug_event"})


class Generation:
    """A worker and everything that dies with it."""

    def __init__(
        self,
        number: int,
        *,
        kernel_name: str,
        placement: Placement,
        session: Session,
        worker_args: tuple[str, ...] = (),
        runtime_dir: str,
        zmq_context: zmq.Context,
        reaper: Reaper,
        on_message: MessageHandler,
        on_end: EndHandler,
        log: logging.Logger,
        host: Credentials,
        link_timeout: float = 15.0,
    ):
        self.number = number
        self.host = host  # its worker's way back to the supervisor (`klbr_supervisor.host`)
        self._identity: dict | None = None
        self.kernel_name = kernel_name
        self.placement = placement
        self.state = GenerationState.STARTING
        self.ending: Ending | None = None
        self._process: WorkerProcess | None = None  # its process, once launched
        self._starting = False  # `start` is under way (it launches, or ends it, itself)
        self.started = time.time()
        # A worker elsewhere gets a key of its own, and its traffic is re-signed (`resign`).
        self._resigner: Resigner | None = None
        if not placement.shares_key:
            own = Session(key=os.urandom(32).hex().encode("ascii"), signature_scheme=session.signature_scheme,
                          username=session.username)
            self._resigner = Resigner(own, session)
            session = own
        self._session = session
        self._worker_args = worker_args
        self._runtime_dir = runtime_dir
        self._zmq = zmq_context
        self._reaper = reaper
        self._on_message = on_message
        self._on_end = on_end
        self.log = log
        self._km: WorkerManager | None = None
        self._channels = WorkerChannels(f"gen{number}", zmq_context, session, self._received,
                                        lambda: self._readiness.check(), log)
        self._readiness = Readiness(f"generation {number}", session, self._channels, log)
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        self._end_reason: EndReason | None = None
        self._drain_task: asyncio.Task | None = None
        # A worker that does not share the frontend's key may run elsewhere: its link is watched
        # (heartbeat, and every message it sends), and silence for `link_timeout` ends it LINK_LOST.
        self._link_timeout = link_timeout
        self._link: LinkWatch | None = None
        self._link_how: str | None = None
        self._lost_task: asyncio.Task | None = None
        self.next_count = 1  # the execution count the worker will give its next counted cell
        self.state_was_ready = False  # it served (as opposed to failing to start)

    def __repr__(self) -> str:
        return f"<Generation {self.number} pid={self.pid} {self.state.value}>"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, timeout: float, check=None) -> bool:
        """Launch the worker and wait until it serves (see `readiness`): True; False when it ended
        first (START_FAILED says why). `check`, awaited first, may raise a `PlacementError`: its text."""
        self._starting = True
        try:
            return await self._start(timeout, check)
        finally:
            self._starting = False

    async def _start(self, timeout: float, check) -> bool:
        if check is not None:
            try:
                await check
            except PlacementError as e:
                self._finish(Ending(EndReason.START_FAILED, None, f"could not be launched: {e}"))
                return False
        self._km = worker_manager(
            self.kernel_name,
            session=self._session,
            # Shadows the supervisor's context: no ZMQ threads of its own per generation.
            context=zmq.asyncio.Context.shadow(self._zmq.underlying),
            # ipc: local, faster than loopback tcp, and files only we can reach in our private dir
            transport="ipc",
            ip=os.path.join(self._runtime_dir, f"gen{self.number}"),
            connection_file=os.path.join(self._runtime_dir, f"worker-{self.number}.json"),
        )
        extra = []
        if self.shares_key and takes_ipykernel_options(self.kernel_name):
            # Same key and session id as the proxy: its messages go to the frontend untouched.
            extra = [f"--Session.session={self._session.session}", *self._worker_args]
        try:
            env = {**self.placement.environ(), **self.host.environ()}  # never argv: the key is a secret
            await self._km.start_kernel(extra_arguments=extra, env=env, **popen_options())
        except Exception as e:
            self.log.error("generation %d: could not launch %s: %s", self.number, self.kernel_name, e)
            await self._release_manager()
            self._finish(Ending(EndReason.START_FAILED, None, f"could not be launched: {e}"))
            return False
        provisioner = self._km.provisioner
        process = getattr(provisioner, "process", None)
        if process is None:
            self.log.error("generation %d: %s runs its kernel where klbr cannot watch it", self.number,
                           type(provisioner).__name__)
            await self._release_manager()
            self._finish(Ending(EndReason.START_FAILED, None,
                                f"could not be watched: its provisioner ({type(provisioner).__name__}) runs the "
                                "kernel in no local process, which this version of klbr does not supervise yet"))
            return False
        self._process = WorkerProcess(process, provisioner.pgid, self._reaper, self._process_exited)
        if self._end_reason is not None:
            # `stop` came while the launch was under way (a shutdown during start): it waits for
            # the exit, so make it happen.
            self._process.killpg(signal.SIGKILL)
            await self._ended
            return False
        info = self._km.get_connection_info()
        self._channels.connect({name: endpoint(info, name) for name in CHANNELS})
        self._readiness.probe()
        ready = self._readiness.ready
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({ready, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.log.error("generation %d: not ready after %.0f s", self.number, timeout)
            await self.stop(EndReason.START_FAILED)
            return False
        if not ready.done() or ready.cancelled() or self.state is not GenerationState.STARTING:
            return False  # it died, or `stop` is ending it (a shutdown while it started)
        self._set_state(GenerationState.READY, "answered kernel_info")
        self.state_was_ready = True
        if not self.shares_key and self._link_timeout > 0:  # from now on, silence is a lost link
            self._link = LinkWatch(f"gen{self.number}", self._zmq, endpoint(info, "hb"), self._link_timeout,
                                   self._link_lost)
        return True

    def sync_count(self, last_count: int, texts: dict[int, str]) -> None:
        """Make the worker's next execution count `last_count + 1`, `In` padded to match.

        A silent execute the frontend never sees, sent just before the execute that needs it (the
        worker serves shell messages in order). `texts` fills `In[n]` for cells the worker never
        saw (answered by the proxy); other gaps are empty strings. IPython workers only.
        """
        if self.kernel_info.get("language_info", {}).get("name") != "python":
            return
        self._readiness.send_own(self._session.msg("execute_request", {
            "code": continue_code(last_count, texts), "silent": True, "store_history": False,
            "user_expressions": {}, "allow_stdin": False}))
        self.next_count = last_count + 1

    def closing(self, reason: EndReason) -> None:
        """From now on it takes no more requests (`alive` is False); `stop` follows."""
        if self._end_reason is None:
            self._end_reason = reason
        if self.state not in (GenerationState.ENDING, GenerationState.ENDED):
            self._set_state(GenerationState.ENDING, reason.value)

    async def stop(self, reason: EndReason, grace: float = 1.0) -> Ending:
        """End the generation: SIGTERM to its process group, SIGKILL after `grace` seconds."""
        self.closing(reason)
        if self._process is None and not self._starting:
            # Never launched, and no start under way that would launch it (one that raised)
            self._finish(Ending(reason, None, "ended before its worker was launched"))
        if self._process is not None and not self._exited.done():
            self._process.killpg(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(self._exited)
            except TimeoutError:
                self._process.killpg(signal.SIGKILL)
                await self._exited
        return await asyncio.shield(self._ended)

    async def interrupt(self) -> None:
        """Interrupt as the kernelspec says (SIGINT to the group, or a control interrupt_request)."""
        if self._km is not None and self.state not in (GenerationState.ENDING, GenerationState.ENDED):
            await self._km.interrupt_kernel()

    def send(self, channel: str, frames: list) -> bool:
        if self.state in (GenerationState.ENDING, GenerationState.ENDED):
            return False
        if self._resigner is not None:
            frames = self._resigner.to_worker(frames)
        return self._channels.send(channel, frames)

    async def wait_started(self) -> bool:
        """Until it serves (True) or has ended without serving (False)."""
        await asyncio.wait({self._readiness.ready, self._ended}, return_when=asyncio.FIRST_COMPLETED)
        return self.state_was_ready and self.ending is None

    def mark_busy(self, busy: bool) -> None:
        """Called by the supervisor as cells start and finish on this generation."""
        if busy and self.state is GenerationState.READY:
            self._set_state(GenerationState.BUSY, "cell running")
        elif not busy and self.state is GenerationState.BUSY:
            self._set_state(GenerationState.READY, "cell done")

    def identity(self) -> dict:
        """What and where the worker runs (hostname, platform, arch, interpreter and its version,
        pid, cwd), taken once it serves: `host.inspect`, `%klbr status`, the generations table."""
        if self._identity is None and self.pid is not None and self.state_was_ready:
            self._identity = snapshot(self.pid, self.kernel_info)
        return dict(self._identity or {"pid": self.pid})

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def kernel_info(self) -> dict:
        """The worker's kernel_info reply (its language_info), once it has answered."""
        return self._readiness.kernel_info

    @property
    def alive(self) -> bool:
        return self.state in (GenerationState.READY, GenerationState.BUSY)

    @property
    def uptime(self) -> float:
        return time.time() - self.started

    # -- internals ---------------------------------------------------------------------------------

    @property
    def shares_key(self) -> bool:
        """Whether its worker signs with the frontend's key (else its traffic is re-signed)."""
        return self._resigner is None

    # -- the link to a worker elsewhere ------------------------------------------------------------

    def _link_lost(self, silent: float) -> None:
        """No word for `link_timeout`, and no exit reported: the outcome of what it ran is unknown.
        What it can still be reached by ends it (its process group here, its provisioner's kill)."""
        self._link_how = (f"no word from {self.placement} for {silent:.0f} s (Supervisor.link_timeout is "
                          f"{self._link_timeout:g} s) and no exit reported")
        if self.state in (GenerationState.ENDING, GenerationState.ENDED):
            return  # ending anyway (a restart, an exit): silence now says nothing
        self.log.error("generation %d (pid %s): %s", self.number, self.pid, self._link_how)
        self.closing(EndReason.LINK_LOST)
        self._lost_task = self._loop.create_task(self._end_lost_link())

    async def _end_lost_link(self) -> None:
        self._channels.deliver_queued()  # what it said before falling silent still counts
        if self._process is not None:
            self._process.killpg(signal.SIGKILL)  # its exit then ends it, with the link's words
            return
        try:
            async with asyncio.timeout(10):
                await self._km.provisioner.kill(restart=False)
        except Exception as e:
            self.log.warning("generation %d: its provisioner could not kill it: %s", self.number, e)
        self._finish(Ending(EndReason.LINK_LOST, None, self._link_how))

    def _received(self, channel: str, frames: list) -> None:
        try:
            if self._resigner is not None:
                frames = self._resigner.from_worker(frames)
            wire = Wire.parse(frames)
            if self._link is not None:
                self._link.heard()  # a message its key signed: word from it
        except ValueError as e:  # MalformedMessage, a bad signature, an undecodable header
            self.log.warning("generation %d: malformed %s message dropped: %s", self.number, channel, e)
            return
        if self.state is GenerationState.ENDED:
            return  # a stale generation has no voice
        own = self._readiness.own_ids
        if channel == "iopub":
            self._readiness.iopub()
            if wire.parent_id in own or wire.msg_type == "iopub_welcome":
                return
            if not wire.parent_id and wire.msg_type not in _UNPARENTED_FOR_FRONTEND:
                self._own_news(wire)
                return
        elif wire.parent_id in own:
            self._readiness.reply(wire)
            return
        self._on_message(self, channel, wire)

    def _own_news(self, wire: Wire) -> None:
        """Published about no request (the `starting` status, start-up stderr): not the frontend's."""
        if wire.msg_type != "stream":
            return
        text = wire.content.get("text", "")
        if isinstance(text, str) and text:
            self.log.info("generation %d (pid %s) printed: %s", self.number, self.pid, text.rstrip())
            if self._process is not None and self._process.stderr is not None:
                self._process.stderr.keep(text.encode("utf-8", "replace"))

    def _process_exited(self, returncode: int) -> None:
        """The worker process has ended (and what it started was killed): drain, then record the end."""
        self._exited.set_result(returncode)
        if self.state in (GenerationState.READY, GenerationState.BUSY):
            self._set_state(GenerationState.ENDING, describe_exit(returncode))
        # Held: the loop keeps only weak references to tasks.
        self._drain_task = self._loop.create_task(self._drain_then_finish(returncode))

    async def _drain_then_finish(self, returncode: int) -> None:
        # Everything the worker sent is delivered before anyone hears of the end (semantics 7).
        await self._channels.drain(DRAIN_BOUND)
        tail = self._process.tail()
        if self._end_reason is not None:
            reason = self._end_reason
        elif self.state is GenerationState.STARTING:
            reason = EndReason.START_FAILED
        else:
            reason = EndReason.LOST
        await self._release_manager()
        how = self._link_how if reason is EndReason.LINK_LOST and self._link_how else describe_exit(returncode)
        self._finish(Ending(reason, returncode, how, tail))

    async def _release_manager(self) -> None:
        """The manager's connection file, ipc files and control socket go with the generation."""
        if self._km is None:
            return
        try:
            await self._km.cleanup_resources()
        except Exception:
            self.log.exception("generation %d: cleaning up its kernel manager failed", self.number)

    def _finish(self, ending: Ending) -> None:
        if self.state is GenerationState.ENDED:
            return
        self.ending = ending
        self._set_state(GenerationState.ENDED, f"{ending.reason.value}: {ending.how}")
        self._channels.close()
        if self._link is not None:
            self._link.close()
        if self._process is not None:
            self._process.close()  # whatever the worker started goes with it
        self._readiness.cancel()
        self._ended.set_result(ending)
        self._on_end(self, ending)

    def _set_state(self, new: GenerationState, why: str) -> None:
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"generation {self.number}: {self.state.value} -> {new.value} is not allowed")
        # busy <-> ready happens per cell: at debug level, and without building a record otherwise
        level = logging.DEBUG if {self.state, new} == {GenerationState.READY, GenerationState.BUSY} else logging.INFO
        if self.log.isEnabledFor(level):
            self.log.log(level, "generation %d (pid %s): %s -> %s (%s)", self.number, self.pid, self.state.value, new.value, why)
        self.state = new

