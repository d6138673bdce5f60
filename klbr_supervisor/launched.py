"""A launched worker, as its generation holds it: the one seam between a generation and any target.

Whatever runs the kernel, a generation gets the same handle: `launch` (connection info, or a
`LaunchError` saying why not), `interrupt`, `signal` (SIGTERM asks it to end, SIGKILL ends it), a
stderr tail, and one end reported once through `on_exit(status)`: an exit status, or None when the
worker's exit could not be known (its link ended first; the generation calls that a lost link).

- `LocalWorker`: a kernel whose process is ours, started by jupyter_client's manager in this process
  (``local``, ``python:``, and kernelspecs with jupyter_client's local provisioner). Its exit is
  exact (a pidfd); its process group is the reaper's.
- `provisioned.ProvisionedWorker`: any other provisioner, run in a helper process off this loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from jupyter_client.session import Session

from .launch import popen_options, provisioner_name, worker_manager
from .process import WorkerProcess
from .boot.reaper import Reaper

# jupyter_client's own provisioner: its kernel is a local process, and none of its calls block.
LOCAL_PROVISIONER = "local-provisioner"


class LaunchError(Exception):
    """The worker could not be launched; the text says why."""


class LocalWorker:
    remote = False  # its process is here: an exit status is always known

    def __init__(self, kernel_name: str, *, session: Session, context, runtime_dir: str, number: int,
                 reaper: Reaper, on_exit: Callable[[int | None], None], log: logging.Logger, **_):
        self._km = worker_manager(
            kernel_name,
            session=session,
            context=context,
            # ipc: local, faster than loopback tcp, and files only we can reach in our private dir
            transport="ipc",
            ip=f"{runtime_dir}/gen{number}",
            connection_file=f"{runtime_dir}/worker-{number}.json",
        )
        self._reaper = reaper
        self._on_exit = on_exit
        self._log = log
        self._process: WorkerProcess | None = None

    async def launch(self, extra_arguments: list[str], env: dict[str, str]) -> dict:
        """Start the kernel; its connection info."""
        try:
            await self._km.start_kernel(extra_arguments=extra_arguments, env=env, **popen_options())
        except Exception as e:
            await self.release()
            raise LaunchError(str(e) or type(e).__name__) from e
        provisioner = self._km.provisioner
        process = getattr(provisioner, "process", None)
        if process is None:  # a local provisioner's subclass that keeps no process
            await self.release()
            raise LaunchError(f"its provisioner ({type(provisioner).__name__}) reports no local process to watch")
        self._process = WorkerProcess(process, provisioner.pgid, self._reaper, self._on_exit)
        return self._km.get_connection_info()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def interrupt(self) -> None:
        """As its kernelspec says: SIGINT to the group, or a control interrupt_request."""
        await self._km.interrupt_kernel()

    def signal(self, sig: int) -> None:
        if self._process is not None:
            self._process.killpg(sig)

    def keep(self, data: bytes) -> None:
        """Add to its stderr tail (what it published about no request)."""
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.keep(data)

    def tail(self) -> str:
        return self._process.tail() if self._process is not None else ""

    async def release(self) -> None:
        """The manager's connection file, ipc files and control socket go with the generation."""
        try:
            await self._km.cleanup_resources()
        except Exception:
            self._log.exception("cleaning up a worker's kernel manager failed")

    def close(self) -> None:
        if self._process is not None:
            self._process.close()  # whatever the worker started goes with it


def worker_for(kernel_name: str, placement, **kwargs):
    """The handle that can launch a generation's worker: here, through a helper process for a
    provisioner that may block (gateway_provisioners' shutdown waits on a `Popen`, its SSH path on
    paramiko), or over ssh."""
    if placement.kind == "ssh":
        from .ssh import SshWorker

        return SshWorker(placement, **kwargs)
    if provisioner_name(kernel_name) == LOCAL_PROVISIONER:
        return LocalWorker(kernel_name, **kwargs)
    from .provisioned import ProvisionedWorker

    return ProvisionedWorker(kernel_name, **kwargs)
