"""Starting a local worker through jupyter_client, so that it cannot outlive the proxy.

The worker is an ordinary kernel started by `AsyncKernelManager` from a kernelspec; jupyter_client's
local provisioner already puts it in its own process group. Here we add what a supervised worker
needs on top: PR_SET_PDEATHSIG, a captured stderr tail for `WorkerStartFailed`, and the built-in
default spec "ipykernel on the proxy's own interpreter".
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import deque

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.provisioning import KernelProvisionerBase, LocalProvisioner

from . import prelaunch
from .prelaunch import die_with_parent

# The name under which `Supervisor.worker_kernel = ""` resolves: ipykernel on sys.executable.
OWN_INTERPRETER = "klbr-own-python"
# The same worker, started before the proxy's imports and adopted by `PrelaunchedProvisioner`.
PRELAUNCHED = "klbr-prelaunched"

class WorkerSpecs(KernelSpecManager):
    """Installed kernelspecs, plus the built-in one for ipykernel on this interpreter."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name in (OWN_INTERPRETER, PRELAUNCHED):
            metadata = {"debugger": True}
            if kernel_name == PRELAUNCHED:
                metadata["kernel_provisioner"] = {"provisioner_name": "klbr-prelaunched"}
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python {sys.version_info.major}.{sys.version_info.minor}",
                language="python",
                interrupt_mode="signal",
                resource_dir="",
                metadata=metadata,
            )
        return super().get_kernel_spec(kernel_name)


class PrelaunchedProvisioner(LocalProvisioner):
    """Adopts the worker `prelaunch.start` spawned: its connection file is loaded, never rewritten
    (the worker may not have read it yet), and its process becomes this provisioner's."""

    async def pre_launch(self, **kwargs):
        worker = prelaunch.current()
        if worker is None:
            raise RuntimeError("no prelaunched worker to adopt")
        km = self.parent
        km.load_connection_file(worker.connection_file)
        self.connection_info = km.get_connection_info()
        kwargs.pop("extra_arguments", None)
        return await KernelProvisionerBase.pre_launch(self, cmd=list(worker.process.args), **kwargs)

    async def launch_kernel(self, cmd, **kwargs):
        worker = prelaunch.take()
        self.process = worker.process
        self.pid = worker.process.pid
        self.pgid = os.getpgid(self.pid)
        self.cwd = os.getcwd()
        return self.connection_info


class StderrTail:
    """Copies a worker's stderr through to ours and keeps its last `limit` bytes.

    Read on the loop with add_reader; closed at EOF (when the worker and all it started are gone).
    """

    def __init__(self, pipe, limit: int = 8192):
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._tail: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        os.set_blocking(self._fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._read)
        self.closed = False

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        try:
            sys.stderr.buffer.write(data)
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        self._tail.append(data)
        self._size += len(data)
        while self._size - len(self._tail[0]) >= self._limit:
            self._size -= len(self._tail.popleft())

    def read_now(self) -> None:
        """Take in whatever the pipe holds right now (before reporting a tail)."""
        while not self.closed:
            before = self._size
            self._read()
            if self._size == before:
                break

    def text(self, max_lines: int = 20) -> str:
        data = b"".join(self._tail)[-self._limit :]
        lines = data.decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-max_lines:])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self._fd)
            self._pipe.close()


def popen_options() -> dict:
    """Keyword arguments for `AsyncKernelManager.start_kernel` that reach `subprocess.Popen`."""
    return {"stderr": subprocess.PIPE, "preexec_fn": die_with_parent(os.getpid())}
