"""What ``ssh://``, ``docker://`` and ``slurm://`` share: a generation whose kernel is started by the
agent (`boot.agent`), through a command of this machine that reaches the place (ssh, ``docker run -i``,
``srun``) and carries the agent's stdin and stdout.

`AgentTarget` is that command's process (the reaper's group, its stderr the tail) and the JSON lines
to and from the agent: the start goes first (`spawn`, the generation's fresh key in it: nothing secret
in any argv), then a lease renewed every second, and signals. The agent's ``started`` is the
connection info, its ``exited`` the kernel's exit (WorkerLost, replaced on the same placement); the
command ending with no exit reported is a lost link (the generation's `link` also watches the kernel's
heartbeat). A kind says how its command is made (`spawn`) and named (`command_name`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from abc import abstractmethod
from collections.abc import Coroutine
from typing import Any, Protocol, Unpack

from ..boot.agent_launch import CHANNELS, LEASE_EVERY
from ..boot.placement import Placement
from ..boot.worker import MEMORY_LIMIT
from ..exits import describe_exit
from .base import LaunchError, OnExit, Target, TargetArgs
from .pipes import LinePipe
from .process import WorkerProcess

# Seconds the agent gets to report its kernel's end after a kill before the command itself is
# killed: then stdin's end (a live link) or the lease (a stalled one) ends the kernel, unconfirmed.
KILL_BOUND = 1.0


class AgentTarget(Target):
    remote = True
    takes_klbr_options = True  # klbr's own bootstrap starts ipykernel there
    checked_by_launch = True  # its agent looks for ipykernel first
    limits_memory = True  # the agent passes it to klbr's bootstrap there (or the engine enforces it)
    drops_iopub = False  # klbr's bootstrap runs there: its iopub has no mark

    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        self.kernel_name = f"klbr-{placement.kind}"  # no kernelspec: the agent starts ipykernel there
        self.memory_limit: int | None = None  # `Supervisor.memory_limit`, bytes, from the launch's environment
        self.key = self.session.key.decode("ascii")
        self._reaper = self.given.reaper
        self._on_exit: OnExit = lambda status: None
        self._loop = asyncio.get_running_loop()
        self._process: WorkerProcess | None = None  # the command that reaches the place
        self._pipe: LinePipe | None = None  # to the agent and back, through its stdin and stdout
        self._started: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._renew: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._reported = False
        self._asking: asyncio.Task[None] | None = None  # `ask_why`'s question, while it is asked

    @property
    @abstractmethod
    def command_name(self) -> str:
        """The command that reaches the place, in words (``ssh to gpu-box``), for its errors."""

    @abstractmethod
    def spawn(self, extra_arguments: list[str], host: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the command, the agent's start on its stdin (`boot.agent_launch.spawn`), with
        `extra_arguments` for ipykernel and the host channel's credentials `host`; raises OSError."""

    def connection(self, started: dict[str, Any]) -> dict[str, Any]:
        """The kernel's connection info from the agent's ``started``: ipc sockets in `local`."""
        return {"transport": "ipc", "ip": self.local, "key": self.key, "signature_scheme": self.session.signature_scheme,
                **{f"{name}_port": port for name, port in CHANNELS.items()}}

    @property
    @abstractmethod
    def local(self) -> str:
        """Where its ipc sockets are on this machine, ``{local}-{port}`` (a kernel on TCP has none)."""

    @property
    def pid(self) -> int | None:
        return None  # no process of this machine: the kernel is the agent's

    def environment(self, host: dict[str, str]) -> dict[str, str]:
        """The host channel's credentials only: the agent adds them to the kernel's own environment,
        with the endpoint it reaches there and the client placed (nothing of this machine's goes)."""
        return dict(host)

    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        self._on_exit = on_exit
        self.memory_limit = int(env.get(MEMORY_LIMIT) or 0) or None
        process = self.adopt()
        if process is None:
            host = {name: value for name, value in env.items() if name != MEMORY_LIMIT}
            try:
                process = self.spawn(list(extra_arguments), host)
            except OSError as e:
                message = f"{self.command_name} could not be started: {e.strerror or e}"
                raise LaunchError(message) from e
        assert process.stdin is not None and process.stdout is not None  # `spawn` opens both as pipes
        self._process = WorkerProcess(process, process.pid, self._reaper, self._command_exited)
        self._pipe = LinePipe(os.dup(process.stdout.fileno()), os.dup(process.stdin.fileno()), self._report)
        process.stdin.close()
        process.stdout.close()
        # Renewed from now on: a kernel slow to start (a cold disk, a big venv, a queued job) keeps its lease.
        self._renew_lease()
        return await asyncio.shield(self._started)

    def adopt(self) -> subprocess.Popen[bytes] | None:
        """A command started for this generation before it existed (`boot.prelaunch`), or None."""
        return None

    async def interrupt(self) -> None:
        self._send(signal=int(signal.SIGINT))

    def signal(self, sig: int) -> None:
        self._send(signal=int(sig))
        if sig == signal.SIGKILL and self._kill_timer is None and self._process is not None:
            self._kill_timer = self._loop.call_later(KILL_BOUND, self._process.killpg, signal.SIGKILL)

    def keep(self, data: bytes) -> None:
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.keep(data)

    def tail(self) -> str:
        return self._process.tail() if self._process is not None else ""

    async def release(self) -> None:
        """What its command leaves here goes (`close` has ended the command)."""

    def close(self) -> None:
        """The generation has ended: the command goes (and with its stdin, the agent and its kernel)."""
        for timer in (self._renew, self._kill_timer):
            if timer is not None:
                timer.cancel()
        self._renew = self._kill_timer = None
        if self._asking is not None:
            self._asking.cancel()  # its generation has ended: nothing waits for the words
        if self._process is not None:
            self._process.close()  # SIGKILLs the command's group: the agent sees its stdin end
        if self._pipe is not None:
            self._pipe.close()

    # -- internals ---------------------------------------------------------------------------------

    def _send(self, droppable: bool = False, **message: object) -> None:
        if self._pipe is not None:
            self._pipe.send(droppable, **message)

    def _report(self, message: dict[str, Any]) -> None:
        if "started" in message and not self._started.done():
            self._started.set_result(self.connection(message))
        elif "failed" in message and not self._started.done():
            self._started.set_exception(LaunchError(f"{self.where}: {message['failed']}"))
        elif "exited" in message and not self._started.done():
            self._started.set_exception(LaunchError(
                f"its kernel {self.where} {describe_exit(int(message['exited']))} before it served"))
        elif "exited" in message and self._started.exception() is None:
            self.oom_killed = bool(message.get("oom_killed"))
            self._end(int(message["exited"]))

    def said(self, lines: list[str]) -> str:
        """What the command's stderr says of its end (its last line)."""
        return lines[-1] if lines else ""

    @property
    def where(self) -> str:
        """Where its kernel runs, in words for its errors (``on gpu-box``)."""
        return f"on {self.placement}"

    def _renew_lease(self) -> None:
        self._send(True, lease=1)  # not while the command takes nothing: a stalled link lets the lease lapse
        self._renew = self._loop.call_later(LEASE_EVERY, self._renew_lease)

    def _command_exited(self, returncode: int) -> None:
        if self._pipe is not None:
            self._pipe.read_now()  # what the agent said before the command ended comes first
        said = self.said(self.tail().strip().splitlines())
        if not self._started.done():
            self._started.set_exception(LaunchError(
                f"{self.command_name} {describe_exit(returncode)}" + (f": {said}" if said else "")))
            return
        asking = self.ask_why(said)
        if asking is None:
            self._lost(returncode, said)
        else:
            self._asking = self._loop.create_task(self._lost_when_told(returncode, said, asking))

    def ask_why(self, said: str) -> Coroutine[Any, Any, str] | None:
        """Where the place can say more of its command's end than its stderr did (`said`): the question,
        a coroutine that gives the words. None: `said` is all there is."""
        return None

    async def _lost_when_told(self, returncode: int, said: str, asking: Coroutine[Any, Any, str]) -> None:
        try:
            told = await asking
        except Exception:  # a bug in the question must not keep the loss unreported: what the command said
            self.given.log.exception("%s: asking why %s ended failed", self.placement, self.command_name)
            told = said
        self._lost(returncode, told)

    def _lost(self, returncode: int, said: str) -> None:
        self.lost_how = (f"{self.command_name} {describe_exit(returncode)}" + (f" ({said})" if said else "")
                         + " and no exit of the kernel was reported")
        self._end(None)

    def _end(self, status: int | None) -> None:
        if not self._reported and self._started.done() and self._started.exception() is None:
            self._reported = True
            self._on_exit(status)


class Launched(Protocol):
    """What `LaunchedTarget` reads of its command's launch (`boot.ssh_launch`'s, `boot.docker_launch`'s)."""

    @property
    def local(self) -> str: ...
    @property
    def key(self) -> str: ...


class LaunchedTarget(AgentTarget):
    """A kind whose command one launch describes, made by the target or started early for generation 1
    (`boot.prelaunch`) and adopted: its sockets' place and its key are that launch's."""

    starts_early = True  # its command, when the kernel's command line names the placement
    _launch: Launched

    @property
    def local(self) -> str:
        return self._launch.local

    def connection(self, started: dict[str, Any]) -> dict[str, Any]:
        # the key it was started with (an early one's is its own)
        return {**super().connection(started), "key": self._launch.key}
