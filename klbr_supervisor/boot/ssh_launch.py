"""The ssh process of an ``ssh://`` generation as it is started: its command line and what goes first
on its stdin (the agent, then its start message with the generation's fresh key).

Standard library only: `prelaunch` starts the first generation's ssh before the proxy's own
imports, when the kernel's command line names an ``ssh://`` placement, so the connection and the
remote kernel's start overlap them; `targets.ssh` starts every other one, and adopts that one.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from .agent_launch import AGENT, CHANNELS, HOST_ENDPOINT, LINK_TIMEOUT, READ_FIRST_LINE, first_line, lease_of, spawn

TYPE_CHECKING = False  # typing's, as mypy reads it, without importing typing before the spawn
if TYPE_CHECKING:
    from .placement import Placement

# What the login shell on the remote runs: the agent's first line comes on stdin. Plain words and
# one double-quoted string with no $, backquote, ! or glob in it, which POSIX shells, fish and
# csh all take as it is.
REMOTE = '{python} -c "' + READ_FIRST_LINE + '"'


def split(command: str, default: str = "ssh") -> list[str]:
    """A configured command (`Supervisor.ssh_command`, `docker_command`, `srun_command`) as words."""
    return shlex.split(command) if command else [default]


def base_command(placement: Placement, ssh_command: list[str], ssh_options: list[str],
                 link_timeout: float) -> list[str]:
    """ssh with klbr's options, the user's additions and the destination (no remote command yet)."""
    alive = max(1, round((link_timeout or LINK_TIMEOUT) / 3))
    argv = [*(ssh_command or ["ssh"]), "-T",
            "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3", *ssh_options]
    if placement.port:
        argv += ["-p", str(placement.port)]
    return [*argv, placement.destination]


def remote(python: str, script: str) -> tuple[str, str]:
    """The remote command that runs `script`, sent as its first line on stdin."""
    return REMOTE.format(python=python), first_line(script)


class Launch:
    """What one generation's ssh is started with; `spawn` starts it."""

    def __init__(self, placement: Placement, ssh_command: list[str], ssh_options: list[str], link_timeout: float,
                 local: str, key: str, signature_scheme: str, args: list[str]):
        self.placement = placement
        self.ssh_command = list(ssh_command)
        self.ssh_options = list(ssh_options)
        self.link_timeout = link_timeout
        self.memory_limit: int | None = None  # `Supervisor.memory_limit`, bytes: the remote worker's
        self.local = local  # the forwarded sockets' path here, ``{local}-{port}``
        # On the remote: the agent makes it, 0700, and fails if it exists.
        self.remote_dir = f"/tmp/klbr-{os.urandom(8).hex()}"  # noqa: S108
        self.key = key
        self.signature_scheme = signature_scheme
        self.args = list(args)  # ipykernel's, after the connection file
        # The host channel's credentials as the supervisor gives them (its endpoint an ipc path
        # here), and the host client's files (`targets.client`): the remote kernel gets both from
        # the agent, its endpoint the remote end of one more forwarded socket (`host_socket`).
        self.host_channel: dict[str, str] = {}
        self.client: dict[str, str] = {}
        # Beside its directory, not in it: ssh binds it as it connects, before the agent runs.
        # sshd makes it 0600 (its StreamLocalBindMask, 0177 unless its admin says otherwise).
        self.host_socket = f"{self.remote_dir}.host"

    def argv(self) -> list[str]:
        base = base_command(self.placement, self.ssh_command, self.ssh_options, self.link_timeout)
        forwards = []
        for port in CHANNELS.values():
            forwards += ["-L", f"{self.local}-{port}:{self.remote_dir}/k-{port}"]
        endpoint = self.host_channel.get(HOST_ENDPOINT, "")
        if endpoint.startswith("ipc://"):  # the remote's calls come back to this machine's socket
            forwards += ["-R", f"{self.host_socket}:{endpoint.removeprefix('ipc://')}"]
        return [*base[:-1], "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindMask=0177",
                "-o", "StreamLocalBindUnlink=yes", *forwards, base[-1], remote(self.placement.python, AGENT)[0]]

    def _host_channel(self) -> dict[str, object]:
        """What the agent gives its kernel of the host channel (none without credentials)."""
        if not self.host_channel.get(HOST_ENDPOINT, "").startswith("ipc://"):
            return {}
        return {"host": {**self.host_channel, HOST_ENDPOINT: f"ipc://{self.host_socket}"},
                "host_socket": self.host_socket, "client": self.client}

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start ssh and give the agent its start; raises OSError when ssh cannot be run."""

        def start() -> dict[str, object]:
            # Imported while ssh connects: `deathsig` costs milliseconds.
            from .worker import BOOTSTRAP  # noqa: PLC0415

            return {"dir": self.remote_dir, "memory_limit": self.memory_limit, "key": self.key,
                    "signature_scheme": self.signature_scheme, "bootstrap": BOOTSTRAP, "args": self.args,
                    "channels": CHANNELS, "lease": lease_of(self.link_timeout), **self._host_channel()}

        return spawn(self.argv(), start)
