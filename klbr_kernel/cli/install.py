"""Installing the `klbr` kernelspec with jupyter_client's KernelSpecManager."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any

import zmq
from jupyter_client.kernelspec import KernelSpecManager

LOGOS = ("logo-32x32.png", "logo-64x64.png")


def kernel_json(display_name: str = "Python 3 (klbr)", placement: str = "", debugger: bool = True) -> dict[str, Any]:
    """The spec `install` writes. It offers CurveZMQ (jupyter_client's `transport_encryption` then
    provisions keys) only when this interpreter's pyzmq has CURVE: the spec runs this interpreter,
    so what is checked here is what the kernel will have. (The spec the wheel ships, for an
    interpreter not known when it is built, offers no encryption.) `placement`, if any, goes on the
    kernel's command line: an ssh:// one then connects while the kernel starts (see
    `klbr_supervisor.boot.prelaunch`). Without the `debugger`, ``--Supervisor.debugger=False`` goes there
    too, and the metadata says no debugger: JupyterLab shows its debugger toggle by this metadata."""
    metadata: dict[str, Any] = {"debugger": debugger}
    if zmq.has("curve"):
        metadata["supported_encryption"] = ["curve"]
    where = [f"--Supervisor.placement={placement}"] if placement else []
    if not debugger:
        where.append("--Supervisor.debugger=False")
    return {
        "argv": [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}", *where],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "metadata": metadata,
    }


def _shipped_logos() -> list[str]:
    """The logos `pip install` put into this environment's share/jupyter/kernels/klbr, else those of
    the source tree this module is in (klbr_kernel/cli/ -> kernelspec/), if any."""
    found: list[str] = []
    for base in (os.path.join(sys.prefix, "share", "jupyter", "kernels", "klbr"),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "kernelspec")):
        for logo in LOGOS:
            path = os.path.join(base, logo)
            if os.path.exists(path) and logo not in {os.path.basename(p) for p in found}:
                found.append(path)
    return found


def install(
    *, user: bool = False, prefix: str | None = None, name: str = "klbr", display_name: str | None = None,
    placement: str = "", debugger: bool = True,
) -> str:
    """Write the kernelspec with this interpreter's absolute path; returns where it went."""
    with tempfile.TemporaryDirectory() as td:
        with open(os.path.join(td, "kernel.json"), "w") as f:
            json.dump(kernel_json(display_name or "Python 3 (klbr)", placement, debugger), f, indent=2)
        for logo in _shipped_logos():
            shutil.copy(logo, td)
        return KernelSpecManager().install_kernel_spec(td, name, user=user, prefix=prefix)
