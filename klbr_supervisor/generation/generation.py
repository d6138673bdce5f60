"""One workbench generation: a worker on its target, the channels to it, its state, and how it ended.

Created and driven by the `Supervisor`. Messages the worker sends are handed, parsed, to the
supervisor's listener, except the generation's own bookkeeping (`traffic`). Every change of state
goes through `_set_state` (`states.TRANSITIONS`); every end passes ENDING, where a `Closing` holds
its reason, decided once, and is recorded once, as an `Ending`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
from jupyter_client.session import Session

from ..boot.placement import Placement, PlacementError
from ..boot.worker import MEMORY_LIMIT
from ..counts import continue_code
from ..exits import describe_exit
from ..host.channel import Credentials
from ..memory import MemoryWatch, verdict
from ..messages.protocol import Frames
from ..messages.wire import Wire
from ..states import ALIVE, TRANSITIONS, Ending, EndReason, GenerationState
from ..targets.base import LaunchError, Target
from .channels import CHANNELS, WorkerChannels
from .closing import Closing
from .identity import ask_identity, snapshot
from .link import LinkWatch, endpoint
from .readiness import Readiness
from .resign import Resigner, take_key
from .sequence import Sequence
from .traffic import Traffic

MessageHandler = Callable[["Generation", str, Wire], None]
EndHandler = Callable[["Generation", Ending], None]

# How long the channels of a worker that exited may take to report their last byte read (a bound,
# not a wait: they report it within microseconds unless a process that escaped the group holds them).
DRAIN_BOUND = 2.0
_OVER = frozenset({GenerationState.ENDING, GenerationState.ENDED})


class Generation:
    """A worker and everything that dies with it."""

    def __init__(self, number: int, *, target: Target, session: Session, worker_args: tuple[str, ...] = (),
                 worker_options: tuple[str, ...] = (), zmq_context: zmq.Context[zmq.Socket[bytes]],
                 on_message: MessageHandler, on_end: EndHandler, log: logging.Logger, credentials: Credentials,
                 link_timeout: float = 15.0,
                 memory_limit: int | None = None):
        """`session` is the proxy's (its worker's, when the target shares the key); `worker_args`
        klbr's own options for an ipykernel it starts, `worker_options` the user's, for any worker;
        `memory_limit` bytes its worker may allocate, where the target's worker sets it itself."""
        self.number = number
        self.credentials = credentials  # its worker's host channel back to the supervisor (`klbr_supervisor.host`)
        self.target = target
        self.state = GenerationState.NEW
        self.ending: Ending | None = None
        self._closing: Closing | None = None  # from ENDING on
        self.started = time.time()
        self.serving_since: float | None = None  # the supervisor's: when it began to serve (a spare: at takeover)
        self._proxy_session = session.session  # what its worker is started with, key shared or not
        self._session = target.session
        self._worker_args = worker_args
        self._worker_options = worker_options
        self._zmq = zmq_context
        self._on_end = on_end
        self.log = log
        self._identity: dict[str, Any] | None = None
        self._channels = WorkerChannels(f"gen{number}", zmq_context, self._session, log)
        self._readiness = Readiness(f"generation {number}", self._session, self._channels, log)
        # A worker elsewhere gets a key of its own, and its traffic is re-signed (`resign`).
        resigner = None if target.shares_key else Resigner(target.session, session)
        self._traffic = Traffic(self, self._readiness, resigner, on_message,
                                Sequence() if target.drops_iopub else None)
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int | None] = self._loop.create_future()
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        # Once it serves, its identity asked (of a worker elsewhere): `wait_started` reads it whole.
        self._served: asyncio.Future[None] = self._loop.create_future()
        self._drain_task: asyncio.Task[None] | None = None
        # A worker that does not share the frontend's key may run elsewhere: its link is watched
        # (heartbeat, and every message it sends), and silence for `link_timeout` ends it LINK_LOST.
        self._link_timeout = link_timeout
        self._link: LinkWatch | None = None
        self._lost_task: asyncio.Task[None] | None = None
        self.next_count = 1  # the execution count the worker will give its next counted cell
        self.memory_limit = memory_limit if target.limits_memory else None
        # Its worker's memory, sampled from the time it serves, when it runs on this machine.
        self.memory: MemoryWatch | None = None

    def __repr__(self) -> str:
        return f"<Generation {self.number} pid={self.pid} {self.state.value}>"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, timeout: float, check: Coroutine[Any, Any, None] | None = None) -> bool:
        """Launch the worker and wait until it serves (see `readiness`): True; False when it ended
        first (START_FAILED says why). `check`, awaited first, may raise a `PlacementError`: its text."""
        if self.state is not GenerationState.NEW:  # stopped before its start began (a spare not wanted)
            if check is not None:
                check.close()
            return False
        self._set_state(GenerationState.LAUNCHING, f"on {self.placement}")
        launched = False  # whether anything may run that its exit must end
        try:
            if check is not None:
                try:
                    await check
                except PlacementError as e:
                    return self._failed(f"could not be launched: {e}")
            if not self._still(GenerationState.LAUNCHING):  # `stop` came while it was checked
                return self._failed("ended before its worker was launched")
            launched = True
            return await self._launch(timeout)
        except Exception:
            # A bug here costs this generation: its caller stops it, and what never launched ends now.
            self._close(EndReason.START_FAILED, "its start failed")
            if not launched:
                self._finish(self._closed.now("ended before its worker was launched"))
            raise

    async def _launch(self, timeout: float) -> bool:
        target = self.target
        deadline = self._loop.time() + timeout
        # The proxy's session id (and key, when shared: its messages go on untouched); the user's options.
        extra = target.arguments(self._proxy_session, self._worker_args, self._worker_options)
        self.log.debug("generation %d: %s with %s", self.number, target.kernel_name, extra)
        env = target.environment(self.credentials.environ())
        if self.memory_limit:
            env[MEMORY_LIMIT] = str(self.memory_limit)
        try:
            async with asyncio.timeout_at(deadline):
                info = await target.launch(extra, env, self._process_exited)
        except (LaunchError, TimeoutError) as e:
            why = (f"was not launched within {timeout:.0f} s" if isinstance(e, TimeoutError)
                   else f"could not be launched: {e}")
            self.log.error("generation %d: %s %s", self.number, target.kernel_name, why)
            target.signal(signal.SIGKILL)
            return self._failed(why, target.tail())
        if not self._still(GenerationState.LAUNCHING):
            # Ended while its launch was under way (a shutdown during start; an exit as it reported):
            # `stop` waits for the exit, so make it happen.
            if not self._exited.done():
                target.signal(signal.SIGKILL)
            await asyncio.shield(self._ended)
            return False
        self._set_state(GenerationState.STARTING, "launched")
        if not target.shares_key:
            take_key(self._session, info)
        server_key = str(info.get("curve_publickey") or "")  # a worker that serves CurveZMQ (jupyter_client's name)
        self._channels.connect({name: endpoint(info, name) for name in CHANNELS}, self._traffic.received,
                               self._readiness.check, server_key)
        self._readiness.probe()
        ready = self._readiness.ready
        try:
            async with asyncio.timeout_at(deadline):
                either: set[asyncio.Future[Any]] = {ready, self._exited}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.log.error("generation %d: not ready after %.0f s", self.number, timeout)
            await self.stop(EndReason.START_FAILED)
            return False
        if not self._still(GenerationState.STARTING) or not ready.done() or ready.cancelled():
            return False  # it died, or `stop` is ending it (a shutdown while it started)
        if target.asks_identity:
            self._identity = await ask_identity(self._readiness, self._session)
            if not self._still(GenerationState.STARTING):
                return False
        self._set_state(GenerationState.READY, "answered kernel_info")
        if not target.remote and self.pid is not None and not self._exited.done():
            self.memory = MemoryWatch(self.pid, self.memory_limit)
        self._served.set_result(None)
        if not target.shares_key and self._link_timeout > 0:  # from now on, silence is a lost link
            self._link = LinkWatch(f"gen{self.number}", self._zmq, endpoint(info, "hb"), self._link_timeout,
                                   self._link_lost, server_key)
            self._traffic.heard = self._link.heard  # a message its key signed is word from it too
        return True

    def _failed(self, why: str, tail: str = "") -> bool:
        """It ends before it served, with no exit to wait for."""
        self._close(EndReason.START_FAILED, why)
        self._finish(self._closed.now(why, tail))
        return False

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
        self._close(reason, reason.value)

    async def stop(self, reason: EndReason, grace: float = 1.0) -> Ending:
        """End the generation: SIGTERM to its process group, SIGKILL after `grace` seconds."""
        never_started = self.state is GenerationState.NEW
        self.closing(reason)
        if never_started:
            self._finish(self._closed.now("ended before its worker was launched"))
        elif not self._exited.done() and not self._ended.done():
            # (Before its launch, a signal does nothing: its start ends it, once it sees ENDING.)
            self.target.signal(signal.SIGTERM)
            either: set[asyncio.Future[Any]] = {self._exited, self._ended}
            await asyncio.wait(either, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            if not self._exited.done() and not self._ended.done():
                self.target.signal(signal.SIGKILL)
        return await asyncio.shield(self._ended)

    async def interrupt(self) -> None:
        """Interrupt as the kernelspec says (SIGINT to the group, or a control interrupt_request)."""
        if self.state in (GenerationState.STARTING, *ALIVE):
            await self.target.interrupt()
            if self.target.interrupts_by_message and self._traffic.sequence is not None:
                self._traffic.sequence.elsewhere()

    @property
    def counts_drops(self) -> bool:
        """Whether its worker's iopub may drop, and so its message numbers are counted (`sequence`)."""
        return self._traffic.sequence is not None

    def dropped_before(self, msg_id: str | None, awaited: int, request: str = "") -> int:
        """How many messages its worker made before `msg_id` (the idle that ends `request`; None:
        the newest that came) never came: what its iopub dropped, where it may (see `sequence`); 0
        for klbr's own workers. `awaited`: replies to other requests still on their way; the
        generation's own (the execution-count sync after a cell) are added here: a reply on shell
        can come after the next cell's idle on iopub."""
        sequence = self._traffic.sequence
        if sequence is None:
            return 0
        return sequence.dropped_before(msg_id, awaited + len(self._readiness.unanswered), request)

    def send(self, channel: str, frames: Frames) -> bool:
        if self.state in _OVER:
            return False
        return self._channels.send(channel, self._traffic.outgoing(frames))

    async def wait_started(self) -> bool:
        """Until it serves, its identity known (True), or has ended without serving (False)."""
        either: set[asyncio.Future[Any]] = {self._served, self._ended}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        return self.served and self.ending is None

    def mark_busy(self, busy: bool) -> None:
        """Called by the supervisor as cells start and finish on this generation."""
        if busy and self.state is GenerationState.READY:
            self._set_state(GenerationState.BUSY, "cell running")
        elif not busy and self.state is GenerationState.BUSY:
            self._set_state(GenerationState.READY, "cell done")

    def identity(self) -> dict[str, Any]:
        """What and where the worker runs (hostname, platform, arch, interpreter and its version,
        pid, cwd), taken once it serves: `host.inspect`, `%klbr status`, the generations table."""
        if self._identity is None and self.pid is not None and self.served:
            self._identity = snapshot(self.pid, self.kernel_info)
        return dict(self._identity or {"pid": self.pid})

    @property
    def served(self) -> bool:
        """It became ready (as opposed to failing to start), whether or not it has ended since."""
        return self._served.done()

    @property
    def placement(self) -> Placement:
        return self.target.placement

    @property
    def kernel_name(self) -> str:
        return self.target.kernel_name

    @property
    def pid(self) -> int | None:
        return self.target.pid

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The worker's kernel_info reply (its language_info), once it has answered."""
        return self._readiness.kernel_info

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def shares_key(self) -> bool:
        """Whether its worker signs with the frontend's key (else its traffic is re-signed)."""
        return self.target.shares_key

    @property
    def uptime(self) -> float:
        return time.time() - self.started

    # -- the link to a worker elsewhere ------------------------------------------------------------

    def _link_lost(self, silent: float) -> None:
        """No word for `link_timeout`, and no exit reported: the outcome of what it ran is unknown.
        What it can still be reached by ends it (its process group here, its provisioner's kill)."""
        how = (f"no word from {self.placement} for {silent:.0f} s (Supervisor.link_timeout is "
               f"{self._link_timeout:g} s) and no exit reported")
        if self.state in _OVER:
            self._closed.silence = how  # ending anyway (a restart, an exit): its words, if it comes to that
            return
        self.log.error("generation %d (pid %s): %s", self.number, self.pid, how)
        self._close(EndReason.LINK_LOST, "link lost")
        self._closed.silence = how
        self._lost_task = self._loop.create_task(self._end_lost_link())

    async def _end_lost_link(self) -> None:
        self._channels.deliver_queued()  # what it said before falling silent still counts
        if self.target.remote:
            # What may still reach it ends it meanwhile (`close`: its provisioner, its agent's lease);
            # the answer to the cell does not wait for a link that is gone.
            self._finish(Ending(EndReason.LINK_LOST, None, self._closed.silence, self.target.tail()))
        else:
            self.target.signal(signal.SIGKILL)  # its exit then ends the generation, with the link's words

    # -- its end ----------------------------------------------------------------------------------

    def _process_exited(self, returncode: int | None) -> None:
        """The worker has ended (and what it started was killed): drain, then record the end.
        `returncode` is None when its end came with no exit status (its provisioner's helper ended)."""
        self._exited.set_result(returncode)
        if self.state is GenerationState.ENDED:  # its end was recorded already (a lost link)
            self._drain_task = self._loop.create_task(self.target.release())
            return
        asked = self._closing is not None and self._closing.reason is not None
        if self.memory is not None:
            memory = self.memory.verdict(returncode, asked=asked)
        else:  # not sampled (a remote worker): its limit alone can be named
            memory = verdict(returncode, asked=asked, last=None, limit=self.memory_limit,
                             oom_killed=not asked and self.target.oom_killed)
        self._close(None, describe_exit(returncode))
        if memory is not None and self._closing is not None:
            self._closing.memory = memory
        # Held: the loop keeps only weak references to tasks.
        self._drain_task = self._loop.create_task(self._drain_then_finish(returncode))

    async def _drain_then_finish(self, returncode: int | None) -> None:
        # Everything the worker sent is delivered before anyone hears of the end (semantics 7).
        await self._channels.drain(DRAIN_BOUND)
        target = self.target
        tail = target.tail()
        await target.release()
        self._finish(self._closed.ending(
            returncode, served=self.served, confirmed=target.confirmed,
            lost_how=target.lost_how or f"{self.placement} ended with no exit reported", tail=tail))

    @property
    def _closed(self) -> Closing:
        """Its `Closing`, from ENDING on: every way into ENDING (and so into ENDED) passes `_close`."""
        assert self._closing is not None, "no Closing before ENDING"
        return self._closing

    def _still(self, state: GenerationState) -> bool:
        """Whether it is in `state` still: asked after an await, during which `stop` may have ended it."""
        return self.state is state

    def _close(self, reason: EndReason | None, why: str) -> None:
        """Into ENDING (once), `reason` asked for unless one was already."""
        if self.state is GenerationState.ENDED:
            return
        if self._closing is None:
            self._closing = Closing()
            self._set_state(GenerationState.ENDING, why)
        self._closing.ask(reason)

    def _finish(self, ending: Ending) -> None:
        if self.state is GenerationState.ENDED:
            return
        self.ending = ending
        self._set_state(GenerationState.ENDED, f"{ending.reason.value}: {ending.how}")
        self._channels.close()
        if self.memory is not None:
            self.memory.close()
        if self._link is not None:
            self._link.close()
        self.target.close()  # whatever the worker started goes with it
        self._readiness.cancel()
        self._ended.set_result(ending)
        self._on_end(self, ending)

    def _set_state(self, new: GenerationState, why: str) -> None:
        if new not in TRANSITIONS[self.state]:
            msg = f"generation {self.number}: {self.state.value} -> {new.value} is not allowed"
            raise RuntimeError(msg)
        # busy <-> ready happens per cell: at debug level, and without building a record otherwise
        level = logging.DEBUG if {self.state, new} == {GenerationState.READY, GenerationState.BUSY} else logging.INFO
        if self.log.isEnabledFor(level):
            self.log.log(level, "generation %d (pid %s): %s -> %s (%s)", self.number, self.pid, self.state.value, new.value, why)
        self.state = new
