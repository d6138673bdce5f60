"""`make peers`: nbclient's and papermill's own test suites, run with klbr registered as `python3`.

Run by `make peers` (or `.venv/bin/python tests/peers/run.py [--plain] [--suite NAME] [-- PYTEST_ARGS]`).
It takes the nbclient and papermill versions installed in .venv, downloads their sdists from PyPI
(each ships its tests and its pytest configuration), installs the suites' test dependencies into a
venv of their own (.venv-peers: papermill's and nbclient's test extras bring pytest plugins that would
load into klbr's own suite, and pins that .venv does not share), and runs each suite with a
kernelspec named `python3` whose argv is klbr's, on a private JUPYTER_PATH. `--plain` runs the same
with plain ipykernel (on .venv's interpreter, so only the proxy differs) as `python3`.

It exits 0 only when exactly the tests listed in EXPECTED fail (those in TIMING may or may not): a
new failure, and an expected one that passes, both exit 1, so the list stays true. With PYTEST_ARGS
(a selection), only the expected failures among the tests that ran are checked. Each suite's output
and every klbr kernel's log are kept in build/peers/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from jupyter_core.paths import jupyter_path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
PEERS = REPO / ".venv-peers"
OUT = REPO / "build" / "peers"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")

# Each suite: its tests' path inside the sdist.
SUITES = {"nbclient": "tests", "papermill": "papermill/tests"}

# What the kernels and the clients are made of: installed in .venv-peers at .venv's versions, so the
# suites exercise the same client code that klbr's own tests do.
SAME_AS_VENV = ("nbclient", "papermill", "jupyter_client", "jupyter_core", "nbformat", "nbconvert",
                "ipykernel", "ipython", "ipywidgets", "comm", "pyzmq", "tornado", "traitlets", "pytest")

KLBR, PLAIN = "klbr", "plain"
# The failures that are not klbr's defects: by design (klbr only), or of this environment (both).
EXPECTED = {
    "nbclient": {
        "tests/test_client.py::TestExecute::test_kernel_death_during_execution": (
            {KLBR}, "by design: a worker that kills itself mid-cell is answered WorkerLost (an error "
            "reply, CellExecutionError) and a fresh generation takes over; nbclient expects "
            "DeadKernelError because plain ipykernel's process is gone"),
        "tests/test_client.py::TestExecute::test_error_notebook_hook": (
            {KLBR}, "by design: the same notebook; nbclient expects DeadKernelError with "
            "on_notebook_error and no on_cell_error, klbr's WorkerLost reply is a cell error"),
    },
    "papermill": {
        "papermill/tests/test_execute.py::TestBrokenNotebook2::test": (
            {KLBR, PLAIN}, "environment: broken2.ipynb imports IPython.core.display.display, gone in "
            "IPython 9 (.venv's workers run IPython 9; papermill's test extra pins ipython<9)"),
    },
}
# Tests that assert a timing and pass or fail by the machine's load: either outcome is accepted.
TIMING = {
    "nbclient": {},
    "papermill": {
        "papermill/tests/test_autosave.py::TestMidCellAutosave::test_end2end_autosave_slow_notebook": (
            {KLBR}, "timing: wants exactly 2 autosaves (1 s apart) in its one 2.5 s cell; klbr answers "
            "kernel_info before its first worker is ready, so the cell's first output comes 0.3-0.9 s "
            "after papermill's cell start (0.01 s on ipykernel) and a third autosave fits"),
    },
}


def kernelspec_dirs() -> dict[str, list[str]]:
    """What every kernelspec directory this machine's Jupyter would see holds: taken before and after
    a run (with the caller's environment) to show that nothing was installed outside the run's own."""
    dirs = set(jupyter_path("kernels")) | {str(Path.home() / ".local/share/jupyter/kernels")}
    return {d: sorted(os.listdir(d)) for d in sorted(dirs) if os.path.isdir(d)}


def sh(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=True, **kwargs)


def peers_venv(versions: dict[str, str]) -> Path:
    """.venv-peers with the suites' dependencies; made again when a version or requirements.txt changes."""
    wanted = "".join(f"{k}=={v}\n" for k, v in sorted(versions.items()))
    stamp = PEERS / f".ready-{hashlib.sha256((wanted + REQUIREMENTS.read_text()).encode()).hexdigest()[:12]}"
    if stamp.exists():
        return PEERS / "bin" / "python"
    print(f"== installing the suites' dependencies into {PEERS.relative_to(REPO)}", flush=True)
    if not (PEERS / "bin" / "python").exists():
        sh(getattr(sys, "_base_executable", sys.executable), "-m", "venv", PEERS)
    constraints = PEERS / "same-as-venv.txt"
    constraints.write_text(wanted)
    pip = [PEERS / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    sh(*pip, "-c", constraints, "-r", REQUIREMENTS, *(f"{k}=={v}" for k, v in sorted(versions.items())))
    for old in PEERS.glob(".ready-*"):
        old.unlink()
    stamp.touch()
    return PEERS / "bin" / "python"


def sources(python: Path, name: str, release: str) -> Path:
    """The suite's sdist from PyPI, unpacked once into .venv-peers/src."""
    src = PEERS / "src"
    root = src / f"{name}-{release}"
    if not (root / SUITES[name]).is_dir():
        src.mkdir(parents=True, exist_ok=True)
        sh(python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-binary", ":all:",
           "--no-deps", "--dest", src, f"{name}=={release}")
        with tarfile.open(src / f"{name}-{release}.tar.gz") as sdist:
            sdist.extractall(src, filter="data")
    return root


def private_jupyter(home: Path, mode: str) -> dict[str, str]:
    """The environment of a run: every Jupyter and IPython directory, HOME and klbr's store inside
    `home`, and a `python3` kernelspec there that is klbr (or plain ipykernel) on .venv's interpreter."""
    share = home / "share"
    (home / "home").mkdir()
    if mode == KLBR:
        sh(VENV / "bin" / "klbr-kernel", "install", "--prefix", share, "--name", "python3", stdout=subprocess.DEVNULL)
    else:
        sh(VENV / "bin" / "python", "-m", "ipykernel", "install", "--prefix", share, "--name", "python3",
           stdout=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "KLBR_", "IPYTHON", "PYTHONPATH", "VIRTUAL_ENV"))}
    env.update(
        JUPYTER_PATH=str(share / "share" / "jupyter"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        KLBR_DB=str(home / "klbr.sqlite3"),
        HOME=str(home / "home"),  # what the suites' libraries write there (~/.ipython, ~/.config) too
        VIRTUAL_ENV=str(PEERS),
        PATH=f"{PEERS / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",  # jupyter-execute, papermill
    )
    return env


def log_kernels_to(home: Path, path: Path) -> None:
    """Every klbr kernel of the run also writes its log to `path`, with its pid (traitlets'
    `logging_config`, in the run's jupyter_klbr_config.py); stderr still gets it, as pytest shows
    with a failure."""
    path.unlink(missing_ok=True)
    config = {
        "formatters": {"file": {"format": "%(asctime)s pid %(process)d %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(path), "formatter": "file"}},
        "loggers": {name: {"handlers": ["console", "file"] if name == "KlbrKernelApp" else ["file"]}
                    for name in ("KlbrKernelApp", "klbr_kernel", "klbr_supervisor")},
    }
    (home / "config").mkdir(exist_ok=True)
    (home / "config" / "jupyter_klbr_config.py").write_text(f"c.Application.logging_config = {config!r}\n")


def complaints(path: Path) -> list[tuple[int, str]]:
    """The kernels' warnings and errors, each kind once with its count (pids and paths left out)."""
    if not path.exists():
        return []
    kinds: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        match = re.search(r" (WARNING|ERROR|CRITICAL) (.*)", line)
        if match:
            kind = re.sub(r"\d+", "N", f"{match[1]} {match[2]}")[:160]
            kinds[kind] = kinds.get(kind, 0) + 1
    return sorted(((n, k) for k, n in kinds.items()), reverse=True)


def outcomes(report_log: Path) -> dict[str, str]:
    """Each test's outcome from pytest-reportlog's lines: passed, failed, error, skipped or xfailed."""
    phases: dict[str, dict[str, str]] = {}
    for line in report_log.read_text().splitlines():
        report = json.loads(line)
        if report.get("$report_type") == "CollectReport" and report["outcome"] == "failed":
            phases.setdefault(report["nodeid"] or "<collection>", {})["setup"] = "failed"
        if report.get("$report_type") != "TestReport":
            continue
        outcome = "xfailed" if report["outcome"] == "skipped" and "wasxfail" in report else report["outcome"]
        phases.setdefault(report["nodeid"], {})[report["when"]] = outcome
    result = {}
    for nodeid, phase in phases.items():
        if phase.get("setup") == "failed":
            result[nodeid] = "error"
        elif "skipped" in (phase.get("setup"), phase.get("call")):
            result[nodeid] = "skipped"
        elif phase.get("teardown") == "failed" and phase.get("call") != "failed":
            result[nodeid] = "error"
        else:
            result[nodeid] = phase.get("call", "error")
    return result


def run_suite(python: Path, name: str, release: str, mode: str, home: Path, env: dict, extra: list[str]) -> dict:
    """One suite under pytest, from its sdist's root (so its own pytest configuration applies); its
    output goes to the terminal and to build/peers/NAME-MODE.log, klbr's kernels' logs to
    build/peers/NAME-klbr-kernels.log."""
    root = sources(python, name, release)
    log, report_log = OUT / f"{name}-{mode}.log", OUT / f"{name}-{mode}.jsonl"
    kernels_log = OUT / f"{name}-{mode}-kernels.log"
    report_log.unlink(missing_ok=True)
    if mode == KLBR:
        log_kernels_to(home, kernels_log)
    argv = [str(python), "-m", "pytest", SUITES[name], "-p", "no:cacheprovider", "--color=no",
            # nbclient 0.11's pytest configuration turns warnings into errors and predates this option
            # of pytest-asyncio >= 0.24, whose absence is such a warning.
            "-o", "asyncio_default_fixture_loop_scope=function",
            "--timeout=300", f"--report-log={report_log}", *extra]
    print(f"\n== {name} {release} on {mode}: {' '.join(argv[1:])}  (in {root})", flush=True)
    start = time.monotonic()
    with open(log, "w") as out, subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        text = []
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
            text.append(line)
    seconds = time.monotonic() - start
    results = outcomes(report_log) if report_log.exists() else {}
    reruns = re.findall(r"^(\S+) failed \(\d+ runs remaining", "".join(text), re.M)
    return {"name": name, "release": release, "exit": proc.returncode, "seconds": seconds,
            "results": results, "reruns": reruns, "log": log, "complaints": complaints(kernels_log)}


def verdict(run: dict, mode: str, selection: bool) -> bool:
    """Print a suite's counts and failures; True when exactly the expected ones failed (of those
    run, for a `selection` of tests)."""
    results, expected = run["results"], {k: v for k, v in EXPECTED[run["name"]].items() if mode in v[0]}
    timing = {k: v for k, v in TIMING[run["name"]].items() if mode in v[0]}
    counts = {o: sum(1 for r in results.values() if r == o)
              for o in ("passed", "failed", "error", "skipped", "xfailed")}
    failing = sorted(k for k, r in results.items() if r in ("failed", "error"))
    counted = set(failing) - set(timing)
    print(f"{run['name']} {run['release']} on {mode}: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n)
          + f" in {run['seconds']:.0f} s (pytest exit {run['exit']}; log {run['log'].relative_to(REPO)})")
    for nodeid in failing:
        why = {**expected, **timing}[nodeid][1] if nodeid in {**expected, **timing} else "UNEXPECTED"
        print(f"  {results[nodeid]:6} {nodeid}\n         {why}")
    if selection:
        expected = {k: v for k, v in expected.items() if k in results}
    for nodeid in sorted(set(expected) - counted):
        print(f"  EXPECTED TO FAIL, {results.get(nodeid, 'not run')}: {nodeid}\n         ({expected[nodeid][1]})")
    for test in run["reruns"]:
        print(f"  rerun by @flaky after a failure: {test}")
    for count, kind in run["complaints"]:
        print(f"  kernels' log, {count}x: {kind}")
    ran = bool(results) and run["exit"] in (0, 1)
    return ran and counted == set(expected)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", action="store_true", help="plain ipykernel as python3, for comparison")
    parser.add_argument("--suite", choices=sorted(SUITES), action="append", help="only this suite (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the run's private Jupyter directories and cell log")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest, as -k NAME or -x")
    args = parser.parse_args()
    mode = PLAIN if args.plain else KLBR
    versions = {name: version(name) for name in SAME_AS_VENV}
    python = peers_venv(versions)
    OUT.mkdir(parents=True, exist_ok=True)
    before = kernelspec_dirs()
    home = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=OUT))
    try:
        env = private_jupyter(home, mode)
        runs = [run_suite(python, name, versions[name], mode, home, env, args.pytest_args)
                for name in args.suite or SUITES]
    finally:
        if args.keep:
            print(f"\nkept: {home} (Jupyter directories; the cell log is klbr.sqlite3)")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"\n== summary: python3 = {'plain ipykernel' if args.plain else 'klbr'}")
    ok = all([verdict(run, mode, bool(args.pytest_args)) for run in runs])  # noqa: C419 — a list: each prints
    if kernelspec_dirs() != before:
        print(f"kernelspecs outside the run changed: {before} -> {kernelspec_dirs()}")
        ok = False
    print("peers: as expected" if ok else "peers: NOT as expected (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
