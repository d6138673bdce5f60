"""One workbench generation: a worker kernel, the sockets to it, its state, and how it ended.

Created and driven by the `Supervisor`. Messages the worker sends are handed, parsed, to the
supervisor's listener, except the generation's own bookkeeping (its readiness probe and the
worker's ``iopub_welcome`` and ``starting`` status). Every change of state goes through
`_set_state`, and the end is recorded once, as an `Ending`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable

import zmq
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from .exits import describe_exit
from .launch import OWN_INTERPRETER, PRELAUNCHED, StderrTail, WorkerSpecs, popen_options
from .reaper import Reaper
from .sockets import Channel
from .states import TRANSITIONS, Ending, EndReason, GenerationState
from .wire import MalformedMessage, Wire

# The worker channels the proxy talks on; heartbeat is not used (we watch the process itself).
CHANNELS = ("shell", "control", "stdin", "iopub")

MessageHandler = Callable[["Generation", str, Wire], None]
EndHandler = Callable[["Generation", Ending], None]


class Generation:
    """A worker and everything that dies with it."""

    def __init__(
        self,
        number: int,
        *,
        kernel_name: str,
        placement: str,
        session: Session,
        worker_args: tuple[str, ...] = (),
        runtime_dir: str,
        zmq_context: zmq.Context,
        reaper: Reaper,
        on_message: MessageHandler,
        on_end: EndHandler,
        log: logging.Logger,
    ):
        self.number = number
        self.kernel_name = kernel_name or OWN_INTERPRETER
        self.placement = placement
        self.state = GenerationState.STARTING
        self.ending: Ending | None = None
        self.pid: int | None = None
        self.pgid: int | None = None
        self.started = time.time()
        self.kernel_info: dict = {}
        self._session = session
        self._worker_args = worker_args
        self._runtime_dir = runtime_dir
        self._zmq = zmq_context
        self._reaper = reaper
        self._on_message = on_message
        self._on_end = on_end
        self.log = log
        self._km: AsyncKernelManager | None = None
        self._channels: dict[str, Channel] = {}
        self._stderr: StderrTail | None = None
        self._pidfd: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._ended: asyncio.Future[Ending] = self._loop.create_future()
        self._probe_ids: set[str] = set()
        self._probe_replied = False
        self._iopub_seen = False
        self._stdin_watch: Channel | None = None  # until stdin's connection is up (see `_watch_stdin`)
        self._end_reason: EndReason | None = None
        self._drain_task: asyncio.Task | None = None
        self.next_count = 1  # the execution count the worker will give its next counted cell
        self.state_was_ready = False  # it served (as opposed to failing to start)

    def __repr__(self) -> str:
        return f"<Generation {self.number} pid={self.pid} {self.state.value}>"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, timeout: float) -> bool:
        """Launch the worker and wait until it answers kernel_info with its iopub and stdin connected.

        True when ready; False when it ended first (the `Ending` says why, START_FAILED).
        """
        self._km = AsyncKernelManager(
            kernel_name=self.kernel_name,
            kernel_spec_manager=WorkerSpecs(),
            session=self._session,
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
            await self._km.start_kernel(extra_arguments=extra, **popen_options())
        except Exception as e:
            self.log.error("generation %d: could not launch %s: %s", self.number, self.kernel_name, e)
            self._finish(Ending(EndReason.START_FAILED, None, f"could not be launched: {e}"))
            return False
        provisioner = self._km.provisioner
        process = provisioner.process
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
        self._connect()
        self._probe()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({self._ready, self._exited}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.log.error("generation %d: not ready after %.0f s", self.number, timeout)
            await self.stop(EndReason.START_FAILED)
            return False
        if not self._ready.done() or self.state is not GenerationState.STARTING:
            return False  # it died, or `stop` is ending it (a shutdown while it started)
        self._set_state(GenerationState.READY, "answered kernel_info")
        self.state_was_ready = True
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
        self._channels["shell"].send(self._session.serialize(msg))
        self.next_count = last_count + 1

    async def stop(self, reason: EndReason, grace: float = 1.0) -> Ending:
        """End the generation: SIGTERM to its process group, SIGKILL after `grace` seconds."""
        if self._end_reason is None:
            self._end_reason = reason
        if self.state not in (GenerationState.ENDING, GenerationState.ENDED):
            self._set_state(GenerationState.ENDING, reason.value)
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
        ch = self._channels.get(channel)
        if ch is None or self.state in (GenerationState.ENDING, GenerationState.ENDED):
            return False
        return ch.send(frames)

    def mark_busy(self, busy: bool) -> None:
        """Called by the supervisor as cells start and finish on this generation."""
        if busy and self.state is GenerationState.READY:
            self._set_state(GenerationState.BUSY, "cell running")
        elif not busy and self.state is GenerationState.BUSY:
            self._set_state(GenerationState.READY, "cell done")

    @property
    def alive(self) -> bool:
        return self.state in (GenerationState.READY, GenerationState.BUSY)

    @property
    def uptime(self) -> float:
        return time.time() - self.started

    # -- internals ---------------------------------------------------------------------------------

    def _speaks_for_proxy(self) -> bool:
        """Whether the worker is an ipykernel that takes `--Session.session` on its command line."""
        if self.kernel_name in (OWN_INTERPRETER, PRELAUNCHED):
            return True
        try:
            argv = WorkerSpecs().get_kernel_spec(self.kernel_name).argv
        except Exception:
            return False
        return any("ipykernel" in a for a in argv)

    def _connect(self) -> None:
        info = self._km.get_connection_info()
        kinds = {"shell": zmq.DEALER, "control": zmq.DEALER, "stdin": zmq.DEALER, "iopub": zmq.SUB}
        for name in CHANNELS:
            sock = self._zmq.socket(kinds[name])
            sock.linger = 0
            # Never drop between worker and proxy: the frontend and the store must see every output.
            sock.rcvhwm = 0
            sock.sndhwm = 0
            # We connect before the worker binds: retry every 10-20 ms rather than libzmq's
            # 100-200 ms, which would otherwise add up to 0.2 s to a generation's start (ipc, local).
            sock.reconnect_ivl = 10
            if name == "iopub":
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                # ipykernel sends input_request to the identity the execute came from on shell, so
                # shell and stdin must share one (as jupyter_client's clients do).
                sock.setsockopt(zmq.IDENTITY, self._session.bsession)
            if name == "stdin":
                self._watch_stdin(sock)
            sock.connect(f"ipc://{info['ip']}-{info[name + '_port']}")
            self._channels[name] = Channel(
                f"gen{self.number}.{name}", sock, lambda frames, n=name: self._received(n, frames)
            )

    def _watch_stdin(self, sock: zmq.Socket) -> None:
        """Hold readiness until stdin's connection is up.

        The worker's stdin is a ROUTER, which drops a message for a peer it does not know yet: an
        input_request sent before our connection is made would be lost, and the cell would wait
        for an answer forever. Our sockets connect before the worker binds and then retry on
        their own 100-200 ms timers, while ipykernel can answer on shell ~100 ms after binding.
        So shell answering proves nothing about stdin (shell and stdin DEALERs queue what we send
        until connected; only the worker's stdin sends to us unasked).
        """
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)

        def connected(_frames: list) -> None:
            self._stop_watching_stdin(sock)
            self._check_ready()

        self._stdin_watch = Channel(f"gen{self.number}.stdin-monitor", monitor, connected)

    def _stop_watching_stdin(self, sock: zmq.Socket | None = None) -> None:
        if self._stdin_watch is not None:
            if sock is not None:
                sock.disable_monitor()
            self._stdin_watch.close()
            self._stdin_watch = None

    def _probe(self) -> None:
        """Ask kernel_info; readiness is its reply plus proof that iopub is subscribed."""
        msg = self._session.msg("kernel_info_request")
        self._probe_ids.add(msg["header"]["msg_id"])
        self._channels["shell"].send(self._session.serialize(msg))

    def _received(self, channel: str, frames: list) -> None:
        try:
            wire = Wire.parse(frames)
        except MalformedMessage as e:
            self.log.warning("generation %d: malformed %s message dropped: %s", self.number, channel, e)
            return
        if self.state is GenerationState.ENDED:
            return  # a stale generation has no voice
        if channel == "iopub":
            if not self._iopub_seen:
                self._iopub_seen = True
                self._check_ready()
            if wire.msg_type == "iopub_welcome" or wire.parent_id in self._probe_ids:
                return
            if wire.msg_type == "status" and not wire.parent_id:
                return  # "starting": news of the worker, not of a frontend request
        elif wire.parent_id in self._probe_ids:
            if wire.msg_type == "kernel_info_reply":
                self.kernel_info = wire.content
                self._probe_replied = True
                self._check_ready()
            elif wire.msg_type == "execute_reply" and wire.content.get("status") != "ok":
                self.log.warning("generation %d: could not continue the execution count: %s", self.number, wire.content)
            return
        self._on_message(self, channel, wire)

    def _check_ready(self) -> None:
        if self._ready.done() or not self._probe_replied:
            return
        if self._iopub_seen:
            if self._stdin_watch is None:
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
        if self.state in (GenerationState.READY, GenerationState.BUSY):
            self._set_state(GenerationState.ENDING, describe_exit(returncode))
        # Held: the loop keeps only weak references to tasks.
        self._drain_task = self._loop.create_task(self._drain_then_finish(returncode))

    async def _drain_then_finish(self, returncode: int) -> None:
        # What the worker sent before it died may still be in ZMQ's I/O thread: a short settle, then
        # deliver everything queued, before anyone hears of the end (DESIGN.md semantics 7).
        for _ in range(3):
            await asyncio.sleep(0.01)
            for ch in self._channels.values():
                ch.drain()
        if self._stderr is not None:
            self._stderr.read_now()
        if self._end_reason is not None:
            reason = self._end_reason
        elif self.state is GenerationState.STARTING:
            reason = EndReason.START_FAILED
        else:
            reason = EndReason.LOST
        tail = self._stderr.text() if self._stderr is not None else ""
        self._finish(Ending(reason, returncode, describe_exit(returncode), tail))

    def _finish(self, ending: Ending) -> None:
        if self.state is GenerationState.ENDED:
            return
        self.ending = ending
        self._set_state(GenerationState.ENDED, f"{ending.reason.value}: {ending.how}")
        self._stop_watching_stdin()
        for ch in self._channels.values():
            ch.close()
        if self.pgid:
            self._killpg(signal.SIGKILL)  # whatever the worker started goes with it
            self._reaper.forget(self.pgid)
        if self._stderr is not None:
            self._stderr.close()
        if self._km is not None:
            self._km.cleanup_connection_file()
            self._km.cleanup_ipc_files()
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
