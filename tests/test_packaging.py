"""Installing from source, as a user does: from a clean copy of the repo, its sdist and the wheel built
from that sdist (`python -m build`), and `pip install git+file://` of a clone, each into a fresh venv,
give the `klbr` kernelspec and the JupyterLab extension enabled, and run a cell. A machine without
Node.js gets the kernel and one line saying why it has no extension.

Slow (two builds of the extension from its TypeScript, three venvs with JupyterLab): the builds and
installs run side by side, once for the module."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PYTHON = Path(sys.executable)
EXTENSION = "klbr-jupyterlab"
NOT_BUILT = "klbr-kernel: the JupyterLab extension was not built"
# A cell in the installed kernel, through the venv's own jupyter_client.
CELL = """
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="klbr", startup_timeout=120)
try:
    reply = kc.execute_interactive("import klbr_kernel; print(6 * 7, klbr_kernel.__file__)", timeout=120)
    print(reply["content"]["status"])
finally:
    kc.stop_channels()
    km.shutdown_kernel()
"""

VENV_INSTALL = """
import subprocess, sys, venv
venv.create(sys.argv[1], with_pip=True)
subprocess.run([f"{sys.argv[1]}/bin/python", "-m", "pip", "install", "-q", sys.argv[2], "jupyterlab"], check=True)
"""

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(1200)]


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=klbr", "-c", "user.email=klbr@localhost", *args],  # noqa: S607 — the machine's git, by name
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def clean_copy(into: Path) -> Path:
    """What git has of this checkout: its tracked files as they are on disk and the new ones it does not
    ignore, committed in a repository of their own (so the checkout's node_modules, bundle and venvs stay out)."""
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():  # a tracked file deleted on disk is not in the copy
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    git("init", "-q", cwd=into)
    git("add", "-A", cwd=into)
    git("commit", "-q", "-m", "clean copy", cwd=into)
    return into


def start(argv: list, log: Path, **kw) -> tuple[subprocess.Popen, Path]:
    return subprocess.Popen([str(a) for a in argv], stdout=log.open("w"), stderr=subprocess.STDOUT, **kw), log


def finish(*jobs: tuple[subprocess.Popen, Path]) -> None:
    for job, log in jobs:
        assert job.wait() == 0, f"{' '.join(job.args)} failed:\n{log.read_text()[-6000:]}"


def venv_install(venv: Path, what: str) -> list:
    """A fresh venv with `what` and JupyterLab (whose `jupyter labextension list` is checked)."""
    return [PYTHON, "-c", VENV_INSTALL, venv, what]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The clean copy, `python -m build` of it (the sdist, then the wheel from the sdist), and three fresh
    venvs: the wheel's, the sdist's, and `pip install git+file://` of the copy (a clone: no bundle in it)."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = clean_copy(tmp / "source")
    logs = tmp / "logs"
    logs.mkdir()
    clone = start(venv_install(tmp / "venv-clone", f"git+file://{source}"), logs / "clone.log", cwd=tmp)
    finish(start([PYTHON, "-m", "build", "-o", tmp / "dist", source], logs / "build.log"))
    (sdist,) = (tmp / "dist").glob("klbr_kernel-*.tar.gz")
    (wheel,) = (tmp / "dist").glob("klbr_kernel-*.whl")
    from_wheel = start(venv_install(tmp / "venv-wheel", str(wheel)), logs / "wheel.log", cwd=tmp)
    from_sdist = start(venv_install(tmp / "venv-sdist", str(sdist)), logs / "sdist.log", cwd=tmp)
    finish(clone, from_wheel, from_sdist)
    return {"sdist": sdist, "wheel": wheel, "build log": (logs / "build.log").read_text(), "tmp": tmp,
            "venvs": {"wheel": tmp / "venv-wheel", "sdist": tmp / "venv-sdist", "clone": tmp / "venv-clone"}}


def in_venv(venv: Path, *argv: str, home: Path) -> str:
    """A command of the venv with a Jupyter of its own: no data or config directory of the user's or
    the run's (JUPYTER_PATH names the tests' kernelspecs), started away from this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "PYTHONPATH")}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_CONFIG_DIR": str(home / "config")}
    home.mkdir(exist_ok=True)
    done = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=home, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv} in {venv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_sdist_holds_the_sources_and_the_bundle_never_node_modules(built):
    with tarfile.open(built["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"labextension/package.json", "labextension/yarn.lock", "labextension/.yarnrc.yml",
            "labextension/src/index.ts", "labextension/install.json", "hatch_build.py"} <= names
    assert not [n for n in names if "node_modules" in n or n.startswith(("labextension/lib/", "labextension/.yarn/"))]
    # Built while the sdist was made, so the wheel from it needed no Node.js.
    assert "labextension/dist/package.json" in names
    assert any(n.startswith("labextension/dist/static/remoteEntry.") for n in names)
    assert "klbr-kernel: building the JupyterLab extension" in built["build log"]
    # The wheel built from that sdist ships the bundle the sdist carried.
    shipped = zipfile.ZipFile(built["wheel"]).namelist()
    lab = f".data/data/share/jupyter/labextensions/{EXTENSION}/"
    assert {n.split(lab, 1)[1] for n in shipped if lab in n} == {
        n.split("labextension/dist/", 1)[1] for n in names if n.startswith("labextension/dist/")} | {"install.json"}


@pytest.mark.parametrize("how", ["wheel", "sdist", "clone"])
def test_an_install_from_source_has_the_kernel_and_the_extension_and_runs_a_cell(built, how):
    venv = built["venvs"][how]
    home = built["tmp"] / f"home-{how}"
    specs = json.loads(in_venv(venv, "jupyter", "kernelspec", "list", "--json", home=home))["kernelspecs"]
    assert Path(specs["klbr"]["resource_dir"]).is_relative_to(venv), specs["klbr"]
    assert specs["klbr"]["spec"]["display_name"] == "Python 3 (klbr)"
    listed = re.sub(r"\x1b\[[0-9;]*m", "", in_venv(venv, "jupyter", "labextension", "list", home=home))  # colours
    assert re.search(rf"{EXTENSION} v\S+ enabled\s+OK\b.*\(python, klbr-kernel\)", listed), listed
    out = in_venv(venv, "python", "-c", CELL, home=home)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("42 ")]
    assert Path(line.split(" ", 1)[1]).is_relative_to(venv), line  # the installed klbr, not this checkout
    assert out.splitlines()[-1] == "ok", out


@pytest.mark.parametrize("node", ["none", "too old"])
def test_without_node_the_wheel_has_the_kernel_and_says_why_it_has_no_extension(tmp_path, node):
    """A clone (no bundle in it) built where Node.js is missing or older than the build needs."""
    source = clean_copy(tmp_path / "source")
    tools = tmp_path / "bin"
    tools.mkdir()
    if node == "too old":
        (tools / "node").write_text("#!/bin/sh\necho v18.19.0\n")
        (tools / "node").chmod(0o755)
    # Only this venv's tools (hatchling among them) and that node, if any: Debian's is in /usr/bin.
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{PYTHON.parent}"}
    done = subprocess.run([PYTHON, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", tmp_path,
                           source], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if NOT_BUILT in ln]
    why = "no Node.js on PATH" if node == "none" else "Node.js v18.19.0 is older than 20.19"
    assert said == [f"{NOT_BUILT} ({why}); the kernel works without it. To get it, install Node.js 20.19 or newer "
                    "and install klbr-kernel again."]
    (wheel,) = tmp_path.glob("klbr_kernel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("share/jupyter/kernels/klbr/kernel.json") for n in names)
    assert "klbr_kernel/__main__.py" in names
    assert not [n for n in names if "labextensions" in n]
