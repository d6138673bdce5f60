"""``docker://IMAGE[?options]``: the workbench in a container of IMAGE, through the `docker` command.

`Supervisor.docker_command` (default ``docker``) runs with the kernel's environment, so the user's
``DOCKER_HOST`` and contexts apply, and podman's Docker-compatible socket too. One ``docker run -i``
per generation: ``--rm``, ``--init`` (Python as PID 1 ignores SIGTERM), ``--pull=never`` unless the
spec says ``pull=``, a label per kernel and generation, ``--network=none`` unless the spec says
otherwise, the kernel's uid:gid unless it says ``user=``, and `Supervisor.memory_limit` as the
container's (its engine's OOM kill is then reported, by the agent's cgroup count: `oom_killed`).
The image needs Python and ipykernel, nothing of klbr: the agent (`boot.agent`) comes over the
container's stdin with the generation's fresh key.

Nothing of the container needs a network: the kernel's sockets are ipc files in a directory of the
generation mounted at the same path, and so is the host channel's socket (the supervisor's, one file).
The kernel's working directory is the kernel's own (the notebook's), mounted at the same path
(``workdir=`` picks another).

A container does not end with its ``docker run`` (killed, its container runs on: stdin is not
closed), so the container is removed by name (``docker rm -f``) when its generation ends, and by the
kernel's reaper if the kernel dies first; its agent's lease covers a stalled engine. A daemon that
stops answering carries no lease renewal and no word: the heartbeat, on the mounted sockets, still
answers until the lease ends the kernel, then its silence is a lost link (`PlacementLost`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Unpack

from ..boot.agent_launch import CHANNELS, HOST_ENDPOINT, READ_FIRST_LINE, lease_of, spawn
from ..boot.placement import Placement, PlacementError
from ..boot.worker import BOOTSTRAP
from .agent import AgentTarget
from .base import NO_ENGINES, Engines, SshCommand, TargetArgs
from .process import WorkerProcess

LABEL = "klbr.kernel"  # every container of a klbr kernel: the kernel's runtime directory's name


async def _docker(engines: Engines, *args: str, timeout: float = 30) -> tuple[int, str]:
    """Run `docker ARGS`; its exit status and the last line it wrote to stderr (-1: it could not run)."""
    try:
        proc = await asyncio.create_subprocess_exec(*engines.docker, *args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        return -1, f"{engines.docker[0]} cannot be run: {e.strerror or e}"
    try:
        async with asyncio.timeout(timeout):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{' '.join(engines.docker)} {args[0]} did not answer within {timeout:.0f} s"
    return proc.returncode or 0, (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]


class DockerTarget(AgentTarget):
    host_channel = "mounted"  # the supervisor's socket, one file mounted into the container

    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        given = self.given
        self._dir = os.path.join(given.runtime_dir, f"docker{given.number}")  # mounted: the agent's is in it
        self.name = f"{os.path.basename(given.runtime_dir)}-{given.number}"
        self._remove = [*given.engines.docker, "rm", "--force", self.name]
        self._removal: WorkerProcess | None = None

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        """The engine answers, and has the image (unless the spec asks for a pull)."""
        status, said = await _docker(engines, "version", "--format", "{{.Server.Version}}")
        if status != 0:
            message = f"{placement}: {said or 'docker failed'}"
            raise PlacementError(message)
        if placement.option("pull", "never") != "never":
            return
        status, said = await _docker(engines, "image", "inspect", "--format", "{{.Id}}", placement.target)
        if status != 0:  # the engine answered: the image is not there
            message = (f"{placement}: the engine has no image {placement.target} (klbr pulls only when the spec "
                       f"says pull=missing or pull=always; or run `docker pull {placement.target}`)")
            raise PlacementError(message)

    @property
    def command_name(self) -> str:
        return f"docker run of {self.placement.target}"

    @property
    def where(self) -> str:
        return f"in a container of {self.placement.target}"

    @property
    def local(self) -> str:
        return os.path.join(self._dir, "agent", "k")

    def argv(self, host: dict[str, str]) -> list[str]:
        """`docker run` with klbr's options, the configured ones and the spec's, the image, and the
        interpreter that reads the agent from stdin."""
        placement, given = self.placement, self.given
        workdir = placement.option("workdir") or os.getcwd()
        words = [*given.engines.docker, "run", "--rm", "--interactive", "--init",
                 f"--pull={placement.option('pull', 'never')}", f"--name={self.name}",
                 f"--label={LABEL}={os.path.basename(given.runtime_dir)}", f"--label=klbr.generation={given.number}",
                 f"--network={placement.option('network', 'none')}",
                 f"--user={placement.option('user', f'{os.getuid()}:{os.getgid()}')}",
                 f"--volume={self._dir}:{self._dir}", f"--workdir={workdir}"]
        if workdir != "/":
            words.append(f"--volume={workdir}:{workdir}")
        endpoint = host.get(HOST_ENDPOINT, "")
        if endpoint.startswith("ipc://"):
            words.append(f"--volume={endpoint.removeprefix('ipc://')}:{endpoint.removeprefix('ipc://')}")
        if self.memory_limit:
            words += [f"--memory={self.memory_limit}", f"--memory-swap={self.memory_limit}"]
        words += given.engines.docker_options
        words += [f"--gpus={gpus}" for gpus in placement.all("gpus")]
        words += [f"--volume={mount}" for mount in placement.all("mount")]
        return [*words, "--", placement.target, placement.option("python", "python3"), "-c", READ_FIRST_LINE]

    def spawn(self, extra_arguments: list[str], host: dict[str, str]) -> subprocess.Popen[bytes]:
        os.mkdir(self._dir, 0o700)
        start: dict[str, object] = {
            "dir": os.path.join(self._dir, "agent"), "key": self.key, "signature_scheme": self.session.signature_scheme,
            "bootstrap": BOOTSTRAP, "args": extra_arguments, "channels": CHANNELS,
            "lease": lease_of(self.given.link_timeout), "cwd": self.placement.option("workdir") or os.getcwd()}
        if host.get(HOST_ENDPOINT, "").startswith("ipc://"):  # its endpoint is the same path in the container
            start.update({"host": host, "client": dict(self.given.client)})
        argv = self.argv(host)
        self.given.reaper.at_end(self._remove)  # a container outlives its docker run: removed if the kernel dies
        return spawn(argv, lambda: start)

    def close(self) -> None:
        """The generation has ended: the container goes, by name, whatever its docker run did."""
        super().close()
        if self._removal is None and os.path.isdir(self._dir):
            try:
                process = subprocess.Popen(self._remove, stdin=subprocess.DEVNULL,  # noqa: S603 — the configured docker, no shell
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                return  # the reaper tries again when the kernel ends
            self._removal = WorkerProcess(process, None, self.given.reaper, lambda status: self._removed())

    def _removed(self) -> None:
        self.given.reaper.never(self._remove)
        shutil.rmtree(self._dir, ignore_errors=True)
