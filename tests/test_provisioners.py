"""`kernelspec:` placements whose provisioner is not jupyter_client's local one.

They run in a helper process per generation (`klbr_supervisor.targets.provisioner_host`), off the kernel's
loop. Two real provisioners:

- gateway_provisioners' distributed provisioner in its localhost mode, its kernelspec installed by its
  own `jupyter-ssh-spec install`: a real `RemoteProvisionerBase` launch (the launcher script, the
  encrypted response to the response address, signals over the launcher's comm port, a key the
  launcher chose);
- `tests/provisioners/klbr_test_provisioner.py`, whose network to its kernel the test cuts, and whose
  `poll()` flaps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from klbr_kernel.host.client import PROTOCOL, sign
from utils import (
    collect,
    execute,
    host_call_codes,
    notes_shown,
    process_gone,
    results,
    start_kernel,
    status_rows,
    stream_text,
    until,
    value,
    wait_for_stream,
    worker_pid,
)

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent





@pytest.fixture(scope="module")
def gateway_specs(tmp_path_factory) -> Path:
    """gateway_provisioners' own installer, as its docs say: `jupyter-ssh-spec install`. Its default
    refuses root (`unauthorized_users`); this machine's tests run as root, so the spec lets it."""
    prefix = tmp_path_factory.mktemp("gateway")
    subprocess.run([str(BIN / "jupyter-ssh-spec"), "install", f"--prefix={prefix}", "--kernel-name=gp-local",
                    "--unauthorized-users=nobody"], check=True, capture_output=True)
    return prefix / "share" / "jupyter"


def on_gateway(tmp_path, specs: Path, *options):
    return start_kernel(
        extra_arguments=[*options],
        env={"JUPYTER_PATH": os.pathsep.join([str(specs), os.environ["JUPYTER_PATH"]]),
             # the spec's argv runs `python`: this venv's, which has ipykernel and the launcher's needs
             "PATH": os.pathsep.join([str(BIN), os.environ["PATH"]]),
             "KLBR_DB": str(tmp_path / "log.sqlite3")})


def test_gateway_provisioners_distributed_provisioner_runs_the_workbench(tmp_path, gateway_specs):
    with on_gateway(tmp_path, gateway_specs) as (km, kc):
        execute(kc, "kept = 1")
        reply, outputs = execute(kc, "%klbr placement kernelspec:gp-local", timeout=90)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "generation 2 runs on kernelspec:gp-local" in stream_text(outputs)
        # The launcher chose the worker's key; the proxy verifies with it and re-signs with ours.
        key = value(kc, "get_ipython().kernel.session.key")
        assert key and key != km.session.key
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
        reply, outputs = execute(kc, "print('through'); 6 * 7")
        assert stream_text(outputs) == "through\n" and results(outputs) == ["42"]
        msg_id = kc.execute("answer = input('name? ')", allow_stdin=True)
        assert kc.get_stdin_msg(timeout=30)["content"]["prompt"] == "name? "
        kc.input("klbr")
        assert kc.get_shell_msg(timeout=30)["content"]["status"] == "ok"
        assert value(kc, "answer") == "klbr"
        st = status_rows(kc)
        assert st["placement"] == "kernelspec:gp-local" and st["standby"] == "off"
        # An interrupt is a SIGINT the provisioner sends over the launcher's comm port.
        msg_id = kc.execute("print('asleep', flush=True); import time; time.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert value(kc, "answer") == "klbr"  # the same generation
        # The kernel exits: its launcher is a process here, so its status is real: WorkerLost, and
        # a new generation on the same placement.
        pid = worker_pid(kc)
        reply, _ = execute(kc, "import os; os._exit(3)", timeout=60)
        assert reply["content"]["ename"] == "WorkerLost" and "exited with status 3" in reply["content"]["evalue"]
        assert value(kc, "6 * 7") == 42
        assert worker_pid(kc) != pid and status_rows(kc)["placement"] == "kernelspec:gp-local"
        helper = _helpers_of(km.provisioner.process.pid)
        assert len(helper) == 1, helper
    assert process_gone(pid)
    assert all(process_gone(p, timeout=30) for p in helper), "a shutdown ends the helper and its kernel"


def _helpers_of(kernel: int) -> list[int]:
    """The provisioner helpers the kernel process `kernel` started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == kernel and b"klbr_supervisor.targets.provisioner_host" in cmdline:
                found.append(int(entry))
    return found


def _cuttable_spec(tmp_path, **config) -> tuple[Path, Path]:
    control = tmp_path / "control"
    control.mkdir()
    spec = tmp_path / "specs" / "kernels" / "cuttable"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ipykernel behind a network the test cuts", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "klbr-cuttable-provisioner",
                                            "config": {"control": str(control), **config}}}}))
    return tmp_path / "specs", control


@pytest.fixture(params=["local", "remote"])
def cuttable(tmp_path, request) -> tuple[Path, Path, bool]:
    """The cuttable provisioner's kernelspec, and its control directory: with its kernel's process
    in sight (a local one), or kept to itself (as a pod's or another host's is)."""
    specs, control = _cuttable_spec(tmp_path, remote=request.param == "remote")
    return specs, control, request.param == "remote"


def on_cuttable(tmp_path, specs: Path, *options):
    return start_kernel(
        extra_arguments=["--Supervisor.placement=kernelspec:cuttable", *options],
        env={"JUPYTER_PATH": os.pathsep.join([str(specs), os.environ["JUPYTER_PATH"]]),
             "PYTHONPATH": os.pathsep.join([str(HERE / "provisioners"), os.environ.get("PYTHONPATH", "")]),
             "KLBR_DB": str(tmp_path / "log.sqlite3")})


def launches(control: Path) -> list[int]:
    return [int(line) for line in (control / "launches").read_text().split()]


def test_a_cut_network_is_placement_lost_never_rerun_and_no_second_kernel(tmp_path, cuttable):
    specs, control, remote = cuttable
    with on_cuttable(tmp_path, specs, "--Supervisor.link_timeout=3") as (km, kc):
        execute(kc, "kept = 1")
        for i in range(5):  # its poll() says "dead" every other time: nobody listens to it
            assert value(kc, f"{i} + 1") == i + 1
        (first,) = launches(control)
        assert worker_pid(kc) == first
        # Where it runs, in its own words (nothing here may see its process): the status and the log.
        assert f"python {sys.version_info.major}.{sys.version_info.minor}" in status_rows(kc)["worker"]
        assert f"at {sys.executable}," in status_rows(kc)["worker"]
        msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        with open(control / "cut", "w") as fifo:
            fifo.write("cut\n")
        cut = time.monotonic()
        reply, outputs = collect(kc, msg_id, timeout=30)
        assert reply["content"]["ename"] == "PlacementLost", reply["content"]
        assert time.monotonic() - cut < 3 + 5
        assert "outcome is unknown" in reply["content"]["evalue"] and "%klbr reconnect" in reply["content"]["evalue"]
        for _ in range(2):
            reply, _ = execute(kc, "40 + 2")
            assert reply["content"]["ename"] == "PlacementLost"
        assert launches(control) == [first], "no second kernel while the first may still run"
        assert process_gone(first), "what can still reach it (here, its provisioner) ends it"
        reply, outputs = execute(kc, "%klbr reconnect", timeout=60)
        assert reply["content"]["status"] == "ok" and "runs on kernelspec:cuttable" in stream_text(outputs)
        assert value(kc, "40 + 2") == 42
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
        assert len(launches(control)) == 2
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    identity = json.loads(db.execute("SELECT identity FROM generations ORDER BY number LIMIT 1").fetchone()[0])
    assert identity["pid"] == first and identity["interpreter"] == sys.executable
    rows = db.execute("SELECT code, status FROM cells ORDER BY id").fetchall()
    assert ("print('running', flush=True)\nimport time\ntime.sleep(60)", "unknown") in rows
    assert [s for c, s in rows if c == "40 + 2"] == ["refused", "refused", "ok"]


def test_options_for_workers_reach_a_provisioned_kernel_after_its_kernelspecs_argv(tmp_path):
    """The provisioner's helper starts the kernel with the kernel's own command-line options for
    workers, as jupyter_client adds extra arguments to a kernelspec's argv."""
    specs, _ = _cuttable_spec(tmp_path, remote=True)
    with on_cuttable(tmp_path, specs, "--InteractiveShell.ast_node_interactivity=all",
                     "--InteractiveShellApp.exec_lines=spaced = 'a b  c'") as (km, kc):
        assert results(execute(kc, "1\n2")[1]) == ["1", "2"]
        assert value(kc, "spaced") == "a b  c"


def test_a_provisioned_kernel_that_exits_is_worker_lost_only_when_its_exit_is_seen(tmp_path, cuttable):
    """A local process's exit is real: WorkerLost, and a new generation. A kernel whose process
    nobody here sees may as well be cut off: PlacementLost, and nothing starts until asked."""
    specs, control, remote = cuttable
    with on_cuttable(tmp_path, specs, "--Supervisor.link_timeout=3") as (km, kc):
        reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)", timeout=60)
        if remote:
            assert reply["content"]["ename"] == "PlacementLost", reply["content"]
            assert execute(kc, "6 * 7")[0]["content"]["ename"] == "PlacementLost"
            assert len(launches(control)) == 1
            execute(kc, "%klbr reconnect", timeout=60)
        else:
            assert reply["content"]["ename"] == "WorkerLost", reply["content"]
        assert value(kc, "6 * 7") == 42
        assert len(launches(control)) == 2


def test_a_provisioner_that_fails_its_launch_is_named(tmp_path, cuttable):
    specs, control, remote = cuttable
    os.rmdir(control)  # where it writes its launches: its launch raises
    with on_cuttable(tmp_path, specs) as (km, kc):
        reply, _ = execute(kc, "1 + 1", timeout=60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "WorkerStartFailed", reply["content"]
        assert "could not be launched" in reply["content"]["evalue"], reply["content"]["evalue"]


def test_a_killed_kernel_process_leaves_no_provisioned_kernel_or_helper(tmp_path, cuttable):
    """The helper's end of the kernel's pipe closes when the kernel dies, however it dies: the helper
    shuts its kernel down through the provisioner, and ends."""
    specs, control, remote = cuttable
    with on_cuttable(tmp_path, specs) as (km, kc):
        assert value(kc, "6 * 7") == 42
        (kernel,) = launches(control)
        helpers = _helpers_of(km.provisioner.process.pid)
        assert len(helpers) == 1
        km.provisioner.process.send_signal(signal.SIGKILL)
        km.provisioner.process.wait()
        assert process_gone(kernel, timeout=30), "the provisioned kernel outlived klbr"
        assert process_gone(helpers[0], timeout=30), "the helper outlived klbr"
        if remote:  # nothing else could reach it: the helper had its provisioner kill it
            assert (control / "kills").read_text().split() == [str(kernel)]


def test_an_interrupt_the_kernel_ignores_ends_in_worker_killed_through_the_provisioner(tmp_path, cuttable):
    """The ladder on a provisioned kernel: the interrupt goes through the provisioner, and after
    `interrupt_grace` so does the kill; a new generation follows, as on `local`."""
    specs, control, remote = cuttable
    with on_cuttable(tmp_path, specs, "--Supervisor.interrupt_grace=1") as (km, kc):
        msg_id = kc.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                            "print('deaf', flush=True)\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        (first,) = launches(control)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "WorkerKilled", reply["content"]
        assert process_gone(first)
        assert value(kc, "6 * 7") == 42
        assert len(launches(control)) == 2


def test_a_provisioner_whose_signals_hang_still_gets_its_kill_and_the_cell_an_answer(tmp_path):
    """A signal over a network that is gone never returns: the interrupt and the terminate hang in
    the helper, and the kill behind them still goes through (its own task each), in time for the
    ladder: WorkerKilled after interrupt_grace, and a new generation."""
    specs, control = _cuttable_spec(tmp_path, remote=True, hang_signals=True)
    with on_cuttable(tmp_path, specs, "--Supervisor.interrupt_grace=1") as (km, kc):
        msg_id = kc.execute("import time\nprint('asleep', flush=True)\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        (first,) = launches(control)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "WorkerKilled", reply["content"]
        assert (control / "kills").read_text().split() == [str(first)], "the provisioner's kill ran"
        assert process_gone(first)
        assert value(kc, "6 * 7") == 42
        assert len(launches(control)) == 2


def test_host_callbacks_reach_a_provisioned_kernel_over_tcp_with_curve(tmp_path, gateway_specs):
    """Its credentials travel as KERNEL_* variables (what gateway_provisioners forward to a remote
    kernel), its endpoint is TCP, and only a client that knows the server's CurveZMQ key is answered."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with on_gateway(tmp_path, gateway_specs, "--HostService.tcp_ip=127.0.0.1",
                    f"--HostService.workspace={workspace}") as (km, kc):
        reply, _ = execute(kc, "%klbr placement kernelspec:gp-local", timeout=90)
        assert reply["content"]["status"] == "ok", reply["content"]
        execute(kc, "from klbr_kernel import host")
        found = value(kc, "host.inspect()")
        assert found["generation"] == 2 and found["placement"] == "kernelspec:gp-local"
        env = value(kc, "{k: v for k, v in __import__('os').environ.items() if 'KLBR_HOST' in k}")
        assert set(env) == {f"KERNEL_KLBR_HOST_{name}" for name in ("ENDPOINT", "TOKEN", "KEY", "SERVERKEY")}
        assert env["KERNEL_KLBR_HOST_ENDPOINT"].startswith("tcp://127.0.0.1:")
        execute(kc, "host.put('step', 3)")
        assert value(kc, "[host.get('step'), host.keys()]") == [3, ["step"]]
        ran = value(kc, "host.run(['sh', '-c', 'pwd; exit 3'])")
        assert (ran["exit_code"], ran["stdout"]) == (3, f"{workspace}\n")
        assert notes_shown(kc, "provisioned") == ["**klbr note:** provisioned"]
        assert host_call_codes(kc)[-2:] == ["ok", "budget_exhausted"]
        # The same signed request, from here: answered with the server's key (not_running: no cell
        # of ours runs), never without it.
        payload = json.dumps({"call": "c1", "token": env["KERNEL_KLBR_HOST_TOKEN"], "cell": None,
                              "method": "keys", "args": {}}).encode()
        frames = [PROTOCOL, sign(env["KERNEL_KLBR_HOST_KEY"].encode(), payload), payload]
        context = zmq.Context()
        try:
            for curve in (True, False):
                sock = context.socket(zmq.DEALER)
                sock.linger = 0
                if curve:
                    sock.curve_serverkey = env["KERNEL_KLBR_HOST_SERVERKEY"].encode()
                    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                sock.connect(env["KERNEL_KLBR_HOST_ENDPOINT"])
                sock.send_multipart(frames)
                if curve:
                    assert sock.poll(30_000), "no answer over CurveZMQ"
                    answer = json.loads(sock.recv_multipart()[2])
                    assert (answer["call"], answer["code"]) == ("c1", "not_running")
                else:
                    assert not sock.poll(3_000), "a client without the server's key was answered"
                sock.close()
        finally:
            context.term()


def test_restart_relocate_and_a_stale_call_from_a_provisioned_kernel(tmp_path, gateway_specs):
    """Over TCP as on local: `host.restart()` gives a new provisioned generation when its cell ends,
    a process the old one left behind is told `stale_generation`, `host.relocate()` moves the session."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    ready, go, out = workspace / "ready", workspace / "go", workspace / "out"
    script = (f"import os, time\nfrom klbr_kernel import host\nopen({str(ready)!r}, 'w').close()\n"
              f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
              f"try:\n    host.inspect()\n    code = 'answered'\nexcept host.HostError as e:\n    code = e.code\n"
              f"open({str(out)!r}, 'w').write(code)\n")
    with on_gateway(tmp_path, gateway_specs, "--HostService.tcp_ip=127.0.0.1",
                    f"--HostService.workspace={workspace}") as (km, kc):
        reply, _ = execute(kc, "%klbr placement kernelspec:gp-local", timeout=90)
        assert reply["content"]["status"] == "ok", reply["content"]
        execute(kc, f"import subprocess, sys\nleftover = subprocess.Popen([sys.executable, '-c', {script!r}], "
                    "start_new_session=True).pid\nkept = 1\nfrom klbr_kernel import host")
        leftover = value(kc, "leftover")
        until(ready.exists, 60, "the leftover process has imported the client")
        reply, outputs = execute(kc, "host.restart('leaking memory')\nprint('the cell finishes')", timeout=90)
        assert reply["content"]["status"] == "ok" and stream_text(outputs) == "the cell finishes\n"
        assert execute(kc, "kept", timeout=90)[0]["content"]["ename"] == "NameError"
        execute(kc, "from klbr_kernel import host")
        found = value(kc, "host.inspect()")
        assert (found["generation"], found["placement"]) == (3, "kernelspec:gp-local")
        go.touch()
        until(out.exists, 60, "the leftover process has called")
        assert out.read_text() == "stale_generation"
        reply, _ = execute(kc, "host.relocate('local')", timeout=90)
        assert reply["content"]["status"] == "ok", reply["content"]
        execute(kc, "from klbr_kernel import host", timeout=90)
        found = value(kc, "host.inspect()")
        assert (found["generation"], found["placement"]) == (4, "local")
    with contextlib.suppress(ProcessLookupError):
        os.kill(leftover, signal.SIGKILL)
