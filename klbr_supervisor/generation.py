"""One workbench generation: a worker on its target, the channels to it, its state, and how it ended.

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
import signal
import time
from collections.abc import Callable

import zmq
from jupyter_client.session import Session

from .boot.placement import Placement, PlacementError
from .connection import CHANNELS, WorkerChannels
from .counts import continue_code
from .exits import describe_exit
from .host.channel import Credentials
from .identity import ask_identity, snapshot
from .link import LinkWatch, endpoint
from .readiness import Readiness
from .resign import Resigner, take_key
from .states import TRANSITIONS, Ending, EndReason, GenerationState
from .targets import LaunchError, Target
from .wire import Wire

MessageHandler = Callable[["Generation", str, Wire], None]
EndHandler = Callable[["Generation", Ending], None]

# How long the channels of a worker that exited may take to report their last byte read (a bound,
# not a wait: they report it within microseconds unless a process that escaped the group holds them).
DRAIN_BOUND = 2.0
# Ends a new generation would follow automatically: with no exit seen (a worker elsewhere whose
# kill was not confirmed), the first may still run, so they count as a lost link instead.
_REPLACED = frozenset({EndReason.LOST, EndReason.KILLED, EndReason.DEADLINE})
# Published with no parent and still the frontend's business: the debugger's events.
_UNPARENTED_FOR_FRONTEND = frozenset({"debug_event"})


class Generation:
    """A worker and everything that dies with it."""

    def __init__(self, number: int, *, target: Target, session: Session, worker_args: tuple[str, ...] = (),
                 worker_options: tuple[str, ...] = (), zmq_context: zmq.Context, on_message: MessageHandler,
                 on_end: EndHandler, log: logging.Logger, host: Credentials, link_timeout: float = 15.0):
        """`session` is the proxy's (its worker's, when the target shares the key); `worker_args`
        klbr's own options for an ipykernel it starts, `worker_options` the user's, for any worker."""
        self.number = number
        self.host = host  # its worker's way back to the supervisor (`klbr_supervisor.host`)
        self._identity: dict | None = None
        self.target = target
        self.state = GenerationState.STARTING
        self.ending: Ending | None = None
        self._worker: Target | None = None  # its target, once its launch has begun
        self._starting = False  # `start` is under way (it launches, or ends it, itself)
        self.started = time.time()
        self._proxy_session = session.session  # what its worker is started with, key shared or not
        self._session = target.session
        # A worker elsewhere gets a key of its own, and its traffic is re-signed (`resign`).
        self._resigner = None if target.shares_key else Resigner(target.session, session)
        self._worker_args = worker_args  # klbr's own, for an ipykernel it starts
        self._worker_options = worker_options  # the user's, for any worker
        self._zmq = zmq_context
        self._on_message = on_message
        self._on_end = on_end
        self.log = log
        self._channels = WorkerChannels(f"gen{number}", zmq_context, self._session, self._received,
                                        lambda: self._readiness.check(), log)
        self._readiness = Readiness(f"generation {number}", self._session, self._channels, log)
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int | None] = self._loop.create_future()
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        # Once it serves, its identity asked (of a worker elsewhere): `wait_started` reads it whole.
        self._served: asyncio.Future[None] = self._loop.create_future()
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
            if self._end_reason is not None:  # `stop` came while it was checked: nothing to launch
                self._finish(Ending(self._end_reason, None, "ended before its worker was launched"))
                return False
        deadline = self._loop.time() + timeout
        self._worker = self.target
        # The proxy's session id (and key, when shared: its messages go on untouched); ssh://'s too.
        extra = []
        if self.target.takes_klbr_options:
            extra = [f"--Session.session={self._proxy_session}", *self._worker_args]
        extra += self._worker_options  # the user's, on every placement (a kernelspec's: after its argv)
        self.log.debug("generation %d: %s with %s", self.number, self.kernel_name, extra)
        env = self.target.environ()  # never argv: the key and the host credentials are secrets
        if self.target.host_channel == "environ":
            env.update(self.host.environ())
        try:
            async with asyncio.timeout_at(deadline):
                info = await self._worker.launch(extra, env, self._process_exited)
        except (LaunchError, TimeoutError) as e:
            why = (f"was not launched within {timeout:.0f} s" if isinstance(e, TimeoutError)
                   else f"could not be launched: {e}")
            self.log.error("generation %d: %s %s", self.number, self.kernel_name, why)
            self._worker.signal(signal.SIGKILL)
            self._finish(Ending(self._end_reason or EndReason.START_FAILED, None, why, self._worker.tail()))
            return False
        if self._end_reason is not None:
            # `stop` came while the launch was under way (a shutdown during start): it waits for
            # the exit, so make it happen.
            self._worker.signal(signal.SIGKILL)
            await self._ended
            return False
        if self._exited.done() or self.state is GenerationState.ENDED:
            await asyncio.shield(self._ended)  # it ended as its launch reported: nothing to connect
            return False
        if not self.shares_key:
            take_key(self._session, info)
        self._channels.connect({name: endpoint(info, name) for name in CHANNELS})
        self._readiness.probe()
        ready = self._readiness.ready
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait({ready, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.log.error("generation %d: not ready after %.0f s", self.number, timeout)
            await self.stop(EndReason.START_FAILED)
            return False
        if not ready.done() or ready.cancelled() or self.state is not GenerationState.STARTING:
            return False  # it died, or `stop` is ending it (a shutdown while it started)
        if self.target.asks_identity:
            self._identity = await ask_identity(self._readiness, self._session)
            if self.state is not GenerationState.STARTING:
                return False
        self._set_state(GenerationState.READY, "answered kernel_info")
        self.state_was_ready = True
        self._served.set_result(None)
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
        if self._worker is None and not self._starting:
            # Never launched, and no start under way that would launch it (one that raised)
            self._finish(Ending(reason, None, "ended before its worker was launched"))
        if self._worker is not None and not self._exited.done() and not self._ended.done():
            self._worker.signal(signal.SIGTERM)
            await asyncio.wait({self._exited, self._ended}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            if not self._exited.done() and not self._ended.done():
                self._worker.signal(signal.SIGKILL)
        return await asyncio.shield(self._ended)

    async def interrupt(self) -> None:
        """Interrupt as the kernelspec says (SIGINT to the group, or a control interrupt_request)."""
        if self._worker is not None and self.state not in (GenerationState.ENDING, GenerationState.ENDED):
            await self._worker.interrupt()

    def send(self, channel: str, frames: list) -> bool:
        if self.state in (GenerationState.ENDING, GenerationState.ENDED):
            return False
        if self._resigner is not None:
            frames = self._resigner.to_worker(frames)
        return self._channels.send(channel, frames)

    async def wait_started(self) -> bool:
        """Until it serves, its identity known (True), or has ended without serving (False)."""
        await asyncio.wait({self._served, self._ended}, return_when=asyncio.FIRST_COMPLETED)
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
    def placement(self) -> Placement:
        return self.target.placement

    @property
    def kernel_name(self) -> str:
        return self.target.kernel_name

    @property
    def pid(self) -> int | None:
        return self.target.pid

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
        return self.target.shares_key

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
        if self._worker.remote:
            # What may still reach it ends it meanwhile (`close`: its provisioner, its agent's lease);
            # the answer to the cell does not wait for a link that is gone.
            self._finish(Ending(EndReason.LINK_LOST, None, self._link_how, self._worker.tail()))
        else:
            self._worker.signal(signal.SIGKILL)  # its exit then ends the generation, with the link's words

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
            if self._worker is not None:
                self._worker.keep(text.encode("utf-8", "replace"))

    def _process_exited(self, returncode: int | None) -> None:
        """The worker has ended (and what it started was killed): drain, then record the end.
        `returncode` is None when its end came with no exit status (its provisioner's helper ended)."""
        self._exited.set_result(returncode)
        if self.state is GenerationState.ENDED:  # its end was recorded already (a lost link)
            self._drain_task = self._loop.create_task(self._worker.release())
            return
        if self.state in (GenerationState.READY, GenerationState.BUSY):
            self._set_state(GenerationState.ENDING, describe_exit(returncode))
        # Held: the loop keeps only weak references to tasks.
        self._drain_task = self._loop.create_task(self._drain_then_finish(returncode))

    async def _drain_then_finish(self, returncode: int) -> None:
        # Everything the worker sent is delivered before anyone hears of the end (semantics 7).
        await self._channels.drain(DRAIN_BOUND)
        tail = self._worker.tail()
        if self._end_reason is not None:
            reason = self._end_reason
        elif self.state is GenerationState.STARTING:
            reason = EndReason.START_FAILED
        else:
            reason = EndReason.LOST
        if returncode is None and reason in _REPLACED and not self._worker.confirmed:
            reason = EndReason.LINK_LOST  # it may still run: no exit was seen, no kill confirmed
        await self._worker.release()
        lost_how = self._worker.lost_how or f"{self.placement} ended with no exit reported"
        if reason is EndReason.LINK_LOST:
            how = self._link_how or lost_how
        elif returncode is None:
            how = lost_how
        else:
            how = describe_exit(returncode)
        self._finish(Ending(reason, returncode, how, tail))

    def _finish(self, ending: Ending) -> None:
        if self.state is GenerationState.ENDED:
            return
        self.ending = ending
        self._set_state(GenerationState.ENDED, f"{ending.reason.value}: {ending.how}")
        self._channels.close()
        if self._link is not None:
            self._link.close()
        if self._worker is not None:
            self._worker.close()  # whatever the worker started goes with it
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

