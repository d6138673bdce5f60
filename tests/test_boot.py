"""`klbr_supervisor.boot` runs with the standard library only: before the kernel's imports (the
prelaunch), as a watchdog under ``python -I -S`` (the reaper), in front of any kernelspec's command
(deathsig), or on a remote host that has no klbr (the ssh agent). Each of its modules is imported here
by an interpreter that cannot import any third-party package, and is read for the imports it defers.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from klbr_kernel import client_package
from klbr_supervisor.boot.agent_launch import (
    AGENT,
    CHANNELS,
    PIPE_CAPACITY,
    READ_FIRST_LINE,
    first_line,
    spawn,
    start_line,
)
from klbr_supervisor.boot.groups import end_process
from klbr_supervisor.boot.worker import BOOTSTRAP, NOTICE
from utils import process_gone

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "klbr_supervisor" / "boot"
MODULES = sorted(f"klbr_supervisor.boot.{path.stem}" for path in BOOT.glob("*.py") if path.stem != "__init__")
# The seam's parts a worker arms before anything else is imported (`boot.worker`, `boot.deathsig`),
# or that claim the standard library only: boot may import them, and they import as boot does.
SEAM = ("klbr_supervisor.system", "klbr_supervisor.system.death", "klbr_supervisor.system.watch")
# Run with no site-packages (-S), no user site or environment (-I): only the standard library, and
# the source tree added by hand.
BARE = [sys.executable, "-I", "-S"]
IMPORT = """\
import importlib, json, sys
sys.path.insert(0, {root!r})
before = set(sys.modules)
importlib.import_module({module!r})
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _ours_or_stdlib(name: str) -> bool:
    return (name.split(".", maxsplit=1)[0] in sys.stdlib_module_names or name in ("klbr_supervisor", "klbr_supervisor.boot")
            or name.startswith("klbr_supervisor.boot.") or name in SEAM)


def test_the_bare_interpreter_has_no_third_party_package():
    """What makes the test below mean something: pyzmq (which the venv has) is not importable there."""
    __import__("zmq")
    done = subprocess.run([*BARE, "-c", "import zmq"], check=False, capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'zmq'" in done.stderr, done.stderr


@pytest.mark.parametrize("module", MODULES + list(SEAM[1:]))
def test_a_boot_module_imports_with_the_standard_library_only(module):
    done = subprocess.run([*BARE, "-c", IMPORT.format(root=str(ROOT), module=module)], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    outside = [name for name in json.loads(done.stdout) if not _ours_or_stdlib(name)]
    assert not outside, f"{module} imports {outside}"


# What a module running in a worker imports once it runs there: ipykernel's own dependencies (the
# bootstrap imports ipykernel itself by name, as it finds each version).
IN_THE_WORKER = {"klbr_supervisor.boot.bootstrap": {"zmq", "tornado.ioloop"}}


@pytest.mark.parametrize("module", MODULES)
def test_what_a_boot_module_imports_later_is_the_standard_library_or_boot_too(module):
    """Imports inside functions (the prelaunch defers some, for its start) run only on some paths."""
    path = BOOT / f"{module.rsplit('.', 1)[1]}.py"
    outside = []
    allowed = IN_THE_WORKER.get(module, set())
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            outside += [alias.name for alias in node.names if not _ours_or_stdlib(alias.name)
                        and alias.name not in allowed]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and not _ours_or_stdlib(node.module or "") and node.module not in allowed:
                outside.append(node.module)
            elif node.level > 1:  # out of boot, into the rest of klbr_supervisor
                outside.append("." * node.level + (node.module or ""))
    assert not outside, f"{module} imports {outside}"


# -- the worker bootstrap, run as its worker runs it: its source, on the oldest and newest ipykernel --

PARTS = """\
import json, os, resource, signal
from ipykernel.kernelapp import IPKernelApp
from ipykernel.ipkernel import IPythonKernel
from ipykernel import iostream
import ipykernel
def now():
    return {{"init_iopub": IPKernelApp.init_iopub, "write": iostream.OutStream.write,
            "flush": iostream.OutStream.flush, "init_sockets": IPKernelApp.init_sockets,
            "signal": signal.signal}}
before = now()
bootstrap = {{"__name__": "klbr_bootstrap"}}
exec(compile({source!r}, "bootstrap", "exec"), bootstrap)
imported = now()
os.environ["KLBR_MEMORY_LIMIT"] = str(8 << 30)
limit = bootstrap["limit_memory"]()
for part in ("interrupts_land", "lossless_iopub", "flush_by_size", "memory_back_after_floods", "flush_only_what_waits",
             "shell_on_main_thread"):
    bootstrap[part]()
after = now()
del IPKernelApp.init_iopub
bootstrap["lossless_iopub"]()
print(json.dumps({{
    "version": ipykernel.version_info[0], "limit": limit, "rlimit": resource.getrlimit(resource.RLIMIT_DATA)[0],
    "left_in_environ": "KLBR_MEMORY_LIMIT" in os.environ,
    "changed_by_import": sorted(name for name in before if imported[name] is not before[name]),
    "changed": sorted(name for name in before if after[name] is not before[name]),
}}))
"""


@pytest.mark.parametrize("python", [sys.executable, str(ROOT / ".venv-ipykernel" / "bin" / "python")],
                         ids=["newest", "oldest"])
def test_each_part_of_the_worker_bootstrap_applies_where_it_runs_and_says_what_it_cannot(python):
    """The bootstrap as a worker without klbr gets it (`worker.BOOTSTRAP`, its source): imported it
    changes nothing; each part then changes what it is for (ipykernel 7 alone serves shell on its
    main thread); the memory limit becomes RLIMIT_DATA and leaves the environment; and a part
    whose target this ipykernel lacks says so on stderr, once, with the NOTICE the kernel's log keeps."""
    done = subprocess.run([python, "-c", PARTS.format(source=BOOTSTRAP)], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["changed_by_import"] == [] and found["limit"] == found["rlimit"] == 8 << 30
    assert not found["left_in_environ"]
    seven = found["version"] == 7
    assert found["changed"] == sorted(["init_iopub", "write", "flush", "signal"] + (["init_sockets"] if seven else []))
    said = [line for line in done.stderr.splitlines() if line.startswith(NOTICE)]
    assert len(said) == 1 and "IPKernelApp has no init_iopub" in said[0], done.stderr


def test_the_reaper_at_its_pipes_end_kills_its_groups_runs_its_commands_and_removes_the_directory(tmp_path):
    """What the reaper does once its kernel is gone, with what it defers until then (json, subprocess,
    shutil) imported only then: a watched group killed, a command kept run, a forgotten one not."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "kernel.json").write_text("{}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    reaper = subprocess.Popen([*BARE, str(BOOT / "reaper.py"), str(runtime)], stdin=subprocess.PIPE)
    kept, forgotten = tmp_path / "kept", tmp_path / "forgotten"
    touch = [sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"]
    lines = [f"+{sleeper.pid}", f"+{json.dumps([*touch, str(kept)])}", f"+{json.dumps([*touch, str(forgotten)])}",
             f"-{json.dumps([*touch, str(forgotten)])}", "+not-a-group"]
    assert reaper.stdin is not None
    reaper.stdin.write("".join(line + "\n" for line in lines).encode())
    reaper.stdin.close()
    assert reaper.wait(timeout=60) == 0
    assert sleeper.wait(timeout=10) == -9
    assert kept.exists() and not forgotten.exists() and not runtime.exists()


def test_an_agent_that_cannot_start_its_kernel_leaves_nothing_where_it_ran(tmp_path):
    """ssh binds the host channel's socket on the remote as it connects, before the agent runs; an
    agent on an interpreter without ipykernel said so and left that socket in the remote's /tmp, one
    per failed generation (a placement without ipykernel: one per cell)."""
    socket = tmp_path / "klbr-agent.host"
    socket.touch()  # as sshd's listener leaves its path
    start = {"dir": str(tmp_path / "klbr-agent"), "host_socket": str(socket), "channels": {}}
    done = subprocess.run([*BARE, "-c", READ_FIRST_LINE], input=first_line(AGENT) + start_line(start),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "has no ipykernel" in json.loads(done.stdout)["failed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@contextmanager
def _agent_serving(tmp_path, agent_source: str = AGENT):
    """An agent here, its kernel started (no parent poller: the kernel ends by the agent's hand or
    not at all), the host channel's socket as sshd leaves its path: the agent and its kernel."""
    socket = tmp_path / "klbr-agent.host"
    socket.touch()
    start = {"dir": str(tmp_path / "klbr-agent"), "host_socket": str(socket), "key": "k",
             "signature_scheme": "hmac-sha256", "bootstrap": BOOTSTRAP, "channels": CHANNELS, "lease": 120,
             "args": ["--IPKernelApp.parent_handle=0"]}
    agent = subprocess.Popen([sys.executable, "-c", READ_FIRST_LINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    kernel = None
    try:
        assert agent.stdin is not None and agent.stdout is not None  # pipes, as asked
        agent.stdin.write(first_line(agent_source) + start_line(start))
        agent.stdin.flush()
        started = json.loads(agent.stdout.readline())  # once the kernel's sockets exist
        assert (tmp_path / "klbr-agent" / "kernel.json").exists()
        kernel = psutil.Process(started["started"])
        yield agent, kernel
    finally:
        agent.kill()
        if kernel is not None and kernel.is_running():
            kernel.kill()  # a test that failed with it running: it has no poller to end it


def _ended(kernel: psutil.Process) -> None:
    """Wait until `kernel` has ended: gone, or a zombie its parent (stopped, or an init that reaps no
    orphans) has not reaped."""
    assert process_gone(kernel.pid, timeout=30), f"the kernel {kernel.pid} still runs"


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP])
def test_an_agent_ended_from_outside_ends_its_kernel_and_leaves_nothing_where_it_ran(tmp_path, ending):
    """A Slurm job step cancelled (``scancel``, its time limit, a preemption) gets SIGTERM, as a
    container does from ``docker stop``: the agent died of it at once and left its directory (the
    connection file with its key, the host client's files) and the host channel's socket in the
    node's /tmp, one per cancelled job. It ends its kernel, removes both, then dies of that signal."""
    with _agent_serving(tmp_path) as (agent, kernel):
        agent.send_signal(ending)
        _, said = agent.communicate(timeout=60)
    assert agent.returncode == -ending, said
    assert f"klbr agent: ended by {ending.name}; its kernel, if it had one, with it" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    _ended(kernel)


@pytest.mark.parametrize("agent_too", [True, False], ids=["with its agent", "alone"])
def test_a_kernel_ended_by_sigterm_is_its_exit_unless_its_agent_is_ended_too(tmp_path, agent_too):
    """``scancel`` signals every process of the step: a kernel that died of it first was reported
    as its exit, a WorkerLost with a new job for the next cell, where a cancelled step is a lost
    placement (the scheduler's words, and no new job until the user asks). A kernel that dies of
    SIGTERM alone is still its exit, reported."""
    with _agent_serving(tmp_path) as (agent, kernel):
        said = ""
        if agent_too:  # both signals in before the agent runs again, however busy the machine
            agent.send_signal(signal.SIGSTOP)
            kernel.send_signal(signal.SIGTERM)
            _ended(kernel)
            agent.send_signal(signal.SIGTERM)
            agent.send_signal(signal.SIGCONT)
        else:  # read with stdin still open: its end would end the agent too
            kernel.send_signal(signal.SIGTERM)
            assert agent.stdout is not None
            said = agent.stdout.readline()
        said += agent.communicate(timeout=60)[0]
    if agent_too:
        assert agent.returncode == -signal.SIGTERM and said == ""
    else:
        assert agent.returncode == 0 and json.loads(said) == {"exited": -signal.SIGTERM, "oom_killed": False}
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_kernel_the_supervisor_stops_is_its_exit_at_once(tmp_path):
    """A generation's stop relays SIGTERM to the kernel through the agent: that exit is the
    supervisor's doing, reported at once, not held for an ending of the agent's own (every stop of
    a remote kernel took a second longer). The hold made a minute long here, so that one shows."""
    with _agent_serving(tmp_path, AGENT.replace("ENDED_TOO = 1.0", "ENDED_TOO = 60.0")) as (agent, kernel):
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write(json.dumps({"signal": int(signal.SIGTERM)}) + "\n")
        agent.stdin.flush()
        reported: list[str] = []
        reader = threading.Thread(target=lambda: reported.append(agent.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=30)
        assert reported and json.loads(reported[0]) == {"exited": -signal.SIGTERM, "oom_killed": False}
        _ended(kernel)


def test_an_agents_start_goes_into_its_pipe_at_once_however_late_its_command_reads():
    """ssh, srun and ``docker run -i`` read their stdin once connected. The agent's source and its
    start (the worker's bootstrap, the host client's files) had grown to 77 KB, more than a pipe
    takes: the proxy's loop waited on the write until the command read, and a signal meanwhile cut
    the start short (a Slurm generation's agent failed on a JSON error). Compressed, both go at once."""
    start = {"dir": "/tmp/klbr-0123456789abcdef", "key": "0" * 64, "signature_scheme": "hmac-sha256",  # noqa: S108
             "bootstrap": BOOTSTRAP, "args": [], "channels": CHANNELS, "lease": 15.0, "client": client_package.files(),
             "host": {"KLBR_HOST_ENDPOINT": "ipc:///tmp/klbr-0123456789abcdef.host"}}
    assert len((first_line(AGENT) + json.dumps({"start": start})).encode()) > PIPE_CAPACITY  # what made it wait
    assert len((first_line(AGENT) + start_line(start)).encode()) < PIPE_CAPACITY * 3 // 4  # room to grow
    never_reads = ["sleep", "119.5"]
    spawned: list[subprocess.Popen[bytes]] = []
    writer = threading.Thread(target=lambda: spawned.append(spawn(never_reads, lambda: start)), daemon=True)
    writer.start()
    writer.join(timeout=60)  # a write that waits for it never returns
    try:
        assert spawned, "the start waited for its command to read it"
    finally:
        for process in spawned:
            end_process(process)
        for process in psutil.process_iter(["cmdline"]):  # one whose spawn is still waiting
            if process.info["cmdline"] == never_reads:
                process.kill()
