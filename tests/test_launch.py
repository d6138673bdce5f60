"""Workers are launched without `preexec_fn`, die with the kernel by their own death signal, and the
adoption of the prelaunched worker is no public provisioner."""

from __future__ import annotations

import os
import shutil
import signal
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from jupyter_client.kernelspec import NoSuchKernel
from jupyter_client.manager import KernelManager

from utils import execute, process_gone, results, start_kernel, worker_pid

DEATH_SIGNAL = "import ctypes\nsig = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(sig))\nsig.value"
NO_PREEXEC = """
import subprocess
_init = subprocess.Popen.__init__
def refuse_preexec_fn(self, *args, **kwargs):
    if kwargs.get("preexec_fn") is not None:
        raise RuntimeError("preexec_fn is unsafe in a process with threads")
    _init(self, *args, **kwargs)
subprocess.Popen.__init__ = refuse_preexec_fn
"""


def _reaper_of(proxy: int) -> int:
    """The kernel's reaper: its child running reaper.py (in a session of its own)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == proxy and b"reaper.py" in cmdline:
            return int(pid)
    raise AssertionError("the kernel has no reaper")


@pytest.mark.parametrize("worker", ["prelaunched", "own interpreter", "a kernelspec"])
def test_every_kind_of_worker_dies_with_the_kernel_by_its_own_death_signal(tmp_path, worker):
    (tmp_path / "jupyter_klbr_config.py").write_text(NO_PREEXEC)
    options = ["--Supervisor.worker_kernel=misbehaving-exit"] if worker == "a kernelspec" else []
    tmp = tmp_path / "tmp"  # the kernel's own TMPDIR: with its reaper killed, nothing of klbr removes it
    tmp.mkdir()
    with start_kernel(extra_arguments=options, env={"JUPYTER_CONFIG_DIR": str(tmp_path), "TMPDIR": str(tmp)}) as (km, kc):
        if worker == "own interpreter":
            execute(kc, "%klbr restart")  # the supervisor launches this one, with preexec_fn refused
        _, outputs = execute(kc, DEATH_SIGNAL)
        assert results(outputs) == [str(int(signal.SIGKILL))]
        pid = worker_pid(kc)
        proxy = km.provisioner.process
        os.kill(_reaper_of(proxy.pid), signal.SIGKILL)  # so only the worker's own death signal is left
        os.kill(proxy.pid, signal.SIGKILL)
        proxy.wait(timeout=5)
        assert process_gone(pid, timeout=5), "the worker outlived its kernel"
    shutil.rmtree(tmp)  # the runtime directory the reaper would have removed


def test_klbrs_adopting_provisioner_is_not_a_public_entry_point(tmp_path):
    names = {ep.name for ep in entry_points(group="jupyter_client.kernel_provisioners")}
    assert "klbr-prelaunched" not in names
    spec = tmp_path / "kernels" / "names-klbr-provisioner"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text('{"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],'
                                      ' "display_name": "x", "language": "python",'
                                      ' "metadata": {"kernel_provisioner": {"provisioner_name": "klbr-prelaunched"}}}')
    os.environ["JUPYTER_PATH"] = f"{tmp_path}{os.pathsep}{os.environ['JUPYTER_PATH']}"
    try:
        # jupyter_client's own refusal: it warns that the provisioner 'klbr-prelaunched' is not
        # available and offers no such kernel (with the entry point, it started one that failed obscurely).
        with pytest.raises(NoSuchKernel):
            KernelManager(kernel_name="names-klbr-provisioner").start_kernel()
    finally:
        os.environ["JUPYTER_PATH"] = os.environ["JUPYTER_PATH"].split(os.pathsep, 1)[1]
