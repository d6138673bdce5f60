"""The ``docker run -i`` of a ``docker://`` generation as it is started: its command line and what goes
first on its stdin (the agent, then its start message with the generation's fresh key).

Standard library only: `prelaunch` starts the first generation's container before the proxy's own
imports, when the kernel's command line names a ``docker://`` placement, so the container's start
overlaps them; `targets.docker` starts every other one, and adopts that one.
"""

from __future__ import annotations

import os

from .agent_launch import CHANNELS, HOST_ENDPOINT, READ_FIRST_LINE, lease_of, spawn

TYPE_CHECKING = False  # typing's, as mypy reads it, without importing typing before the spawn
if TYPE_CHECKING:
    import subprocess

    from .placement import Placement

LABEL = "klbr.kernel"  # every container of a klbr kernel: the kernel's runtime directory's name


class Launch:
    """What one generation's ``docker run`` is started with; `spawn` starts it."""

    def __init__(self, placement: Placement, docker: list[str], docker_options: list[str], link_timeout: float,
                 runtime_dir: str, number: int, key: str, signature_scheme: str, args: list[str]):
        self.placement = placement
        self.docker = list(docker)  # `Supervisor.docker_command`, as words
        self.docker_options = list(docker_options)
        self.link_timeout = link_timeout
        self.dir = os.path.join(runtime_dir, f"docker{number}")  # mounted: the agent's is in it
        self.name = f"{os.path.basename(runtime_dir)}-{number}"
        self.labels = [f"--label={LABEL}={os.path.basename(runtime_dir)}", f"--label=klbr.generation={number}"]
        self.key = key
        self.signature_scheme = signature_scheme
        self.args = list(args)  # ipykernel's, after the connection file
        self.memory_limit: int | None = None  # `Supervisor.memory_limit`, bytes: the container's
        self.host_channel: dict[str, str] = {}  # its endpoint an ipc path, mounted at the same path
        self.client: dict[str, str] = {}  # the host client's files, which the agent places

    @property
    def remove(self) -> list[str]:
        """What removes its container, whatever its ``docker run`` did."""
        return [*self.docker, "rm", "--force", self.name]

    @property
    def local(self) -> str:
        """Where its ipc sockets are, ``{local}-{port}`` (the same path in the container)."""
        return os.path.join(self.dir, "agent", "k")

    @property
    def workdir(self) -> str:
        return self.placement.option("workdir") or os.getcwd()

    def argv(self) -> list[str]:
        """`docker run` with klbr's options, the configured ones and the spec's, the image, and the
        interpreter that reads the agent from stdin."""
        placement, workdir = self.placement, self.workdir
        words = [*self.docker, "run", "--rm", "--interactive", "--init",
                 f"--pull={placement.option('pull', 'never')}", f"--name={self.name}", *self.labels,
                 f"--network={placement.option('network', 'none')}",
                 f"--user={placement.option('user', f'{os.getuid()}:{os.getgid()}')}",
                 f"--volume={self.dir}:{self.dir}", f"--workdir={workdir}"]
        if workdir != "/":
            words.append(f"--volume={workdir}:{workdir}")
        endpoint = self.host_channel.get(HOST_ENDPOINT, "")
        if endpoint.startswith("ipc://"):  # its directory, which holds it alone (`prelaunch.host_endpoint`)
            channel = os.path.dirname(endpoint.removeprefix("ipc://"))
            words.append(f"--volume={channel}:{channel}")
        if self.memory_limit:
            words += [f"--memory={self.memory_limit}", f"--memory-swap={self.memory_limit}"]
        words += self.docker_options
        words += [f"--gpus={gpus}" for gpus in placement.all("gpus")]
        words += [f"--volume={mount}" for mount in placement.all("mount")]
        return [*words, "--", placement.target, placement.option("python", "python3"), "-c", READ_FIRST_LINE]

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start ``docker run`` and give the agent its start; raises OSError when docker cannot be run."""
        os.mkdir(self.dir, 0o700)

        def start() -> dict[str, object]:
            # Imported while the container starts: `deathsig` costs milliseconds.
            from .worker import BOOTSTRAP  # noqa: PLC0415

            started: dict[str, object] = {
                "dir": os.path.join(self.dir, "agent"), "key": self.key, "signature_scheme": self.signature_scheme,
                "bootstrap": BOOTSTRAP, "args": self.args, "channels": CHANNELS,
                "lease": lease_of(self.link_timeout), "cwd": self.workdir}
            if self.host_channel.get(HOST_ENDPOINT, "").startswith("ipc://"):  # the same path in the container
                started.update({"host": self.host_channel, "client": self.client})
            return started

        return spawn(self.argv(), start)

