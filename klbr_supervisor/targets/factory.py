"""The target kind a parsed placement names, and one for a generation.

``local`` and ``kernelspec:NAME`` run jupyter_client's manager here when the kernelspec (for
``local``, `Supervisor.worker_kernel`'s) names jupyter_client's own provisioner or none; any other
provisioner is `provisioned` (a helper process per generation). ``python:``, ``ssh://``, ``docker://``
and ``slurm://`` are their own. A spec that names no placement is `Nowhere`: its check says why, so every start fails saying it,
never a silent fallback to ``local``.
"""

from __future__ import annotations

from typing import Any, Unpack

from ..boot.placement import Placement, PlacementError, parse
from .base import NO_ENGINES, Engines, GenerationArgs, LaunchError, OnExit, SshCommand, Target
from .docker import DockerTarget
from .kernelspec import KernelspecTarget
from .local import LocalTarget
from .managed import installed_spec
from .provisioned import ProvisionedTarget
from .python import PythonTarget
from .slurm import SlurmTarget
from .ssh import SshTarget

# jupyter_client's own provisioner: its kernel is a local process, and none of its calls block.
LOCAL_PROVISIONER = "local-provisioner"


class Nowhere(Target):
    """What a spec that names no placement runs on: nothing. Its check repeats why."""

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        parse(placement.spec)  # raises the PlacementError that made it nowhere
        message = f"{placement.spec!r} is no placement"
        raise PlacementError(message)

    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        message = f"{self.placement.spec!r} is no placement"
        raise LaunchError(message)

    pid = None

    async def interrupt(self) -> None:
        pass

    def signal(self, sig: int) -> None:
        pass

    def keep(self, data: bytes) -> None:
        pass

    def tail(self) -> str:
        return ""

    async def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def provisioner_name(kernel_name: str) -> str:
    """The provisioner an installed kernelspec names (jupyter_client's local one unless it says
    otherwise, or when it cannot be read: its launch says what is wrong with it)."""
    spec = installed_spec(kernel_name)
    provisioner = (spec.metadata or {}).get("kernel_provisioner") if spec is not None else None
    name = provisioner.get("provisioner_name") if isinstance(provisioner, dict) else None
    return name if isinstance(name, str) and name else LOCAL_PROVISIONER


def kind_for(placement: Placement, worker_kernel: str = "") -> type[Target]:
    """The kind of target `placement` names (for ``local``, with `Supervisor.worker_kernel`)."""
    if placement.kind == "python":
        return PythonTarget
    if placement.kind == "ssh":
        return SshTarget
    if placement.kind == "docker":
        return DockerTarget
    if placement.kind == "slurm":
        return SlurmTarget
    if placement.kind not in ("local", "kernelspec"):
        return Nowhere
    spec = placement.target if placement.kind == "kernelspec" else worker_kernel
    if spec and provisioner_name(spec) != LOCAL_PROVISIONER:
        return ProvisionedTarget
    return KernelspecTarget if placement.kind == "kernelspec" else LocalTarget


def target_for(placement: Placement, worker_kernel: str = "", **kwargs: Unpack[GenerationArgs]) -> Target:
    """The target of one generation on `placement` (`Target.__init__` takes `kwargs`)."""
    return kind_for(placement, worker_kernel)(placement, worker_kernel=worker_kernel, **kwargs)


async def check(placement: Placement, ssh: SshCommand, worker_kernel: str = "", engines: Engines = NO_ENGINES) -> None:
    """Whether a generation can start on `placement` at all; `PlacementError` says what is missing."""
    await kind_for(placement, worker_kernel).check(placement, ssh, engines)


async def problem(spec: object, ssh: SshCommand, engines: Engines = NO_ENGINES) -> str | None:
    """Why `spec` is no placement a generation can run on, or None (`host.relocate` asks)."""
    if not isinstance(spec, str):
        return "a placement spec is a string, as in python:/usr/bin/python3"
    try:
        await check(parse(spec), ssh, engines=engines)
    except PlacementError as e:
        return str(e)
    return None
