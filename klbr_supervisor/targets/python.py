"""``python:/abs/path/to/python``: ipykernel on another interpreter or venv of this machine.

The same worker as klbr's own (`boot.worker.BOOTSTRAP`, as ``python -c``: no klbr needed there),
behind `boot.deathsig`. Before a session moves there the interpreter itself is asked whether it has
ipykernel.
"""

from __future__ import annotations

import asyncio
import os
from typing import Unpack

from jupyter_client.kernelspec import KernelSpec

from ..boot.placement import Placement, PlacementError
from ..boot.worker import BOOTSTRAP
from .base import NO_ENGINES, Engines, SshCommand, TargetArgs
from .managed import ManagedTarget

# A `python:PATH` placement's kernelspec name: PYTHON_AT + PATH.
PYTHON_AT = "klbr-python:"
PROBE = ("import importlib.util, sys\n"
         "sys.exit(0 if importlib.util.find_spec('ipykernel_launcher') else 3)\n")


class PythonTarget(ManagedTarget):
    shares_key = True  # this machine, this user
    warm = True
    asks_identity = False
    takes_klbr_options = True
    limits_memory = True
    drops_iopub = False  # klbr's bootstrap: its iopub has no mark

    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        self.kernel_name = PYTHON_AT + placement.python

    def environ(self) -> dict[str, str]:
        return dict(os.environ)

    def own_spec(self) -> KernelSpec:
        python = self.placement.python
        return KernelSpec(
            argv=[python, "-c", BOOTSTRAP, "-f", "{connection_file}"],  # ipykernel, iopub lossless
            display_name=f"Python ({python})", language="python", interrupt_mode="signal", resource_dir="",
            metadata={"debugger": self.given.debugger})

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        """The interpreter exists, runs, and has ipykernel (asked of it: `find_spec`, nothing run)."""
        path = placement.python
        if not os.path.exists(path):
            message = f"{placement}: {path} does not exist"
            raise PlacementError(message)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            message = f"{placement}: {path} is not an executable interpreter"
            raise PlacementError(message)
        try:
            proc = await asyncio.create_subprocess_exec(
                path, "-c", PROBE, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            message = f"{placement}: {path} cannot be run: {e.strerror or e}"
            raise PlacementError(message) from None
        try:
            async with asyncio.timeout(30):
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            message = f"{placement}: {path} did not answer within 30 s"
            raise PlacementError(message) from None
        if proc.returncode == 3:
            message = f"{placement}: {path} has no ipykernel; install it there ({path} -m pip install ipykernel)"
            raise PlacementError(message)
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            message = f"{placement}: {path} is not a Python interpreter that klbr can use: {tail[0]}"
            raise PlacementError(message)
