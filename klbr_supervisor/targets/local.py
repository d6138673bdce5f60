"""``local``: ipykernel on the proxy's own interpreter, or the kernelspec `Supervisor.worker_kernel` names.

The default worker is klbr's own: `python -m klbr_supervisor.boot.worker`, which arms its death
signal itself and publishes without a high-water mark. Generation 1 is usually already running when
the supervisor starts: `boot.prelaunch` spawned it before the proxy's imports, and this target adopts
it (`PrelaunchedProvisioner`) instead of starting another, so it is managed like any other.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any, Unpack

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from ..boot.early import Prelaunched
from ..boot.placement import Placement
from ..boot.prelaunch import worker_command
from .base import CommonArgs
from .managed import ManagedTarget, WorkerManager, installed_spec

# The name under which `Supervisor.worker_kernel = ""` resolves: ipykernel on sys.executable.
OWN_INTERPRETER = "klbr-own-python"
# The same worker, started before the proxy's imports and adopted by `PrelaunchedProvisioner`.
PRELAUNCHED = "klbr-prelaunched"


class LocalTarget(ManagedTarget):
    shares_key = True  # this machine, this user
    warm = True
    starts_early = True
    asks_identity = False

    def __init__(self, placement: Placement, *, worker_kernel: str = "", early: Prelaunched | None = None,
                 **kwargs: Unpack[CommonArgs]):
        super().__init__(placement, early=early, **kwargs)
        self._early = early
        self.kernel_name = PRELAUNCHED if early is not None else worker_kernel or OWN_INTERPRETER
        self.arms_itself = self.kernel_name in (OWN_INTERPRETER, PRELAUNCHED)

    @property
    def takes_klbr_options(self) -> bool:  # type: ignore[override]  # a ClassVar on Target, read per instance here
        """klbr's own worker does; a kernelspec does when its argv runs ipykernel."""
        if self.arms_itself:
            return True
        spec = installed_spec(self.kernel_name)
        return spec is not None and any("ipykernel" in word for word in spec.argv)

    @property
    def drops_iopub(self) -> bool:  # type: ignore[override]  # a ClassVar on Target, read per instance here
        """klbr's own worker publishes without a mark; a kernelspec's command keeps ipykernel's."""
        return not self.arms_itself

    @property
    def limits_memory(self) -> bool:  # type: ignore[override]
        """klbr's own worker applies the limit itself; a kernelspec's command is not ours."""
        return self.arms_itself

    def environ(self) -> dict[str, str]:
        return dict(os.environ)

    def own_spec(self) -> KernelSpec | None:
        if not self.arms_itself:
            return None
        return KernelSpec(
            argv=worker_command("{connection_file}"),
            display_name=f"Python {sys.version_info.major}.{sys.version_info.minor}",
            language="python", interrupt_mode="signal", resource_dir="",
            metadata={"debugger": self.given.debugger})

    def manager(self) -> WorkerManager:
        """For the prelaunched worker, one that adopts it.

        jupyter_client asks its provisioner factory (entry points) for a provisioner only when the
        manager has none yet, so the adopting provisioner is handed over directly and is no public
        entry point that a kernelspec could name outside klbr."""
        km = super().manager()
        if self._early is not None:
            km.kernel_id = str(uuid.uuid4())
            km.provisioner = PrelaunchedProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km)
            km.provisioner.early = self._early
        return km


class PrelaunchedProvisioner(LocalProvisioner):
    """Adopts the worker `boot.prelaunch.start` spawned: its connection file is loaded, never
    rewritten (the worker may not have read it yet), and its process becomes this provisioner's."""

    early: Prelaunched  # set by `LocalTarget.manager`

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        assert isinstance(km, WorkerManager)  # `LocalTarget.manager` makes it this provisioner's parent
        km.load_connection_file(self.early.connection_file)
        self.connection_info = km.get_connection_info()
        kwargs.pop("extra_arguments", None)  # it was started with them
        cmd = self.early.process.args
        assert isinstance(cmd, list)  # `boot.prelaunch.start` spawns it from `worker_command`'s list
        return await KernelProvisionerBase.pre_launch(self, cmd=list(cmd), **kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        worker = self.early.take()
        self.process = worker.process
        self.pid = worker.process.pid
        self.pgid = os.getpgid(self.pid)
        self.cwd = os.getcwd()
        return self.connection_info
