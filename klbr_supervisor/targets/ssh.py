"""``ssh://[user@]host[:port]/abs/path/to/python``: a worker on a machine reached by the system `ssh`.

One `ssh` process per generation carries everything, run with the kernel's own environment so the
user's ``~/.ssh/config`` (aliases, IdentityFile, ProxyJump, agents, certificates) applies as it is;
`Supervisor.ssh_command` and `Supervisor.ssh_options` add to it. The worker's five channels are
Unix sockets forwarded from the kernel's 0700 runtime directory to a 0700 directory on the remote
(``-L``, ``StreamLocalBindMask=0177``), and the host channel one more, forwarded back (``-R``: the
remote kernel's host calls reach the supervisor's socket here; the agent places the client), ``BatchMode`` (never a prompt), ``ExitOnForwardFailure``,
and keepalives derived from `Supervisor.link_timeout`. It never multiplexes over a ControlMaster:
its exit is this generation's.

On the remote, `ssh_agent` (standard library only) is sent over ssh's stdin with the generation's
fresh key: nothing secret in any argv. `SshTarget` is the generation's target: the agent's
``exited`` is a worker's exit (WorkerLost, a new generation on the same host); ssh ending with none
reported (255: the connection), or the lease or heartbeat silent, is a lost link. Generation 1's ssh
may have been started before the proxy's imports (`boot.prelaunch.EarlySsh`): this target adopts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, Unpack

from ..boot.placement import Placement, PlacementError
from ..boot.prelaunch import EarlySsh
from ..boot.ssh_launch import CHANNELS, LEASE_EVERY, Launch, base_command, remote
from ..boot.worker import MEMORY_LIMIT
from ..exits import describe_exit
from .base import CommonArgs, LaunchError, OnExit, SshCommand, Target
from .pipes import LinePipe
from .process import WorkerProcess

# Seconds the agent gets to report its kernel's end after a kill before ssh itself is killed: then
# stdin's end (a live link) or the lease (a stalled one) ends the kernel, unconfirmed.
KILL_BOUND = 1.0
PROBE = ("import importlib.util, sys\n"
         "sys.exit(0 if importlib.util.find_spec('ipykernel_launcher') else 3)\n")


async def problem(placement: Placement, ssh_command: list[str], ssh_options: list[str], timeout: float = 30) -> str | None:
    """Why a generation cannot start there (the host unreachable, no interpreter, no ipykernel), or None."""
    command, first = remote(placement.python, PROBE)
    argv = [*base_command(placement, ssh_command, ssh_options, 15), command]
    try:  # a session of its own: what ssh starts (a ProxyCommand) goes with it
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                    start_new_session=True)
    except OSError as e:
        return f"{argv[0]} cannot be run: {e.strerror or e}"
    try:
        async with asyncio.timeout(timeout):
            _, err = await proc.communicate(first.encode())
    except (TimeoutError, asyncio.CancelledError) as e:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if isinstance(e, asyncio.CancelledError):
            raise
        return f"{placement.destination} did not answer within {timeout:.0f} s"
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    said = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
    if proc.returncode == 0:
        return None
    if proc.returncode == 3:
        return f"{placement.python} on {placement.host} has no ipykernel; install it there ({placement.python} -m pip install ipykernel)"
    if proc.returncode == 255:
        return f"ssh could not reach {placement.destination}: {said or 'exit status 255'}"
    return f"{placement.python} on {placement.host} cannot run: {said or describe_exit(proc.returncode)}"


class SshTarget(Target):
    starts_early = True  # its ssh, when the kernel's command line names the placement
    remote = True
    host_channel = "forwarded"  # one more socket on its ssh, back to this machine's (`ssh_launch`)
    takes_klbr_options = True  # klbr's own bootstrap starts ipykernel there
    checked_by_launch = True  # its agent looks for ipykernel first
    limits_memory = True  # the agent passes it to klbr's bootstrap there

    def __init__(self, placement: Placement, *, early: EarlySsh | None = None, worker_kernel: str = "",
                 **kwargs: Unpack[CommonArgs]):
        super().__init__(placement, early=early, worker_kernel=worker_kernel, **kwargs)
        self.kernel_name = "klbr-ssh"  # no kernelspec: the agent starts ipykernel there
        self._early = early
        given = self.given
        ssh_command, ssh_options = given.ssh
        self._launch = Launch(placement, ssh_command, ssh_options, given.link_timeout,
                              os.path.join(given.runtime_dir, f"ssh{given.number}"), self.session.key.decode("ascii"),
                              self.session.signature_scheme, [])
        self._reaper = given.reaper
        self._on_exit: OnExit = lambda status: None
        self._log = given.log
        self._loop = asyncio.get_running_loop()
        self._ssh: WorkerProcess | None = None
        self._pipe: LinePipe | None = None  # to the agent and back, through ssh's stdin and stdout
        self._started: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._renew: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._reported = False

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand) -> None:
        why = await problem(placement, *ssh)
        if why is not None:
            message = f"{placement}: {why}"
            raise PlacementError(message)

    @property
    def pid(self) -> int | None:
        return None  # no process of this machine: the kernel is the remote's

    def environment(self, host: dict[str, str]) -> dict[str, str]:
        """The host channel's credentials only: the agent adds them to the remote's own environment,
        with the endpoint it reaches there and the client placed (nothing of this machine's goes)."""
        return dict(host)

    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        self._on_exit = on_exit
        self._launch.memory_limit = int(env.get(MEMORY_LIMIT) or 0) or None  # for the agent to pass on
        if self._early is not None:
            early = self._early.take()  # its lease is renewed from here on
            self._launch, process = early.launch, early.process
        else:
            self._launch.args = list(extra_arguments)
            # the host channel's part of it: the limit travels as the start's own key
            self._launch.host_channel = {name: value for name, value in env.items() if name != MEMORY_LIMIT}
            self._launch.client = dict(self.given.client)
            try:
                process = self._launch.spawn()
            except OSError as e:
                message = f"{self._launch.argv()[0]} could not be started: {e.strerror or e}"
                raise LaunchError(message) from e
        assert process.stdin is not None and process.stdout is not None  # `Launch.spawn` opens both as pipes
        self._ssh = WorkerProcess(process, process.pid, self._reaper, self._ssh_exited)
        self._pipe = LinePipe(os.dup(process.stdout.fileno()), os.dup(process.stdin.fileno()), self._report)
        process.stdin.close()
        process.stdout.close()
        # Renewed from now on: a kernel slow to start (a cold disk, a big venv) keeps its lease.
        self._renew_lease()
        return await asyncio.shield(self._started)

    async def interrupt(self) -> None:
        self._send(signal=int(signal.SIGINT))

    def signal(self, sig: int) -> None:
        self._send(signal=int(sig))
        if sig == signal.SIGKILL and self._kill_timer is None and self._ssh is not None:
            self._kill_timer = self._loop.call_later(KILL_BOUND, self._ssh.killpg, signal.SIGKILL)

    def keep(self, data: bytes) -> None:
        if self._ssh is not None and self._ssh.stderr is not None:
            self._ssh.stderr.keep(data)

    def tail(self) -> str:
        return self._ssh.tail() if self._ssh is not None else ""

    async def release(self) -> None:
        for port in CHANNELS.values():  # ssh unlinks its listeners when it exits; one that was killed cannot
            try:
                os.unlink(f"{self._launch.local}-{port}")
            except OSError:
                pass

    def close(self) -> None:
        """The generation has ended: ssh goes (and with its stdin, the agent and its kernel)."""
        for timer in (self._renew, self._kill_timer):
            if timer is not None:
                timer.cancel()
        self._renew = self._kill_timer = None
        if self._ssh is not None:
            self._ssh.close()  # SIGKILLs ssh's group: the remote sees the connection end
        if self._pipe is not None:
            self._pipe.close()

    # -- internals ---------------------------------------------------------------------------------

    def _send(self, droppable: bool = False, **message: object) -> None:
        if self._pipe is not None:
            self._pipe.send(droppable, **message)

    def _report(self, message: dict[str, Any]) -> None:
        if "started" in message and not self._started.done():
            self._started.set_result({  # the key it was started with (an early ssh's is its own)
                "transport": "ipc", "ip": self._launch.local, "key": self._launch.key,
                "signature_scheme": self._launch.signature_scheme,
                **{f"{name}_port": port for name, port in CHANNELS.items()}})
        elif "failed" in message and not self._started.done():
            self._started.set_exception(LaunchError(f"on {self.placement.host}: {message['failed']}"))
        elif "exited" in message and not self._started.done():
            self._started.set_exception(LaunchError(
                f"its kernel on {self.placement.host} {describe_exit(int(message['exited']))} before it served"))
        elif "exited" in message and self._started.exception() is None:
            self._end(int(message["exited"]))

    def _renew_lease(self) -> None:
        self._send(True, lease=1)  # not while ssh takes nothing: a stalled link lets the lease lapse
        self._renew = self._loop.call_later(LEASE_EVERY, self._renew_lease)

    def _ssh_exited(self, returncode: int) -> None:
        if self._pipe is not None:
            self._pipe.read_now()  # what the agent said before ssh ended comes first
        if not self._started.done():
            said = (self.tail().strip().splitlines() or [""])[-1]
            self._started.set_exception(LaunchError(
                f"ssh to {self.placement.destination} {describe_exit(returncode)}" + (f": {said}" if said else "")))
            return
        said = (self.tail().strip().splitlines() or [""])[-1]
        self.lost_how = (f"ssh to {self.placement.destination} {describe_exit(returncode)}"
                         + (f" ({said})" if said else "") + " and no exit of the kernel was reported")
        self._end(None)

    def _end(self, status: int | None) -> None:
        if not self._reported and self._started.done() and self._started.exception() is None:
            self._reported = True
            self._on_exit(status)

