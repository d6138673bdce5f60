"""Installing: the wheel ships every module and the kernelspec as shared data; `klbr-kernel install` writes it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import zmq

ROOT = Path(__file__).parent.parent


def test_the_wheel_ships_the_kernelspec_as_shared_data(tmp_path):
    # From a copy of the sources: a stale build/ directory would hide what the wheel leaves out.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", "build", ".git", "*.egg-info", "__pycache__",
                                                                "node_modules", ".yarn", ".venv-ipykernel"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True,
    )
    (wheel,) = tmp_path.glob("klbr_kernel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shared = [n for n in names if ".data/data/share/jupyter/kernels/klbr/" in n]
    assert {Path(n).name for n in shared} == {"kernel.json", "logo-32x32.png", "logo-64x64.png"}
    spec = json.loads(zipfile.ZipFile(wheel).read(next(n for n in shared if n.endswith("kernel.json"))))
    assert spec["argv"][1:] == ["-m", "klbr_kernel", "-f", "{connection_file}"]
    assert spec["interrupt_mode"] == "message" and spec["display_name"] == "Python 3 (klbr)"
    # Built for an interpreter it does not know: it does not offer CurveZMQ (`klbr-kernel install` may).
    assert "supported_encryption" not in spec["metadata"]
    # Every module of both packages, subpackages included (`pip install klbr-kernel` gets no other).
    modules = {str(p.relative_to(ROOT)) for pkg in ("klbr_kernel", "klbr_supervisor") for p in (ROOT / pkg).rglob("*.py")}
    assert modules - set(names) == set()
    # The JupyterLab extension as `make labextension` built it, every file of its bundle:
    # `pip install klbr-kernel` is all a user does for JupyterLab to load it.
    built = ROOT / "labextension" / "dist"
    assert (built / "package.json").exists(), "the extension is not built: `make labextension`"
    lab = ".data/data/share/jupyter/labextensions/klbr-jupyterlab/"
    shipped = {n.split(lab, 1)[1] for n in names if lab in n}
    bundle = {str(p.relative_to(built)) for p in built.rglob("*") if p.is_file()}
    assert shipped == bundle | {"install.json"}
    assert any(n.startswith("static/remoteEntry.") for n in shipped)
    meta = json.loads(zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(lab + "package.json"))))
    assert meta["name"] == "klbr-jupyterlab" and meta["jupyterlab"]["_build"]["load"].startswith("static/")


def test_install_writes_an_absolute_interpreter_path(tmp_path):
    subprocess.run([sys.executable, "-m", "klbr_kernel", "install", "--prefix", str(tmp_path), "--name", "klbr-test"], check=True)
    spec = json.loads((tmp_path / "share/jupyter/kernels/klbr-test/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and Path(spec["argv"][0]).is_absolute()
    # CurveZMQ is offered when the interpreter the spec runs has it (see tests/test_encryption.py).
    assert spec["metadata"].get("supported_encryption") == (["curve"] if zmq.has("curve") else None)
    assert (tmp_path / "share/jupyter/kernels/klbr-test/logo-64x64.png").exists()


def test_install_can_name_a_placement_and_refuses_one_that_is_no_spec(tmp_path):
    """A kernelspec for a remote machine: its placement on the kernel's command line (where an
    ssh:// one connects while the kernel starts)."""
    spec = "ssh://me@gpu-box:2222/opt/venv/bin/python"
    subprocess.run([sys.executable, "-m", "klbr_kernel", "install", "--prefix", str(tmp_path), "--name", "gpu-box",
                    f"--placement={spec}"], check=True)
    argv = json.loads((tmp_path / "share/jupyter/kernels/gpu-box/kernel.json").read_text())["argv"]
    assert argv[-1] == f"--Supervisor.placement={spec}"
    bad = subprocess.run([sys.executable, "-m", "klbr_kernel", "install", "--prefix", str(tmp_path), "--name", "bad",
                          "--placement=ssh://-oProxyCommand=x/usr/bin/python3"], check=False, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "is not a host name ssh can be given" in bad.stderr, bad.stderr
    assert not (tmp_path / "share/jupyter/kernels/bad").exists()


def test_install_without_the_debugger_says_so_in_the_metadata_jupyterlab_reads(tmp_path):
    """JupyterLab shows its debugger toggle by the kernelspec's `metadata.debugger`: off, the spec
    says no debugger and its command line turns the workers' off."""
    subprocess.run([sys.executable, "-m", "klbr_kernel", "install", "--prefix", str(tmp_path), "--name", "lean",
                    "--no-debugger"], check=True)
    spec = json.loads((tmp_path / "share/jupyter/kernels/lean/kernel.json").read_text())
    assert spec["metadata"]["debugger"] is False and spec["argv"][-1] == "--Supervisor.debugger=False"
    subprocess.run([sys.executable, "-m", "klbr_kernel", "install", "--prefix", str(tmp_path), "--name", "full"],
                   check=True)
    spec = json.loads((tmp_path / "share/jupyter/kernels/full/kernel.json").read_text())
    assert spec["metadata"]["debugger"] is True and "--Supervisor.debugger=False" not in spec["argv"]


def test_jupyter_lists_the_kernel():
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], check=True,
                         capture_output=True, text=True).stdout
    specs = json.loads(out)["kernelspecs"]
    assert specs["klbr"]["spec"]["display_name"] == "Python 3 (klbr)"
