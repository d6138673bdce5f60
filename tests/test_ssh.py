"""`ssh://` placement against a real sshd on 127.0.0.1.

`make test` installs Debian's openssh-server if it is missing; each module run starts its own
`sshd -D` with throwaway host and client keys and a test ssh config (`Host klbr-test`), handed to the
kernel as `Supervisor.ssh_options=-F…`, and stops it at the end. The remote interpreter is
`.venv-ipykernel` (ipykernel, nothing of klbr): the agent is sent over ssh.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from traitlets.config import Application

from klbr_supervisor.boot import prelaunch
from klbr_supervisor.settings import SupervisorSettings
from sshd import SSHD, Sshd, signal_quietly
from utils import (
    assert_no_debugger,
    collect,
    execute,
    host_call_codes,
    notes_shown,
    process_gone,
    processes,
    results,
    start_kernel,
    status_row,
    stream_text,
    until,
    value,
    wait_for_stream,
    worker_pid,
)

ROOT = Path(__file__).parent.parent
REMOTE_PYTHON = ROOT / ".venv-ipykernel" / "bin" / "python"

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    assert SSHD.exists(), "sshd is missing: `make test` installs openssh-server (make ssh-deps)"
    assert REMOTE_PYTHON.exists(), f"{REMOTE_PYTHON} is missing: `make test` creates it"
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


SPEC = f"ssh://klbr-test{REMOTE_PYTHON}"


def on_ssh(tmp_path, sshd, *options, placement: str = SPEC):
    return start_kernel(extra_arguments=[f"--Supervisor.placement={placement}", f"--Supervisor.ssh_options=-F{sshd.config}",
                                         *options],
                        env={"KLBR_DB": str(tmp_path / "log.sqlite3")})




def test_cells_input_interrupts_and_a_big_output_run_on_the_remote(tmp_path, sshd):
    with on_ssh(tmp_path, sshd) as (km, kc):
        assert value(kc, "__import__('sys').executable") == str(REMOTE_PYTHON)
        # Started as local workers are: no IPython history database (the cell log is the history).
        assert value(kc, "get_ipython().history_manager.enabled") is False
        reply, outputs = execute(kc, "print('there'); 6 * 7")
        assert stream_text(outputs) == "there\n" and results(outputs) == ["42"]
        # Its own key, written by the agent into a 0600 file in a 0700 directory of its own.
        key, where = value(kc, "(get_ipython().kernel.session.key, get_ipython().kernel.parent.connection_file)")
        assert key and key != km.session.key
        assert os.stat(where).st_mode & 0o077 == 0 and os.stat(os.path.dirname(where)).st_mode & 0o077 == 0
        for pid in os.listdir("/proc"):  # no key in any process's command line, here or there
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                assert key not in cmdline and km.session.key not in cmdline, cmdline
        msg_id = kc.execute("answer = input('name? ')", allow_stdin=True)
        assert kc.get_stdin_msg(timeout=30)["content"]["prompt"] == "name? "
        kc.input("klbr")
        assert kc.get_shell_msg(timeout=30)["content"]["status"] == "ok"
        assert value(kc, "answer") == "klbr"
        msg_id = kc.execute("print('asleep', flush=True); import time; time.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        assert collect(kc, msg_id)[0]["content"]["ename"] == "KeyboardInterrupt"
        msg_id = kc.execute("input('interrupt me ')", allow_stdin=True)  # also while it waits for input
        kc.get_stdin_msg(timeout=30)
        km.interrupt_kernel()
        assert collect(kc, msg_id)[0]["content"]["ename"] == "KeyboardInterrupt"
        reply, outputs = execute(kc, "import sys; sys.stdout.write('x' * (50 << 20)); sys.stdout.flush()", timeout=120)
        assert reply["content"]["status"] == "ok"
        assert len(stream_text(outputs)) == 50 << 20
        assert value(kc, "answer") == "klbr"  # one generation all along


def _cell_then(kc, tmp_path, stall):
    """Start a sleeping cell, then `stall()` the link; the cell's reply and when it came."""
    msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(120)")
    wait_for_stream(kc, msg_id)
    stall()
    began = time.monotonic()
    reply, _ = collect(kc, msg_id, timeout=60)
    return reply, time.monotonic() - began


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["stalled", "dead"])
def test_a_lost_link_is_placement_lost_and_the_remote_kernel_ends_with_its_lease(tmp_path, sshd, how):
    with on_ssh(tmp_path, sshd, "--Supervisor.link_timeout=3") as (km, kc):
        execute(kc, "kept = 1")
        remote = worker_pid(kc)
        sessions = sshd.sessions()
        assert sessions
        reply, took = _cell_then(kc, tmp_path, lambda: [signal_quietly(pid, how) for pid in sessions])
        assert reply["content"]["ename"] == "PlacementLost", reply["content"]
        assert took < 3 + 5, took
        assert "outcome is unknown" in reply["content"]["evalue"]
        assert process_gone(remote, timeout=3 + 5), "the remote kernel outlived its lease"
        for _ in range(2):
            reply, _ = execute(kc, "40 + 2")
            assert reply["content"]["ename"] == "PlacementLost" and "%klbr reconnect" in reply["content"]["evalue"]
        for pid in sessions:
            signal_quietly(pid, signal.SIGCONT)
        reply, outputs = execute(kc, "%klbr reconnect", timeout=60)
        assert reply["content"]["status"] == "ok" and f"runs on {SPEC}" in stream_text(outputs)
        assert value(kc, "40 + 2") == 42
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
    rows = sqlite3.connect(tmp_path / "log.sqlite3").execute("SELECT code, status FROM cells ORDER BY id").fetchall()
    assert ("print('running', flush=True)\nimport time\ntime.sleep(120)", "unknown") in rows
    assert [s for c, s in rows if c == "40 + 2"] == ["refused", "refused", "ok"]


def test_a_remote_kernel_that_exits_is_worker_lost_and_replaced_on_the_same_host(tmp_path, sshd):
    with on_ssh(tmp_path, sshd) as (km, kc):
        first = worker_pid(kc)
        reply, _ = execute(kc, "import os; os._exit(3)", timeout=60)
        assert reply["content"]["ename"] == "WorkerLost" and "exited with status 3" in reply["content"]["evalue"]
        assert value(kc, "6 * 7", timeout=60) == 42
        assert worker_pid(kc) != first
        assert value(kc, "__import__('sys').executable") == str(REMOTE_PYTHON)
        assert value(kc, "get_ipython().history_manager.enabled") is False  # as generation 1


def test_a_memory_limit_is_the_remote_workers_too(tmp_path, sshd):
    """`Supervisor.memory_limit` travels in the agent's start message: a Python allocation past it
    raises MemoryError and the namespace survives; C code that aborts at it is WorkerLost naming it,
    and the next generation there is limited as well."""
    limit = 512 << 20
    rlimit = "__import__('resource').getrlimit(__import__('resource').RLIMIT_DATA)"
    with on_ssh(tmp_path, sshd, "--Supervisor.memory_limit=512M") as (km, kc):
        execute(kc, "x = 41", timeout=60)
        assert value(kc, rlimit, timeout=60) == (limit, limit)
        reply, _ = execute(kc, "y = bytearray(2 << 30)", timeout=60)
        assert reply["content"]["ename"] == "MemoryError", reply["content"]
        assert value(kc, "x + 1") == 42
        assert status_row(kc, "memory") == "not sampled; limit 512 MiB"
        reply, _ = execute(kc, "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
                               "if libc.malloc(2 << 30) is None:\n    libc.abort()", timeout=60)
        content = reply["content"]
        assert content["ename"] == "WorkerLost" and "aborted (SIGABRT)" in content["evalue"], content
        assert "its memory limit is 512 MiB (Supervisor.memory_limit)" in content["evalue"]
        assert value(kc, rlimit, timeout=60) == (limit, limit)
        assert status_row(kc, "generation").startswith("2")


def test_an_ssh_started_early_and_not_wanted_leaves_nothing_on_the_remote(tmp_path, sshd):
    """The ssh a kernelspec's placement starts before the proxy's imports is discarded when the
    configuration asks for another start (a memory limit: the agent's start message has gone out
    without it). Killed outright, it left the host channel's socket sshd had bound in the remote's
    /tmp, one per kernel started: told by stdin's end, its agent removes it and its directory."""
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", f"--Supervisor.ssh_options=-F{sshd.config}",
                                       "--Supervisor.memory_limit=512M", "--KlbrKernelApp.log_level=INFO"],
                      env={"KLBR_DB": str(tmp_path / "log.sqlite3")}, log=log) as (km, kc):
        assert value(kc, "40 + 2", timeout=60) == 42
        said = until(lambda: re.search(r"discarded \(ssh to \S+, pid (\d+), its agent's directory (\S+) there\)",
                                       log.read_text()), 30, "the discard logged")
        assert process_gone(int(said[1]), timeout=30)  # by itself once its agent is done (killed after 5 s)
        remote_dir = said[2]
        assert not os.path.exists(remote_dir) and not os.path.exists(f"{remote_dir}.host")
        assert value(kc, "__import__('resource').getrlimit(__import__('resource').RLIMIT_DATA)[0]") == 512 << 20


def test_options_for_workers_reach_the_remote_kernels_command_line(tmp_path, sshd):
    """IPython options on the kernel's command line are the remote ipykernel's too, word for word (a
    value with spaces included: they travel in JSON to the agent, never through a shell); the ssh
    started before the proxy's imports has them, and is kept. A move names what runs there."""
    options = ["--HistoryManager.hist_file=:memory:", "--InteractiveShell.ast_node_interactivity=all",
               "--InteractiveShellApp.exec_lines=spaced = 'a b  c'"]
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", f"--Supervisor.ssh_options=-F{sshd.config}",
                                       "--KlbrKernelApp.log_level=INFO", *options], log=log) as (km, kc):
        for generation in (1, 2):
            assert results(execute(kc, "1\n2")[1]) == ["1", "2"]
            assert value(kc, "(str(get_ipython().history_manager.hist_file), get_ipython().history_manager.enabled, "
                             "spaced)") == (":memory:", False, "a b  c")
            argv = value(kc, "open('/proc/self/cmdline', 'rb').read().split(b'\\0')")
            assert argv[-len(options) - 1:-1] == [option.encode() for option in options]
            if generation == 1:
                assert "discarded" not in log.read_text()  # the early launch was the one configured
                reply, outputs = execute(kc, "%klbr reconnect", timeout=60)
                version = value(kc, "__import__('platform').python_version()")
                assert (f"generation 2 runs on {SPEC} (python {version} at {REMOTE_PYTHON}, pid {worker_pid(kc)})"
                        in stream_text(outputs)), stream_text(outputs)


def test_debugger_off_keeps_debugpy_out_of_the_remote_worker_started_early_and_of_the_next(tmp_path, sshd):
    """`Supervisor.debugger=False` travels in the agent's start as the worker's other arguments do
    (docker:// and slurm:// start the same agent): the ssh started before the proxy's imports has
    it and is kept, and the remote ipykernel (6.29) has no debugpy, nor does the next generation."""
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", f"--Supervisor.ssh_options=-F{sshd.config}",
                                       "--Supervisor.debugger=False", "--KlbrKernelApp.log_level=INFO"],
                      log=log) as (km, kc):
        assert_no_debugger(kc)
        assert "discarded" not in log.read_text()
        execute(kc, "%klbr restart", timeout=60)
        assert status_row(kc, "generation").startswith("2")
        assert_no_debugger(kc)


def _remote_kernels(flag: bytes) -> list[int]:
    """Remote kernels (here: processes of REMOTE_PYTHON with a connection file) started with `flag`."""
    return processes(lambda words: words[0] == bytes(REMOTE_PYTHON) and b"-f" in words and flag in words)


def test_a_config_file_that_asks_for_another_first_worker_is_honoured_and_the_early_ssh_leaves_nothing(tmp_path, sshd):
    """The command line's ssh:// starts its ssh before the proxy has read its config files; one that
    asks for something else (here IPython's history) replaces that launch, and its remote kernel ends."""
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.ipython_history = True\n")
    with start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", f"--Supervisor.ssh_options=-F{sshd.config}"],
                      env={"KLBR_DB": str(tmp_path / "log.sqlite3"), "JUPYTER_CONFIG_DIR": str(tmp_path)}) as (km, kc):
        assert value(kc, "get_ipython().history_manager.enabled") is True
        assert value(kc, "__import__('sys').executable") == str(REMOTE_PYTHON)
        until(lambda: not _remote_kernels(b"--HistoryManager.enabled=False"), 10, "the early launch's kernel ends")
        assert len(sshd.sessions()) == 1


def test_an_early_ssh_goes_with_a_kernel_that_dies_before_its_first_generation(tmp_path, sshd):
    """A config value the kernel cannot take ends it before any generation adopts the ssh started
    for it: that ssh, its runtime directory and the remote kernel it started go with it, and on the
    remote its agent's directory and the host channel's socket sshd bound."""
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.link_timeout = 'soon'\n")
    (tmp_path / "tmp").mkdir()
    conn = tmp_path / "kernel.json"
    conn.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2,
                                "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "secret"}))
    ssh = tmp_path / "ssh"  # ssh, saying what it was asked to forward
    ssh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "ssh-args"}\nexec ssh "$@"\n')
    ssh.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn), f"--Supervisor.placement={SPEC}",
                           f"--Supervisor.ssh_options=-F{sshd.config}", f"--Supervisor.ssh_command={ssh}"], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")})
    assert done.returncode != 0 and "link_timeout" in done.stderr, done.stderr
    assert not list((tmp_path / "tmp").iterdir())
    until(lambda: not sshd.sessions() and not _remote_kernels(b"--HistoryManager.enabled=False"), 10,
          "the early ssh and its remote kernel end")
    args = (tmp_path / "ssh-args").read_text().splitlines()
    host_socket = args[args.index("-R") + 1].split(":")[0]
    assert host_socket.startswith("/tmp/klbr-") and host_socket.endswith(".host")  # noqa: S108 — the remote's
    assert not os.path.exists(host_socket) and not os.path.exists(host_socket.removesuffix(".host"))


def test_the_early_launch_reads_the_command_line_as_traitlets_does():
    """What prelaunch reads for its early ssh must be what the configuration says, or every start
    would dial twice (the supervisor discards a launch that differs)."""
    argv = ["--Supervisor.ssh_options=-i", "--Supervisor.ssh_options", "~/.ssh/gpu", "--Supervisor.ssh_options='-v'",
            "--Supervisor.ssh_command=~/bin/ssh -4", "--Supervisor.placement", "ssh://gpu/usr/bin/python3"]
    class Supervisor(SupervisorSettings):  # the section's name, as the real one reads it
        pass

    class App(Application):
        classes = [Supervisor]

    app = App()
    app.parse_command_line(argv)
    settings = Supervisor(config=app.config)
    read = {name: prelaunch.values(argv, f"Supervisor.{name}") for name in ("ssh_options", "ssh_command", "placement")}
    assert read["ssh_options"] == settings.ssh_options == ["-i", os.path.expanduser("~/.ssh/gpu"), "-v"]
    assert read["ssh_command"] == [settings.ssh_command]
    assert read["placement"] == [settings.placement]


def test_a_killed_kernel_process_leaves_no_remote_kernel_or_directory(tmp_path, sshd):
    with on_ssh(tmp_path, sshd, "--Supervisor.link_timeout=3") as (km, kc):
        remote = worker_pid(kc)
        where = os.path.dirname(value(kc, "get_ipython().kernel.parent.connection_file"))
        km.provisioner.process.send_signal(signal.SIGKILL)
        km.provisioner.process.wait()
        assert process_gone(remote, timeout=3 + 5), "the remote kernel outlived the kernel"
        until(lambda: not os.path.exists(where), 3 + 5, "the remote directory is removed")


@pytest.mark.parametrize("spec, words", [
    ("ssh://klbr-test/nowhere/bin/python3", "cannot run"),
    ("ssh://no-such-host.invalid/usr/bin/python3", "could not reach"),
    ("ssh://klbr-test/usr/bin/python3", "has no ipykernel"),
])
def test_an_unusable_ssh_target_is_named_and_the_session_stays(tmp_path, sshd, spec, words):
    with on_ssh(tmp_path, sshd, placement="local") as (km, kc):
        execute(kc, "kept = 1")
        reply, outputs = execute(kc, f"%klbr placement {spec}", timeout=60)
        assert reply["content"]["status"] == "error" and words in reply["content"]["evalue"], reply["content"]
        assert value(kc, "kept") == 1


def test_an_interrupt_the_remote_kernel_ignores_ends_in_worker_killed(tmp_path, sshd):
    with on_ssh(tmp_path, sshd, "--Supervisor.interrupt_grace=1") as (km, kc):
        first = worker_pid(kc)
        msg_id = kc.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                            "print('deaf', flush=True)\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "WorkerKilled", reply["content"]
        assert process_gone(first)
        assert value(kc, "6 * 7", timeout=60) == 42  # a new generation, on the same host
        assert worker_pid(kc) != first


def test_a_shutdown_over_a_stalled_link_is_answered_in_jupyters_window(tmp_path, sshd):
    """jupyter_client waits 5 s for a shutdown_reply before it kills the kernel: a stalled link must
    not hold the reply (the remote kernel ends with its lease)."""
    with on_ssh(tmp_path, sshd, "--Supervisor.link_timeout=10") as (km, kc):  # longer than the window
        remote = worker_pid(kc)
        sessions = sshd.sessions()
        for pid in sessions:
            signal_quietly(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            msg_id = kc.shutdown()  # on control, as jupyter_client's managers send it
            reply = kc.control_channel.get_msg(timeout=30)
            took = time.monotonic() - began
            assert reply["parent_header"]["msg_id"] == msg_id and reply["msg_type"] == "shutdown_reply"
            assert took < 5, f"shutdown_reply after {took:.1f} s"
            assert process_gone(remote, timeout=10 + 5), "the remote kernel outlived its lease"
        finally:
            for pid in sessions:
                signal_quietly(pid, signal.SIGCONT)


def test_a_remote_kernel_slower_to_start_than_the_link_timeout_keeps_its_lease(tmp_path, sshd):
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 5\nexec {REMOTE_PYTHON} "$@"\n')  # the scenario: a cold start
    slow.chmod(0o755)
    with on_ssh(tmp_path, sshd, "--Supervisor.link_timeout=2", placement=f"ssh://klbr-test{slow}") as (km, kc):
        assert value(kc, "6 * 7", timeout=60) == 42


def test_a_configured_ssh_placement_without_ipykernel_fails_every_cell_saying_so(tmp_path, sshd):
    with on_ssh(tmp_path, sshd, placement="ssh://klbr-test/usr/bin/python3") as (km, kc):
        for _ in range(2):
            reply, _ = execute(kc, "1 + 1", timeout=60)
            assert reply["content"]["ename"] == "WorkerStartFailed", reply["content"]
            assert "has no ipykernel" in reply["content"]["evalue"]


# -- host callbacks over ssh: the remote interpreter has no klbr; the agent places the client ------

def host_on_ssh(tmp_path, sshd, *options):
    """A kernel on SPEC whose `host.run` commands run in `tmp_path / "workspace"`, here."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", f"--Supervisor.ssh_options=-F{sshd.config}",
                                         f"--HostService.workspace={workspace}", *options],
                        env={"KLBR_DB": str(tmp_path / "log.sqlite3")}, cwd=workspace)


def test_every_host_call_works_from_a_remote_kernel_without_klbr(tmp_path, sshd):
    workspace = tmp_path / "workspace"
    with host_on_ssh(tmp_path, sshd) as (km, kc):
        execute(kc, "from klbr_kernel import host")
        placed = value(kc, "host.__file__")
        connection = value(kc, "get_ipython().kernel.parent.connection_file")
        assert placed.startswith(os.path.dirname(connection) + "/client/")  # in the agent's 0700 directory
        found = value(kc, "host.inspect()")
        assert found["generation"] == 1 and found["placement"] == SPEC
        assert found["identity"]["interpreter"] == str(REMOTE_PYTHON) and found["identity"]["pid"] == worker_pid(kc)
        execute(kc, "host.put('step', {'n': 3})")
        assert value(kc, "[host.get('step'), host.get('missing', 0), host.keys()]") == [{"n": 3}, 0, ["step"]]
        ran = value(kc, "host.run(['sh', '-c', 'pwd; echo oops >&2; exit 3'])")  # on the supervisor's machine
        assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, f"{workspace}\n", "oops\n")
        assert notes_shown(kc, "from the remote") == ["**klbr note:** from the remote"]
        assert host_call_codes(kc)[-2:] == ["ok", "budget_exhausted"]
        remote = worker_pid(kc)
    assert process_gone(remote, timeout=10)
    until(lambda: not os.path.exists(placed), 10, "the client goes with the remote kernel")


@pytest.mark.parametrize("call", ["restart('leaking memory')", "relocate('local')"])
def test_restart_and_relocate_from_a_remote_kernel(tmp_path, sshd, call):
    with host_on_ssh(tmp_path, sshd) as (km, kc):
        execute(kc, "kept = 1\nfrom klbr_kernel import host")
        pid = worker_pid(kc)
        reply, outputs = execute(kc, f"host.{call}\nprint('the cell finishes')")
        assert reply["content"]["status"] == "ok" and stream_text(outputs) == "the cell finishes\n"
        assert process_gone(pid, timeout=10)
        assert execute(kc, "kept", timeout=60)[0]["content"]["ename"] == "NameError"
        execute(kc, "from klbr_kernel import host")
        found = value(kc, "host.inspect()")
        assert found["generation"] == 2
        assert found["placement"] == ("local" if call.startswith("relocate") else SPEC)


def test_a_link_cut_mid_call_ends_the_call_unavailable_naming_the_link(tmp_path, sshd):
    started = tmp_path / "workspace" / "started"
    with host_on_ssh(tmp_path, sshd, "--Supervisor.link_timeout=3") as (km, kc):
        execute(kc, "from klbr_kernel import host")
        msg_id = kc.execute(f"host.run(['sh', '-c', 'echo $$ > {started}; exec sleep 600'], timeout=600)")
        until(lambda: started.exists() and started.read_text().strip(), 30, "the command runs here")
        command = int(started.read_text())
        for pid in sshd.sessions():
            signal_quietly(pid, signal.SIGKILL)
        reply, _ = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "PlacementLost", reply["content"]
        assert process_gone(command, timeout=10), "the command outlived its lost link"
    rows = sqlite3.connect(tmp_path / "log.sqlite3").execute(
        "SELECT payload FROM events WHERE kind = 'host_unavailable'").fetchall()
    assert len(rows) == 1
    ended = json.loads(rows[0][0])
    assert ended["calls"] == 1 and ended["generation"] == 1
    assert f"the link to {SPEC} was lost" in ended["why"] and "ssh to klbr-test" in ended["why"], ended["why"]


def test_a_call_from_an_ended_remote_generation_is_stale(tmp_path, sshd):
    """A process the remote kernel left behind (a daemon in a session of its own) keeps its
    generation's credentials; once the generation ends, its call is stale, told at once."""
    workspace = tmp_path / "workspace"
    ready, go, out = workspace / "ready", workspace / "go", workspace / "out"
    script = (f"import os, time\nfrom klbr_kernel import host\nopen({str(ready)!r}, 'w').close()\n"
              f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
              "started = time.monotonic()\n"
              f"try:\n    host.inspect()\n    code = 'answered'\nexcept host.HostError as e:\n    code = e.code\n"
              f"open({str(out)!r}, 'w').write(f'{{code}} {{time.monotonic() - started:.1f}}')\n")
    with host_on_ssh(tmp_path, sshd) as (km, kc):
        execute(kc, f"import subprocess, sys\nleftover = subprocess.Popen([sys.executable, '-c', {script!r}], "
                    "start_new_session=True).pid")
        leftover = value(kc, "leftover")
        until(ready.exists, 60, "the leftover process has imported the client")
        reply, _ = execute(kc, "%klbr restart", timeout=90)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert value(kc, "6 * 7") == 42  # generation 2 serves, over a connection of its own
        go.touch()
        until(out.exists, 60, "the leftover process has called")
        code, took = out.read_text().split()
        assert code == "stale_generation"
        assert float(took) < 10, f"told after {took} s, not at once"
    signal_quietly(leftover, signal.SIGKILL)
