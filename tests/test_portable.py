"""The portable path (`klbr_supervisor.system`'s POSIX way for each facility, what a Mac runs), forced
on Linux by taking Linux's calls away (`tests/portable.py`: no pidfds, no prctl, an empty /proc): a
session from its start to its shutdown, the kernel's parent SIGKILLed, the kernel SIGKILLed, two
kernels on one cell log. With them the two Linux defects the seam fixed: a refused pidfd stopped the
watch on the kernel's parent, and a kernel that /proc did not show was taken for dead. And no
Linux-only call outside the seam."""

from __future__ import annotations

import ast
import os
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

import portable
from utils import (
    collect,
    execute,
    hung_in_c,
    kill_quietly,
    launched,
    process_gone,
    results,
    start_kernel,
    status_rows,
    value,
    wait_for_stream,
    worker_pid,
)

ROOT = Path(__file__).parent.parent
SEAM = ROOT / "klbr_supervisor" / "system"
# What a Mac does not have, as klbr's code would name it: calls, constants, and paths of Linux's own.
LINUX_ONLY_NAMES = {"pidfd_open", "pidfd_send_signal", "P_PIDFD", "prctl", "PR_SET_PDEATHSIG", "waitid", "P_PID",
                    "WNOWAIT", "memfd_create", "eventfd", "splice", "sched_getaffinity", "sched_setaffinity", "epoll",
                    "inotify", "O_PATH", "signalfd", "RLIMIT_RTTIME", "malloc_trim"}
LINUX_ONLY_PATHS = ("/proc", "/sys/fs/cgroup")
# Code that cannot go through the seam, and why. The agent runs where its kernel runs (an ssh host, a
# container, a Slurm node), sent as one file's source with nothing of klbr beside it; it reads the
# memory cgroup it is in where one can be read (a container's: whether the engine killed the kernel
# for memory), and takes 0 kills anywhere else.
OUTSIDE_THE_SEAM = {ROOT / "klbr_supervisor" / "boot" / "agent.py"}
# Names a module outside the seam may use, and why. The worker's bootstrap is sent as source text to
# interpreters with no klbr too; it trims its heap after a flood where the C library has malloc_trim
# and does nothing where it has not (`memory_back_after_floods`), as `system.heap` does for the proxy.
ALLOWED_OUTSIDE = {ROOT / "klbr_supervisor" / "boot" / "bootstrap.py": {"malloc_trim"}}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of the kernel's own needs root, as CI has")


@pytest.fixture
def mac(tmp_path, monkeypatch):
    """The name of a kernelspec whose klbr runs as on a Mac."""
    monkeypatch.setenv("JUPYTER_PATH", portable.kernelspec(tmp_path, "klbr-portable")["JUPYTER_PATH"])
    return "klbr-portable"


@needs_root
def test_a_session_on_the_portable_path(mac, tmp_path):
    with start_kernel(mac, cwd=tmp_path) as (km, kc):
        # What the kernel's processes have here: no /proc, no pidfds.
        assert value(kc, "(__import__('os').listdir('/proc'), hasattr(__import__('os'), 'pidfd_open'))") == ([], False)
        _, outputs = execute(kc, "6 * 7")
        assert results(outputs) == ["42"]
        rows = status_rows(kc)
        # The worker's memory and where it runs, as psutil told them (nothing read from /proc).
        now = re.match(r"(\d+) MiB now, (\d+) MiB peak", rows["memory"])
        assert now and int(now[1]) > 0, rows["memory"]
        assert f"at {sys.executable}, cwd {tmp_path}" in rows["worker"], rows["worker"]
        # An interrupt.
        msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        # A lost worker, its exit seen without a pidfd, and the next generation.
        first = worker_pid(kc)
        reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)")
        assert reply["content"]["ename"] == "WorkerLost" and "SIGKILL" in reply["content"]["evalue"], reply["content"]
        assert process_gone(first)
        second = worker_pid(kc)
        assert second != first and int(status_rows(kc)["generation"]) > 1
        proxy = km.provisioner.process
    assert proxy.returncode == 0  # shut down, and it waited for its workers
    assert process_gone(second, timeout=5)


@needs_root
def test_a_memory_limit_the_system_does_not_enforce_is_held_by_the_samples(mac):
    """On Linux an allocation past RLIMIT_DATA fails in the cell (`tests/test_memory.py`); where the
    limit is taken and not enforced (macOS), the worker found past it is ended, and says why."""
    with start_kernel(mac, extra_arguments=["--Supervisor.memory_limit=256M"]) as (km, kc):
        reply, _ = execute(kc, "import time\nx = bytearray(512 << 20)\ntime.sleep(60)", timeout=60)
        content = reply["content"]
        assert content["ename"] == "WorkerLost" and "past its memory limit" in content["evalue"], content
        assert "of 256 MiB (Supervisor.memory_limit)" in content["evalue"]
        assert value(kc, "6 * 7") == 42  # the next generation serves


@pytest.mark.parametrize("system", [pytest.param("portable", marks=needs_root), "refused"])
def test_when_the_process_that_started_the_kernel_is_sigkilled_nothing_is_left(tmp_path, system):
    """The kernel watches the process in JPY_PARENT_PID without a pidfd: as on a Mac, or on a Linux
    whose pidfd_open is refused (valgrind, Linux before 5.3), where before it stopped watching and the
    kernel, its worker and a cell's child served on."""
    env = {**os.environ, **portable.kernelspec(tmp_path, "klbr-here", system=system)}
    code = "import os, subprocess\nchild = subprocess.Popen(['sleep', '600'])\nos.getpid(), child.pid"
    with launched("klbr-here", code, env) as (launcher, pids):
        launcher.kill()
        start = time.monotonic()
        launcher.wait()
        left = [pid for pid in pids if not process_gone(pid, timeout=10)]
        assert not left, f"kernel, worker, a cell's child: {left} outlived the process that started them"
        # The bar: nothing left after 2 s (0.14-0.19 s here under a load of 18 on 2 cores).
        assert time.monotonic() - start < 2


@needs_root
def test_when_the_kernel_is_sigkilled_its_workers_and_theirs_are_gone(mac, tmp_path):
    """No death signal here: the reaper ends the worker's group, hung in C and all."""
    # A cell log of its own: the cell left `running` is no other test's to recover.
    with start_kernel(mac, env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        pid, child = hung_in_c(kc, tmp_path)
        proxy = km.provisioner.process
        try:
            os.kill(proxy.pid, signal.SIGKILL)
            proxy.wait(timeout=5)
            assert process_gone(pid, timeout=10), "the worker outlived its kernel"
            assert process_gone(child, timeout=10), "the worker's child outlived the kernel"
        finally:
            kill_quietly(pid)
            kill_quietly(child)


@needs_root
@pytest.mark.parametrize("sees", [True, False], ids=["psutil shows it", "nothing shows it"])
def test_two_kernels_on_one_cell_log_leave_each_other_alone(tmp_path, monkeypatch, sees):
    """The second kernel's start closes the sessions of kernels that are gone. The first is not
    gone: shown by psutil, or by nothing but its pid (before, a kernel /proc did not show was taken
    for dead: its session closed, its running cell marked `unknown`)."""
    db, flag = tmp_path / "log.sqlite3", tmp_path / "go on"
    first = portable.kernelspec(tmp_path / "a", "klbr-first")["JUPYTER_PATH"]
    second = portable.kernelspec(tmp_path / "b", "klbr-second", psutil_sees=sees)["JUPYTER_PATH"]
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([first, second]))
    with start_kernel("klbr-first", env={"KLBR_DB": str(db)}) as (km, kc):
        msg_id = kc.execute(f"import os, time\nprint('running', flush=True)\nwhile not os.path.exists({str(flag)!r}):\n"
                            "    time.sleep(0.05)\n'done'")
        wait_for_stream(kc, msg_id)  # its row is `running`
        with start_kernel("klbr-second", env={"KLBR_DB": str(db)}) as (_, other):
            execute(other, "1")  # started: its recovery has run
            with sqlite3.connect(db) as log:
                ended, = log.execute("SELECT ended FROM sessions WHERE pid = ?", (km.provisioner.process.pid,)).fetchone()
                statuses = [s for (s,) in log.execute("SELECT status FROM cells WHERE code LIKE 'import os, time%'")]
            assert ended is None and statuses == ["running"], (ended, statuses)
        flag.touch()
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["status"] == "ok"


def _linux_only(path: Path, allowed: set[str] | None = None) -> list[str]:
    """The Linux-only names and paths in `path`'s code (its docstrings and comments aside), but
    the names `allowed` there."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in LINUX_ONLY_NAMES and name not in (allowed or set()):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and any(linux in node.value for linux in LINUX_ONLY_PATHS)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_linux_only_call_outside_the_seam():
    code = [p for package in ("klbr_kernel", "klbr_supervisor") for p in (ROOT / package).rglob("*.py")
            if SEAM not in p.parents and p not in OUTSIDE_THE_SEAM]
    assert [f for path in code for f in _linux_only(path, ALLOWED_OUTSIDE.get(path, set()))] == []
    # What it looks for is there to be found: the seam's Linux ways.
    assert len([f for path in SEAM.glob("*.py") for f in _linux_only(path)]) >= 5
