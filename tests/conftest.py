"""The run's one environment, the fixture `kernel` (the real `klbr` kernelspec, installed by `make
test`, started through jupyter_client), and a browser test module's chromium (`chromium_browser`,
`browser`; the module gives its own `lab`). Tests import their helpers from `utils.py` and `lab.py`,
never from here."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from utils import start_kernel, until

HERE = Path(__file__).parent
BEHAVIOURS = ("sigkill", "exit", "segfault", "ignore-sigint", "hang-in-c", "die-in-output", "complete",
              "exit-after-reply", "late-stdin", "output-then-die", "drops-is-complete", "drops-idle", "noisy",
              "small-iopub-queue")


@pytest.fixture(scope="session", autouse=True)
def environment():
    """What every kernel of the run sees, set before the first test and restored after the last: the
    test-only kernelspecs on JUPYTER_PATH, a KLBR_DB of the run and a TMPDIR of the run. Nothing reads
    them while tests are collected; the run's TMPDIR is the value."""
    with tempfile.TemporaryDirectory(prefix="klbr-test-specs-") as root, pytest.MonkeyPatch.context() as patch:
        # Test-only kernelspecs (misbehaving workers) are found through JUPYTER_PATH by the proxy:
        # tests/kernels as committed, and one spec per misbehaviour, written with absolute paths.
        worker = HERE / "workers" / "ipykernel_misbehaving.py"
        for behaviour in BEHAVIOURS:
            spec = Path(root, "kernels", f"misbehaving-{behaviour}")
            spec.mkdir(parents=True)
            extra = [str(Path(root, "complete-marker"))] if behaviour == "complete" else []
            # One is interrupted by a message, as some kernelspecs are: jupyter_client's manager
            # sends it on a control socket of its own, and the worker's answer goes there.
            by_message = {"interrupt_mode": "message"} if behaviour == "small-iopub-queue" else {}
            (spec / "kernel.json").write_text(json.dumps({
                "argv": [sys.executable, str(worker), behaviour, *extra, "-f", "{connection_file}"],
                "display_name": f"misbehaving worker: {behaviour}", "language": "python", **by_message,
            }))
        paths = [str(HERE), root] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        patch.setenv("JUPYTER_PATH", os.pathsep.join(paths))
        # Every kernel of the run records into a database of the run, never the user's own.
        patch.setenv("KLBR_DB", str(Path(root, "klbr.sqlite3")))
        # ... and makes its runtime directory in a temp dir of the run (see `no_runtime_dir_is_left`).
        # This process's own temp files stay where they were: tempfile has already read TMPDIR.
        tmp = Path(root, "tmp")
        tmp.mkdir()
        patch.setenv("TMPDIR", str(tmp))
        yield tmp


@pytest.fixture(scope="session", autouse=True)
def no_runtime_dir_is_left(environment):
    """However the run's kernels ended (shut down, SIGKILLed: then their reaper removes it), none
    leaves its runtime directory of sockets behind (semantics 5)."""
    yield
    until(lambda: not list(environment.glob("klbr-*")), 10,
          f"runtime directories left in the run's TMPDIR: {sorted(p.name for p in environment.glob('klbr-*'))}")


@pytest.fixture(scope="session")
def other_python() -> Path:
    """The interpreter of `.venv-ipykernel`: the oldest ipykernel klbr admits and nothing of klbr, for
    `python:` placements (`make test` makes it)."""
    other = HERE.parent / ".venv-ipykernel" / "bin" / "python"
    assert other.exists(), f"{other} is missing: `make test` creates it (make .venv-ipykernel/.ready)"
    return other


@pytest.fixture
def kernel():
    with start_kernel() as (km, kc):
        yield km, kc


@pytest.fixture(scope="module")
def chromium_browser():
    """One headless chromium for a browser test module."""
    from lab import chromium  # noqa: PLC0415 — Playwright and JupyterLab's helpers take 1.3 s to import: browser modules only

    with chromium() as browser:
        yield browser


@pytest.fixture
def browser(chromium_browser):
    """The module's chromium; what a test opened in it is closed after it."""
    contexts = len(chromium_browser.contexts)
    yield chromium_browser
    for context in chromium_browser.contexts[contexts:]:
        context.close()
