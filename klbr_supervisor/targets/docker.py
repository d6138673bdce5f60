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

from ..boot.docker_launch import Launch
from ..boot.early import EarlyDocker
from ..boot.placement import Placement, PlacementError
from .agent import LaunchedTarget
from .base import NO_ENGINES, CommonArgs, Engines, SshCommand
from .process import WorkerProcess


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


class DockerTarget(LaunchedTarget):
    _launch: Launch
    host_channel = "mounted"  # the supervisor's socket, one file mounted into the container

    def __init__(self, placement: Placement, *, early: EarlyDocker | None = None, worker_kernel: str = "",
                 **kwargs: Unpack[CommonArgs]):
        super().__init__(placement, early=early, worker_kernel=worker_kernel, **kwargs)
        given = self.given
        self._early = early
        self._launch = Launch(placement, given.engines.docker, given.engines.docker_options, given.link_timeout,
                              given.runtime_dir, given.number, self.key, self.session.signature_scheme, [])
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

    def adopt(self) -> subprocess.Popen[bytes] | None:
        self._launch.memory_limit = self.memory_limit
        if self._early is None:
            return None
        early = self._early.take()  # its lease is renewed from here on
        self._launch = early.launch
        self.given.reaper.at_end(self._launch.remove)  # a container outlives its docker run
        return early.process

    def spawn(self, extra_arguments: list[str], host: dict[str, str]) -> subprocess.Popen[bytes]:
        launch = self._launch
        launch.args, launch.host_channel, launch.client = extra_arguments, host, dict(self.given.client)
        self.given.reaper.at_end(launch.remove)  # a container outlives its docker run: removed if the kernel dies
        return launch.spawn()

    def close(self) -> None:
        """The generation has ended: the container goes, by name, whatever its docker run did."""
        if self._early is not None:
            self._early.discard()  # never taken (its start failed first): nothing of it stays
        super().close()
        if self._removal is None and os.path.isdir(self._launch.dir):
            try:
                process = subprocess.Popen(self._launch.remove, stdin=subprocess.DEVNULL,  # noqa: S603 — the configured docker, no shell
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                return  # the reaper tries again when the kernel ends
            self._removal = WorkerProcess(process, None, self.given.reaper, lambda status: self._removed())

    def _removed(self) -> None:
        self.given.reaper.never(self._launch.remove)
        shutil.rmtree(self._launch.dir, ignore_errors=True)
