"""Starting a local worker through jupyter_client, so that it cannot outlive the proxy.

The worker is an ordinary kernel started by an `AsyncKernelManager` from a kernelspec; jupyter_client's
local provisioner already puts it in its own process group. Here we add what a supervised worker
needs on top: the death signal (see `deathsig`), a captured stderr tail for `WorkerStartFailed`, the
built-in default spec "ipykernel on the proxy's own interpreter", and the adoption of the worker that
`prelaunch` started before the proxy's imports.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import deque

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerBase, LocalProvisioner

from .boot import deathsig, prelaunch
from .boot.worker import BOOTSTRAP

# The name under which `Supervisor.worker_kernel = ""` resolves: ipykernel on sys.executable.
OWN_INTERPRETER = "klbr-own-python"
# The same worker, started before the proxy's imports and adopted by `PrelaunchedProvisioner`.
PRELAUNCHED = "klbr-prelaunched"
# `python:PATH` placements: ipykernel on the interpreter PATH, under the name PYTHON_AT + PATH.
PYTHON_AT = "klbr-python:"


def kernel_name_for(placement, worker_kernel: str) -> str:
    """The kernelspec name a generation on `placement` launches (`Supervisor.worker_kernel` for local)."""
    if placement.kind == "python":
        return PYTHON_AT + placement.target
    if placement.kind == "kernelspec":
        return placement.target
    if placement.kind == "ssh":
        return "klbr-ssh"  # no kernelspec: the agent starts ipykernel there
    return worker_kernel or OWN_INTERPRETER


def takes_ipykernel_options(kernel_name: str) -> bool:
    """Whether the worker is an ipykernel, which takes `--Session.session` and friends on its
    command line: klbr's own specs, or a kernelspec whose argv runs ipykernel."""
    if kernel_name in (OWN_INTERPRETER, PRELAUNCHED) or kernel_name.startswith(PYTHON_AT):
        return True
    try:
        argv = WorkerSpecs().get_kernel_spec(kernel_name).argv
    except Exception:
        return False
    return any("ipykernel" in a for a in argv)


def provisioner_name(kernel_name: str) -> str:
    """The provisioner a kernelspec names (jupyter_client's local one unless it says otherwise)."""
    if kernel_name in (OWN_INTERPRETER, PRELAUNCHED) or kernel_name.startswith(PYTHON_AT):
        return "local-provisioner"
    try:
        metadata = WorkerSpecs().get_kernel_spec(kernel_name).metadata or {}
    except Exception:
        return "local-provisioner"  # the launch says what is wrong with it
    provisioner = metadata.get("kernel_provisioner")
    name = provisioner.get("provisioner_name") if isinstance(provisioner, dict) else None
    return name if isinstance(name, str) and name else "local-provisioner"


class WorkerSpecs(KernelSpecManager):
    """Installed kernelspecs, plus the built-in ones: ipykernel on this interpreter, or on the
    interpreter of a `python:` placement."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name in (OWN_INTERPRETER, PRELAUNCHED):
            return KernelSpec(
                argv=prelaunch.worker_command("{connection_file}"),
                display_name=f"Python {sys.version_info.major}.{sys.version_info.minor}",
                language="python",
                interrupt_mode="signal",
                resource_dir="",
                metadata={"debugger": True},
            )
        if kernel_name.startswith(PYTHON_AT):
            python = kernel_name[len(PYTHON_AT):]
            return KernelSpec(
                argv=[python, "-c", BOOTSTRAP, "-f", "{connection_file}"],  # ipykernel, iopub lossless
                display_name=f"Python ({python})",
                language="python",
                interrupt_mode="signal",
                resource_dir="",
                metadata={"debugger": True},
            )
        return super().get_kernel_spec(kernel_name)


class WorkerManager(AsyncKernelManager):
    """jupyter_client's manager for one generation's worker, as the supervisor launches it."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.kernel_name in (OWN_INTERPRETER, PRELAUNCHED):
            return cmd  # `klbr_supervisor.boot.worker` arms the death signal itself
        return deathsig.command(os.getpid(), cmd)


def worker_manager(kernel_name: str, **kwargs) -> WorkerManager:
    """A manager for `kernel_name`; for `PRELAUNCHED`, one that adopts the prelaunched worker.

    jupyter_client asks its provisioner factory (entry points) for a provisioner only when the manager
    has none yet, so the adopting provisioner is handed over directly and is no public entry point
    that a kernelspec could name outside klbr (issue I, defect 7)."""
    km = WorkerManager(kernel_name=kernel_name, kernel_spec_manager=WorkerSpecs(), **kwargs)
    if kernel_name == PRELAUNCHED:
        km.kernel_id = str(uuid.uuid4())
        km.provisioner = PrelaunchedProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km)
    return km


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

    def _read(self) -> int:
        """Read what the pipe has (the loop calls this when it is readable); bytes read."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if not data:
            self.close()
            return 0
        try:
            sys.stderr.buffer.write(data)
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        self.keep(data)
        return len(data)

    def keep(self, data: bytes) -> None:
        """Add `data` to the tail (also what the worker published on iopub about no request)."""
        self._tail.append(data)
        self._size += len(data)
        while self._size - len(self._tail[0]) >= self._limit:
            self._size -= len(self._tail.popleft())

    def read_now(self) -> None:
        """Take in whatever the pipe holds right now (before reporting a tail)."""
        while not self.closed and self._read():
            pass

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
    return {"stderr": subprocess.PIPE}
