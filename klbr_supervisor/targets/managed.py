"""What three kinds share: a worker started by jupyter_client's kernel manager, in this process.

`local`, `python:` and `kernelspec:` with jupyter_client's own provisioner all start an ordinary
kernel with an `AsyncKernelManager` from a kernelspec; its local provisioner already puts it in a
process group of its own, and none of its calls block. Here is what a supervised worker needs on
top: the death signal (`boot.deathsig`, unless the command arms it itself), its stderr captured for
`WorkerStartFailed` and the ipc sockets in the kernel's private directory, the specs klbr builds
itself (a kind's `own_spec`), and the exit its pidfd reports (`process`), exact.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Unpack

import zmq.asyncio
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from ..boot import deathsig
from ..boot.placement import Placement
from .base import LaunchError, OnExit, Target, TargetArgs
from .process import WorkerProcess


class WorkerSpecs(KernelSpecManager):
    """The installed kernelspecs, and the one a target builds itself under its own name."""

    def __init__(self, own: dict[str, KernelSpec] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._own = own or {}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        own = self._own.get(kernel_name)
        return own if own is not None else super().get_kernel_spec(kernel_name)


class WorkerManager(AsyncKernelManager):
    """jupyter_client's manager for one generation's worker, as the supervisor launches it."""

    arms_itself = False  # its command arms the death signal itself (klbr's own worker)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        return cmd if self.arms_itself else deathsig.command(os.getpid(), cmd)


def installed_spec(name: str) -> KernelSpec | None:
    """The installed kernelspec `name`, or None (missing, or unreadable: its launch says why)."""
    try:
        return KernelSpecManager().get_kernel_spec(name)
    except Exception:
        return None


class ManagedTarget(Target):
    """A kernel whose process is ours, started by jupyter_client's manager in this process. Its
    exit is exact (a pidfd); its process group is the reaper's."""

    remote = False
    arms_itself = False  # see `WorkerManager`

    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        self._km: WorkerManager | None = None
        self._process: WorkerProcess | None = None

    @property
    def places_client(self) -> bool:
        """Every worker but klbr's own: a `python:` venv, a kernelspec, of any interpreter, may have no klbr."""
        return not self.arms_itself

    def own_spec(self) -> KernelSpec | None:
        """The kernelspec this kind builds itself for `kernel_name` (None: an installed one)."""
        return None

    def manager(self) -> WorkerManager:
        """The manager that launches this generation's worker, on ipc sockets in the private dir."""
        own = self.own_spec()
        given = self.given
        km = WorkerManager(
            kernel_name=self.kernel_name, kernel_spec_manager=WorkerSpecs({self.kernel_name: own} if own else None),
            session=self.session,
            # Shadows the supervisor's context: no ZMQ threads of its own per generation.
            context=zmq.asyncio.Context.shadow(given.context.underlying),
            # ipc: local, faster than loopback tcp, and files only we can reach in our private dir
            transport="ipc", ip=f"{given.runtime_dir}/gen{given.number}",
            connection_file=f"{given.runtime_dir}/worker-{given.number}.json")
        km.arms_itself = self.arms_itself
        return km

    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        self._km = self.manager()
        try:
            await self._km.start_kernel(extra_arguments=extra_arguments, env=env, stderr=subprocess.PIPE)
        except Exception as e:
            await self.release()
            raise LaunchError(str(e) or type(e).__name__) from e
        provisioner = self._km.provisioner
        process = getattr(provisioner, "process", None)
        if process is None:  # a local provisioner's subclass that keeps no process
            await self.release()
            message = f"its provisioner ({type(provisioner).__name__}) reports no local process to watch"
            raise LaunchError(message)
        # Read as `process` is: a local provisioner keeps both, and jupyter_client declares them
        # untyped (None) on the class.
        pgid: int | None = getattr(provisioner, "pgid", None)
        self._process = WorkerProcess(process, pgid, self.given.reaper, on_exit)
        info: dict[str, Any] = dict(self._km.get_connection_info())
        return info

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def interrupts_by_message(self) -> bool:
        """jupyter_client's manager sends a message-mode interrupt on a control socket of its own."""
        return self._km is not None and self._km.kernel_spec is not None and \
            self._km.kernel_spec.interrupt_mode == "message"

    async def interrupt(self) -> None:
        if self._km is not None:
            await self._km.interrupt_kernel()

    def signal(self, sig: int) -> None:
        if self._process is not None:
            self._process.killpg(sig)

    def keep(self, data: bytes) -> None:
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.keep(data)

    def tail(self) -> str:
        return self._process.tail() if self._process is not None else ""

    async def release(self) -> None:
        """The manager's connection file, ipc files and control socket go with the generation."""
        if self._km is None:
            return
        try:
            await self._km.cleanup_resources()
        except Exception:
            self.given.log.exception("cleaning up a worker's kernel manager failed")

    def close(self) -> None:
        if self._process is not None:
            self._process.close()  # whatever the worker started goes with it
        self.remove_client()

