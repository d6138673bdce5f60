"""``ssh://[user@]host[:port]/abs/path/to/python``: a worker on a machine reached by the system `ssh`.

One `ssh` process per generation carries everything, run with the kernel's own environment so the
user's ``~/.ssh/config`` (aliases, IdentityFile, ProxyJump, agents, certificates) applies as it is;
`Supervisor.ssh_command` and `Supervisor.ssh_options` add to it. The worker's five channels are
Unix sockets forwarded from the kernel's 0700 runtime directory to a 0700 directory on the remote
(``-L``, ``StreamLocalBindMask=0177``), and the host channel one more, forwarded back (``-R``: the
remote kernel's host calls reach the supervisor's socket here; the agent places the client), ``BatchMode`` (never a prompt), ``ExitOnForwardFailure``,
and keepalives derived from `Supervisor.link_timeout`. It never multiplexes over a ControlMaster:
its exit is this generation's.

On the remote, the agent (`boot.agent`, standard library only) is sent over ssh's stdin with the
generation's fresh key: nothing secret in any argv. `SshTarget` is the generation's target, an
`AgentTarget`: the agent's ``exited`` is a worker's exit (WorkerLost, a new generation on the same
host); ssh ending with none reported (255: the connection), or the lease or heartbeat silent, is a
lost link. Generation 1's ssh
may have been started before the proxy's imports (`boot.early.EarlySsh`): this target adopts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from typing import Unpack

from ..boot.agent_launch import CHANNELS
from ..boot.early import EarlySsh
from ..boot.placement import Placement, PlacementError
from ..boot.ssh_launch import Launch, base_command, remote
from ..exits import describe_exit
from .agent import LaunchedTarget
from .base import NO_ENGINES, CommonArgs, Engines, SshCommand

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


class SshTarget(LaunchedTarget):
    _launch: Launch
    host_channel = "forwarded"  # one more socket on its ssh, back to this machine's (`ssh_launch`)

    def __init__(self, placement: Placement, *, early: EarlySsh | None = None, worker_kernel: str = "",
                 **kwargs: Unpack[CommonArgs]):
        super().__init__(placement, early=early, worker_kernel=worker_kernel, **kwargs)
        self.kernel_name = "klbr-ssh"
        self._early = early
        given = self.given
        ssh_command, ssh_options = given.ssh
        self._launch = Launch(placement, ssh_command, ssh_options, given.link_timeout,
                              os.path.join(given.runtime_dir, f"ssh{given.number}"), self.key,
                              self.session.signature_scheme, [])

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        why = await problem(placement, *ssh)
        if why is not None:
            message = f"{placement}: {why}"
            raise PlacementError(message)

    @property
    def command_name(self) -> str:
        return f"ssh to {self.placement.destination}"

    @property
    def where(self) -> str:
        return f"on {self.placement.host}"

    def adopt(self) -> subprocess.Popen[bytes] | None:
        self._launch.memory_limit = self.memory_limit  # for the agent to pass on
        if self._early is None:
            return None
        early = self._early.take()  # its lease is renewed from here on
        self._launch = early.launch
        return early.process

    def spawn(self, extra_arguments: list[str], host: dict[str, str]) -> subprocess.Popen[bytes]:
        self._launch.args = extra_arguments
        self._launch.host_channel = host  # the host channel's part of it: the limit travels as the start's own key
        self._launch.client = dict(self.given.client)
        return self._launch.spawn()

    async def release(self) -> None:
        for port in CHANNELS.values():  # ssh unlinks its listeners when it exits; one that was killed cannot
            try:
                os.unlink(f"{self._launch.local}-{port}")
            except OSError:
                pass
