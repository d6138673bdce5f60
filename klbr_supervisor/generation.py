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
import platform
import shutil
import socket
import signal
import tempfile
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from .connection import CHANNELS, WorkerChannels
from .exits import describe_exit
from .host.channel import Credentials
from .launch import StderrTail, WorkerManager, WorkerSpecs, is_ipykernel, popen_options, worker_manager
from .placement import Placement, PlacementError
from .reaper import Reaper
from .resign import Resigner
from .sockets import Channel
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
        self.pid: int | None = None
        self.pgid: int | None = None
        self.started = time.time()
        self.kernel_info: dict = {}
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
        self._channels = WorkerChannels(f"gen{number}", zmq_context, session, self._received, self._check_ready, log)
        self._stderr: StderrTail | None = None
        self._pidfd: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        self._probe_ids: set[str] = set()
        self._iopub_seen = False
        self._end_reason: EndReason | None = None
        self._drain_task: asyncio.Task | None = None
        # A worker that does not share the frontend's key may run elsewhere: its link is watched
        # (heartbeat, and every message it sends), and silence for `link_timeout` ends it LINK_LOST.
        self._link_timeout = link_timeout
        self._heartbeat: Channel | None = None
        self._heard_at = time.monotonic()
        self._link_timer: asyncio.TimerHandle | None = None
        self._link_how: str | None = None
        self._lost_task: asyncio.Task | None = None
        self.next_count = 1  # the execution count the worker will give its next counted cell
        self.state_was_ready = False  # it served (as opposed to failing to start)

    def __repr__(self) -> str:
        return f"<Generation {self.number} pid={self.pid} {self.state.value}>"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, timeout: float, check=None) -> bool:
        """Launch the worker and wait until it answers kernel_info with its iopub and stdin connected.

        `check`, if given, is awaited first: a `PlacementError` it raises ends the generation as a
        failed start with its text. True when ready; False when it ended first (the `Ending` says
        why, START_FAILED).
        """
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
        if self._speaks_for_proxy():
            # Same key and session id as the proxy: its messages go to the frontend untouched.
            extra = [f"--Session.session={self._session.session}", *self._worker_args]
        try:
            env = {**self._environ(), **self.host.environ()}  # never argv: the key is a secret
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
        self.pid, self.pgid = process.pid, provisioner.pgid
        if self.pgid:
            self._reaper.watch(self.pgid)
        if process.stderr is not None:
            self._stderr = StderrTail(process.stderr)
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(self._pidfd, self._process_exited)
        if self._end_reason is not None:
            # `stop` came while the launch was under way (a shutdown during start): it waits for
            # the exit, so make it happen.
            self._killpg(signal.SIGKILL)
            await self._ended
            return False
        info = self._km.get_connection_info()
        self._channels.connect({name: _endpoint(info, name) for name in CHANNELS})
        self._probe()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({self._ready, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.log.error("generation %d: not ready after %.0f s", self.number, timeout)
            await self.stop(EndReason.START_FAILED)
            return False
        if not self._ready.done() or self._ready.cancelled() or self.state is not GenerationState.STARTING:
            return False  # it died, or `stop` is ending it (a shutdown while it started)
        self._set_state(GenerationState.READY, "answered kernel_info")
        self.state_was_ready = True
        if not self.shares_key and self._link_timeout > 0:
            self._watch_link(_endpoint(info, "hb"))  # from now on, silence is a lost link
        return True

    def sync_count(self, last_count: int, texts: dict[int, str]) -> None:
        """Make the worker's next execution count `last_count + 1`, `In` padded to match.

        A silent execute the frontend never sees, sent just before the execute that needs it (the
        worker serves shell messages in order). `texts` fills `In[n]` for cells the worker never
        saw (answered by the proxy); other gaps are empty strings. IPython workers only.
        """
        if self.kernel_info.get("language_info", {}).get("name") != "python":
            return
        code = (
            "def _klbr_sync(ip=get_ipython()):\n"
            "    hist = ip.history_manager\n"
            f"    texts = {texts!r}\n"
            f"    while len(hist.input_hist_parsed) <= {last_count}:\n"
            "        text = texts.get(len(hist.input_hist_parsed), '')\n"
            "        hist.input_hist_parsed.append(text)\n"
            "        hist.input_hist_raw.append(text)\n"
            f"    ip.execution_count = {last_count + 1}\n"
            "_klbr_sync(); del _klbr_sync\n"
        )
        msg = self._session.msg(
            "execute_request",
            {"code": code, "silent": True, "store_history": False, "user_expressions": {}, "allow_stdin": False},
        )
        self._probe_ids.add(msg["header"]["msg_id"])
        self._channels.send("shell", self._session.serialize(msg))
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
        if self.pid is not None and not self._exited.done():
            self._killpg(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(self._exited)
            except TimeoutError:
                self._killpg(signal.SIGKILL)
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
        await asyncio.wait({self._ready, self._ended}, return_when=asyncio.FIRST_COMPLETED)
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
            def link(name: str) -> str | None:
                try:
                    return os.readlink(f"/proc/{self.pid}/{name}")
                except OSError:
                    return None

            try:  # as it was started (a venv's python, not the binary it links to)
                with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0", 1)[0].decode("utf-8", "replace")
            except OSError:
                argv0 = ""
            self._identity = {
                "hostname": socket.gethostname(), "platform": platform.system(), "arch": platform.machine(),
                "interpreter": argv0 if os.path.isabs(argv0) else link("exe"),
                "version": self.kernel_info.get("language_info", {}).get("version"),
                "pid": self.pid, "cwd": link("cwd"),
            }
        return dict(self._identity or {"pid": self.pid})

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

    def _environ(self) -> dict[str, str]:
        """The worker's environment: the proxy's for one on this machine under this user; a minimal
        one for a provisioner (it may forward what it gets to another host)."""
        if self.placement.shares_key:
            return dict(os.environ)
        keep = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "JUPYTER_PATH",
                "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "VIRTUAL_ENV")
        return {name: os.environ[name] for name in keep if name in os.environ}

    def _speaks_for_proxy(self) -> bool:
        """Whether the worker is an ipykernel, sharing the frontend's key, that takes
        `--Session.session` on its command line."""
        if not self.shares_key:
            return False
        if is_ipykernel(self.kernel_name):
            return True
        try:
            argv = WorkerSpecs().get_kernel_spec(self.kernel_name).argv
        except Exception:
            return False
        return any("ipykernel" in a for a in argv)

    def _probe(self) -> None:
        """Ask kernel_info; readiness is its reply plus proof that iopub is subscribed."""
        msg = self._session.msg("kernel_info_request")
        self._probe_ids.add(msg["header"]["msg_id"])
        self._channels.send("shell", self._session.serialize(msg))

    # -- the link to a worker elsewhere ------------------------------------------------------------

    def _watch_link(self, heartbeat: str) -> None:
        """Ping the worker's heartbeat; any answer, and any message on its channels, is word from it."""
        sock = self._zmq.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(heartbeat)
        self._heartbeat = Channel(f"gen{self.number}.hb", sock, self._heard)
        self._heard_at = time.monotonic()
        self._beat()

    def _heard(self, frames: list | None = None) -> None:
        self._heard_at = time.monotonic()

    def _beat(self) -> None:
        self._link_timer = None
        if self.state in (GenerationState.ENDING, GenerationState.ENDED):
            return
        silent = time.monotonic() - self._heard_at
        if silent >= self._link_timeout:
            self._link_lost(silent)
            return
        self._heartbeat.send([b"ping"])
        self._link_timer = self._loop.call_later(min(1.0, self._link_timeout / 4), self._beat)

    def _link_lost(self, silent: float) -> None:
        """No word for `link_timeout`, and no exit reported: the outcome of what it ran is unknown.
        What it can still be reached by ends it (its process group here, its provisioner's kill)."""
        self._link_how = (f"no word from {self.placement} for {silent:.0f} s (Supervisor.link_timeout is "
                          f"{self._link_timeout:g} s) and no exit reported")
        self.log.error("generation %d (pid %s): %s", self.number, self.pid, self._link_how)
        self.closing(EndReason.LINK_LOST)
        self._lost_task = self._loop.create_task(self._end_lost_link())

    async def _end_lost_link(self) -> None:
        self._channels.deliver_queued()  # what it said before falling silent still counts
        if self.pgid or self.pid:
            self._killpg(signal.SIGKILL)  # the pidfd then reports the end, with the link's words
            return
        try:
            async with asyncio.timeout(10):
                await self._km.provisioner.kill(restart=False)
        except Exception as e:
            self.log.warning("generation %d: its provisioner could not kill it: %s", self.number, e)
        self._finish(Ending(EndReason.LINK_LOST, None, self._link_how))

    def _received(self, channel: str, frames: list) -> None:
        if self._heartbeat is not None:
            self._heard_at = time.monotonic()
        try:
            if self._resigner is not None:
                frames = self._resigner.from_worker(frames)
            wire = Wire.parse(frames)
        except ValueError as e:  # MalformedMessage, a bad signature, an undecodable header
            self.log.warning("generation %d: malformed %s message dropped: %s", self.number, channel, e)
            return
        if self.state is GenerationState.ENDED:
            return  # a stale generation has no voice
        if channel == "iopub":
            if not self._iopub_seen:
                self._iopub_seen = True
                self._check_ready()
            if wire.parent_id in self._probe_ids or wire.msg_type == "iopub_welcome":
                return
            if not wire.parent_id and wire.msg_type not in _UNPARENTED_FOR_FRONTEND:
                self._own_news(wire)
                return
        elif wire.parent_id in self._probe_ids:
            if wire.msg_type == "kernel_info_reply":
                self.kernel_info = wire.content
                self._check_ready()
            elif wire.msg_type == "execute_reply" and wire.content.get("status") != "ok":
                self.log.warning("generation %d: could not continue the execution count: %s", self.number, wire.content)
            return
        self._on_message(self, channel, wire)

    def _own_news(self, wire: Wire) -> None:
        """Published about no request (the `starting` status, start-up stderr): not the frontend's."""
        if wire.msg_type != "stream":
            return
        text = wire.content.get("text", "")
        if isinstance(text, str) and text:
            self.log.info("generation %d (pid %s) printed: %s", self.number, self.pid, text.rstrip())
            if self._stderr is not None:
                self._stderr.keep(text.encode("utf-8", "replace"))

    def _check_ready(self) -> None:
        """Ready: kernel_info answered, iopub subscribed, stdin connected (see `connection`)."""
        if self._ready.done() or not self.kernel_info:
            return
        if self._iopub_seen:
            if self._channels.connected("stdin"):
                self._ready.set_result(None)
        else:
            # Replied before our subscription reached its iopub (a kernel without iopub_welcome):
            # ask again; the status of that request proves iopub works.
            self._loop.call_later(0.05, self._probe_if_waiting)

    def _probe_if_waiting(self) -> None:
        if not self._ready.done() and self.state is GenerationState.STARTING:
            self._probe()

    def _process_exited(self) -> None:
        """The pidfd is readable: the worker process has ended. Drain, then record the end."""
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        returncode = self._km.provisioner.process.poll()
        if returncode is None:  # cannot happen for a pidfd, but never report a live worker as ended
            returncode = self._km.provisioner.process.wait()
        self._exited.set_result(returncode)
        if self.pgid:
            # Whatever the worker started goes with it, now: a child it forked would hold its end
            # of the channels open, and the drain waits for their ends.
            self._killpg(signal.SIGKILL)
        if self.state in (GenerationState.READY, GenerationState.BUSY):
            self._set_state(GenerationState.ENDING, describe_exit(returncode))
        # Held: the loop keeps only weak references to tasks.
        self._drain_task = self._loop.create_task(self._drain_then_finish(returncode))

    async def _drain_then_finish(self, returncode: int) -> None:
        # Everything the worker sent is delivered before anyone hears of the end (semantics 7).
        await self._channels.drain(DRAIN_BOUND)
        if self._stderr is not None:
            self._stderr.read_now()
        if self._end_reason is not None:
            reason = self._end_reason
        elif self.state is GenerationState.STARTING:
            reason = EndReason.START_FAILED
        else:
            reason = EndReason.LOST
        tail = self._stderr.text() if self._stderr is not None else ""
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
        if self._link_timer is not None:
            self._link_timer.cancel()
        if self._heartbeat is not None:
            self._heartbeat.close()
        if self.pgid:
            self._killpg(signal.SIGKILL)  # whatever the worker started goes with it
            self._reaper.forget(self.pgid)
        if self._stderr is not None:
            self._stderr.close()
        if self.pid is not None:
            # ipykernel's per-process cell files (used by the debugger)
            shutil.rmtree(os.path.join(tempfile.gettempdir(), f"ipykernel_{self.pid}"), ignore_errors=True)
        if not self._ready.done():
            self._ready.cancel()
        self._ended.set_result(ending)
        self._on_end(self, ending)

    def _killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pgid or self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _set_state(self, new: GenerationState, why: str) -> None:
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"generation {self.number}: {self.state.value} -> {new.value} is not allowed")
        # busy <-> ready happens per cell: at debug level, and without building a record otherwise
        level = logging.DEBUG if {self.state, new} == {GenerationState.READY, GenerationState.BUSY} else logging.INFO
        if self.log.isEnabledFor(level):
            self.log.log(level, "generation %d (pid %s): %s -> %s (%s)", self.number, self.pid, self.state.value, new.value, why)
        self.state = new


def _endpoint(info: dict, channel: str) -> str:
    """The URL of a worker's `channel` from its connection info (ipc here; tcp from a provisioner)."""
    port = info[f"{channel}_port"]
    if info.get("transport", "tcp") == "ipc":
        return f"ipc://{info['ip']}-{port}"
    return f"tcp://{info['ip']}:{port}"
