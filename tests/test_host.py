"""Host callbacks: cell code asks its supervisor, from real cells on a real kernel.

Every refusal is followed by a cell that works: the kernel keeps serving.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from klbr_supervisor.host.record import LARGE, AnswerRecord
from utils import (
    collect,
    execute,
    host_call_codes,
    notes_shown,
    process_gone,
    results,
    start_kernel,
    stream_text,
    until,
    worker_pid,
)

ROOT = Path(__file__).parent.parent


# The oldest ipykernel admitted, with no klbr, for `python:` and `kernelspec:` (`make
# .venv-ipykernel/.ready`): their workers import the client the kernel places for them. The host
# tests that depend on ipykernel's threads run on both ends.
OLDEST = ROOT / ".venv-ipykernel" / "bin" / "python"
ON_BOTH = pytest.mark.parametrize("where", ["local", "python"])
ELSEWHERE = pytest.mark.parametrize("where", ["python", "kernelspec"])
OLDEST_SPEC = "oldest-ipykernel"


def placement_options(tmp_path, where: str, env: dict[str, str]) -> list[str]:
    """The options (and `env`'s JUPYTER_PATH) that put generations on `where`, on the venv without klbr."""
    if where == "local":
        return []
    assert OLDEST.exists(), f"{OLDEST} is missing: make .venv-ipykernel/.ready"
    if where == "python":
        return [f"--Supervisor.placement=python:{OLDEST}"]
    spec = tmp_path / "specs" / "kernels" / OLDEST_SPEC
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(OLDEST), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "the oldest ipykernel", "language": "python"}))
    env["JUPYTER_PATH"] = os.pathsep.join([str(tmp_path / "specs"), os.environ["JUPYTER_PATH"]])
    return [f"--Supervisor.placement=kernelspec:{OLDEST_SPEC}"]


@contextmanager
def host_kernel(tmp_path, *options: str, where: str = "local", env: dict[str, str] | None = None):
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    env = {"KLBR_DB": str(tmp_path / "log.sqlite3"), "JPY_SESSION_NAME": str(workspace / "agent.ipynb"),
           **(env or {})}
    options = (*placement_options(tmp_path, where, env), *options)
    # Elsewhere, the kernel (and so its worker) runs outside this source tree: its klbr is not on the worker's path.
    cwd = None if where == "local" else workspace
    with start_kernel(extra_arguments=[f"--HostService.workspace={workspace}", *options], env=env, cwd=cwd) as (km, kc):
        execute(kc, "from klbr_kernel import host")
        yield km, kc, workspace


def value(kc, code: str):
    """The value of the expression `code` in the worker, through JSON."""
    reply, outputs = execute(kc, f"import json as _j; print(_j.dumps({code}))", timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return json.loads(stream_text(outputs, "stdout"))


def refused(kc, call: str) -> str:
    """The code of the HostError `call` raises (and the kernel still serves)."""
    reply, outputs = execute(kc, f"try:\n    {call}\n    print('no error')\nexcept host.HostError as e:\n    print(e.code)",
                             timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert results(execute(kc, "1 + 1")[1]) == ["2"]
    return stream_text(outputs, "stdout").strip()


def test_inspect_says_where_the_cell_runs(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        found = value(kc, "host.inspect()")
        assert found["generation"] == 1 and found["placement"] == "local" and found["time_left"] is None
        assert isinstance(found["session"], int) and found["kernel_session"]
        identity = found["identity"]
        assert identity["pid"] == worker_pid(kc)
        assert os.path.exists(identity["interpreter"]) and identity["version"].startswith("3.")
        assert identity["hostname"] and identity["platform"] == "Linux" and identity["arch"] and identity["cwd"]
        conn = sqlite3.connect(tmp_path / "log.sqlite3")
        (cell,) = conn.execute("SELECT id FROM cells WHERE code LIKE '%host.inspect()%'").fetchone()
        assert found["cell"] == cell
        _, outputs = execute(kc, "%%klbr timeout=30\nimport json\nprint(json.dumps(host.inspect()['time_left']))")
        assert 0 < json.loads(stream_text(outputs)) <= 30
        _, outputs = execute(kc, "%klbr status")
        assert f"python {identity['version']} at {identity['interpreter']}" in stream_text(outputs)


def test_run_is_a_command_in_the_workspace(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        (workspace / "data").mkdir()
        found = value(kc, "host.run(['sh', '-c', 'pwd; echo oops >&2; exit 3'], cwd='data')")
        assert found["stdout"] == f"{workspace / 'data'}\n" and found["stderr"] == "oops\n"
        assert found["exit_code"] == 3 and not found["timed_out"] and found["duration"] >= 0
        assert value(kc, "host.run(['sh', '-c', 'echo $GREETING'], env={'GREETING': 'hi'})")["stdout"] == "hi\n"
        assert value(kc, "host.run(['cat'], stdin='from str')")["stdout"] == "from str"
        assert value(kc, "host.run(['cat'], stdin=b'from bytes')")["stdout"] == "from bytes"
        cut = value(kc, "host.run(['sh', '-c', 'head -c 5000 /dev/zero | tr \"\\\\0\" x'], max_output=100)")
        assert cut["stdout"] == "x" * 100 and cut["stdout_truncated"] and not cut["stderr_truncated"]


def test_a_command_past_its_timeout_ends_with_its_whole_group(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        found = value(kc, "host.run(['sh', '-c', 'sleep 600 & echo $! > child; sleep 600'], timeout=1)")
        assert found["timed_out"] and found["duration"] < 30
        assert process_gone(int((workspace / "child").read_text()))


def long_command(workspace) -> str:
    """A `host.run` call whose command writes its pid to `workspace/pid` and then sleeps for long."""
    pid = workspace / "pid"
    return f"host.run(['sh', '-c', 'echo $$ > {pid}.new && mv {pid}.new {pid} && exec sleep 120'], timeout=600)"


def started(workspace) -> int:
    """The pid of the `long_command`, once it runs."""
    until((workspace / "pid").exists, 60, "the command has started")
    return int((workspace / "pid").read_text())


def test_a_shutdown_during_a_command_ends_it_and_the_kernel_at_once(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        kc.execute(long_command(workspace))
        pid, proxy = started(workspace), km.provisioner.process
        start = time.monotonic()
        kc.shutdown()
        assert proxy.wait(timeout=30) == 0  # by itself: jupyter_client does not have to kill it
        elapsed = time.monotonic() - start
        assert elapsed < 3, f"the kernel exited {elapsed:.1f} s after the shutdown request"
        assert process_gone(pid)


def test_an_interrupted_cell_ends_its_command(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        msg_id = kc.execute(long_command(workspace))
        pid = started(workspace)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id, timeout=30)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert process_gone(pid)
        assert results(execute(kc, "1 + 1")[1]) == ["2"]


def test_a_lost_generation_ends_the_command_of_its_cell(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        code = (f"import os, threading, time\nthreading.Thread(target=lambda: {long_command(workspace)}).start()\n"
                f"while not os.path.exists({str(workspace / 'pid')!r}):\n    time.sleep(0.01)\n"
                "os.kill(os.getpid(), 9)")
        reply, _ = execute(kc, code, timeout=60)
        assert reply["content"]["ename"] == "WorkerLost"
        assert process_gone(started(workspace))


def test_a_killed_kernel_leaves_no_command_behind(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        kc.execute(long_command(workspace))
        pid = started(workspace)
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # the reaper is left to end it
        assert process_gone(pid, timeout=30)


# The kernel SIGKILLed after a command's fork but before its reaper hears of the command's group.
_KILLED_WHILE_STARTING = """
import asyncio, os, signal, sys
from pathlib import Path
from klbr_supervisor.boot.reaper import Reaper
from klbr_supervisor.host.commands import Command, Run

class DiesHere(Reaper):
    def watch(self, pgid):
        Path('pgid').write_text(str(pgid))
        os.kill(os.getpid(), signal.SIGKILL)

async def main():
    argv = ['sh', '-c', 'echo ran > ran; exec sleep 600']
    await Run(Command(argv, Path.cwd(), dict(os.environ), None, 600.0, 1000), 1.0, DiesHere.start(sys.argv[1])).run()

asyncio.run(main())
"""


def test_a_kernel_killed_as_a_command_starts_leaves_nothing_running(tmp_path):
    """The command waits until the reaper watches its group: it never ran, and nothing of it is left."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    kernel = subprocess.run([sys.executable, "-c", _KILLED_WHILE_STARTING, str(runtime)], check=False, cwd=tmp_path,
                            timeout=60)
    assert kernel.returncode == -signal.SIGKILL
    assert process_gone(int((tmp_path / "pgid").read_text()), timeout=10)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("call, code", [
    ("host.run([])", "invalid"), ("host.run(['echo', 1])", "invalid"), ("host.run(['echo', ''])", "invalid"),
    ("host.run(['ec\\0ho'])", "invalid"), ("host.run(['env'], env={'': 'x'})", "invalid"),
    ("host.run(['env'], env={'A=B': 'x'})", "invalid"), ("host.run(['env'], env={'A': 'x\\0'})", "invalid"),
    ("host.run(['ls'], cwd='/tmp')", "forbidden"), ("host.run(['ls'], cwd='../..')", "forbidden"),
    ("host.run(['ls'], timeout=0)", "invalid"), ("host.run(['ls'], timeout=3601)", "invalid"),
    ("host.run(['ls'], max_output=10**9)", "invalid"), ("host.run(['no-such-command-of-klbr'])", "invalid"),
    ("host.run(['./not-here'])", "invalid"), ("host.run(['/etc/passwd'])", "invalid"), ("host.put('k' * 257, 1)", "invalid"),
    ("host.put('k', {1, 2})", "invalid"), ("host.put('k', 'x' * (2**20 + 1))", "too_large"),
    ("host.notify('x' * (2**20 + 1))", "too_large"), ("host.relocate('ssh://elsewhere/usr/bin/python3')", "invalid"),
    ("host.notify('')", "invalid"),
])
def test_each_refusal_has_its_code(tmp_path, call, code):
    with host_kernel(tmp_path) as (km, kc, workspace):
        assert refused(kc, call) == code


def test_a_symlink_out_of_the_workspace_is_refused(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        (workspace / "inside").mkdir()
        (workspace / "outward").symlink_to(tmp_path)
        (workspace / "inward").symlink_to(workspace / "inside")
        assert refused(kc, "host.run(['ls'], cwd='outward')") == "forbidden"
        assert value(kc, "host.run(['pwd'], cwd='inward')")["stdout"] == f"{workspace / 'inside'}\n"


def test_values_survive_a_lost_worker_and_a_new_kernel(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        execute(kc, "host.put('step', {'done': 3}); host.put('name', 'run-7')")
        pid = worker_pid(kc)
        reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)")
        assert reply["content"]["ename"] == "WorkerLost"
        execute(kc, "from klbr_kernel import host")
        assert value(kc, "host.get('step')") == {"done": 3} and worker_pid(kc) != pid
        assert value(kc, "host.keys()") == ["name", "step"]
        assert value(kc, "host.get('missing', 'default')") == "default"
    with host_kernel(tmp_path) as (km, kc, workspace):  # the same notebook, a later session
        assert value(kc, "host.get('name')") == "run-7"


def test_a_note_is_shown_and_kept(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        assert notes_shown(kc, "training finished") == ["**klbr note:** training finished"]
    conn = sqlite3.connect(tmp_path / "log.sqlite3")
    (payload,) = conn.execute("SELECT payload FROM events WHERE kind = 'note'").fetchone()
    assert json.loads(payload)["text"] == "training finished"


@pytest.mark.parametrize("call", ["host.restart('leaking memory')", "host.relocate('local')"])
def test_restart_and_relocate_take_effect_when_the_cell_ends(tmp_path, call):
    with host_kernel(tmp_path) as (km, kc, workspace):
        execute(kc, "kept = 1")
        pid = worker_pid(kc)
        reply, outputs = execute(kc, f"{call}\nprint('the cell finishes')")
        assert reply["content"]["status"] == "ok" and stream_text(outputs) == "the cell finishes\n"
        assert worker_pid(kc) != pid  # the very next cell runs in the new generation
        assert process_gone(pid)
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
    conn = sqlite3.connect(tmp_path / "log.sqlite3")
    kinds = [r[0] for r in conn.execute("SELECT kind FROM events")]
    assert ("host_restart" in kinds) or ("host_relocate" in kinds)
    # What was asked for is what happened, and the log says which: a relocate is no restart.
    asked, reason = ("host_restart", "restart") if call.startswith("host.restart") else ("host_relocate", "relocated")
    assert asked in kinds and ({"host_restart", "host_relocate"} - {asked}).isdisjoint(kinds), kinds
    (ended,) = conn.execute("SELECT end_reason FROM generations WHERE number = 1").fetchone()
    assert ended.split(":")[0] == reason, ended


@ON_BOTH
def test_a_thread_that_outlives_its_cell_is_not_running(tmp_path, where):
    with host_kernel(tmp_path, where=where) as (km, kc, workspace):
        go = workspace / "go"
        execute(kc, "import os, threading, time\nlate = {}\n"
                    f"def later():\n    while not os.path.exists({str(go)!r}):\n        time.sleep(0.01)\n"
                    "    try:\n        host.inspect()\n        late['code'] = 'answered'\n"
                    "    except host.HostError as e:\n        late['code'], late['message'] = e.code, e.message\n"
                    "t = threading.Thread(target=later); t.start()")
        execute(kc, f"open({str(go)!r}, 'w').close(); t.join(30)")  # the thread calls while this cell runs
        assert value(kc, "late['code']") == "not_running"
        assert "end such threads before their cell ends" in value(kc, "late['message']")  # what to do


@ON_BOTH
def test_a_pooled_thread_calls_for_the_cell_that_handed_it_work(tmp_path, where):
    """A pool made in one cell and used in the next (and asyncio's default executor, used twice):
    each call is the running cell's."""
    with host_kernel(tmp_path, where=where) as (km, kc, workspace):
        execute(kc, "import asyncio, concurrent.futures\npool = concurrent.futures.ThreadPoolExecutor(1)\n"
                    "first = [pool.submit(host.inspect).result()['cell'],\n"
                    "         (await asyncio.get_running_loop().run_in_executor(None, host.inspect))['cell']]")
        execute(kc, """\
here, second = host.inspect()['cell'], []
for use in (lambda: pool.submit(host.inspect).result(), lambda: asyncio.get_running_loop().run_in_executor(None, host.inspect)):
    try:
        found = use()
        second.append((await found if asyncio.isfuture(found) else found)['cell'])
    except host.HostError as e:
        second.append(e.code)
""")
        first, second, here = value(kc, "[first, second, here]")
        assert first[0] == first[1] != here
        assert second == [here, here]


@ON_BOTH
def test_user_code_sees_threading_as_under_ipykernel(tmp_path, where):
    """Importing the client replaces nothing user code calls (what ipykernel itself wraps stays
    ipykernel's), and pooled work that fails shows only its own frames below the pool's."""
    env = {"KLBR_DB": str(tmp_path / "log.sqlite3")}
    options = placement_options(tmp_path, where, env)
    with start_kernel(extra_arguments=options, env=env, cwd=tmp_path) as (km, kc):
        seen = "[threading.Thread.__init__, threading.Thread.start, threading.Thread.run, type(pool).submit, type(loop).run_in_executor]"
        execute(kc, f"import asyncio, threading, concurrent.futures\npool = concurrent.futures.ThreadPoolExecutor(1)\n"
                    f"loop = asyncio.get_running_loop()\nbefore = {seen}")
        execute(kc, "from klbr_kernel import host")
        assert value(kc, f"[a is b for a, b in zip(before, {seen})]") == [True] * 5
        execute(kc, "import traceback\ndef fails():\n    raise ValueError('in the pool')\n"
                    "try:\n    pool.submit(fails).result()\nexcept ValueError as e:\n"
                    "    frames = [(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]")
        frames = value(kc, "frames")
        assert frames[-2][1] == "run" and frames[-1][1] == "fails", frames  # the pool's own frame, then the work's
        assert not [f for f, _ in frames if "klbr_kernel" in f], frames


def test_a_call_from_an_ended_generation_is_stale(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        go, out = workspace / "go", workspace / "out"
        script = ("import os, time\nfrom klbr_kernel import host\n"
                  f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
                  f"try:\n    host.inspect()\n    code = 'answered'\nexcept host.HostError as e:\n    code = e.code\n"
                  f"open({str(out)!r}, 'w').write(code)\n")
        # A process that escaped its generation's group (a daemon): it keeps the generation's credentials.
        execute(kc, f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {script!r}], start_new_session=True)")
        execute(kc, "%klbr restart")
        go.touch()
        until(out.exists, 60, "the leftover process has called")
        assert out.read_text() == "stale_generation"


def test_four_threads_calling_at_once_all_get_answers(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        found = value(kc, "[f.result() for f in [__import__('concurrent.futures').futures.ThreadPoolExecutor(4)"
                          ".submit(host.run, ['echo', str(i)]) for i in range(4)]]")
        assert sorted(r["stdout"] for r in found) == ["0\n", "1\n", "2\n", "3\n"]


def test_the_129th_call_of_a_cell_is_refused_and_the_next_cell_has_a_new_budget(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        assert host_call_codes(kc) == ["ok"] * 128 + ["budget_exhausted"]
        assert value(kc, "host.keys()") == []  # the next cell has a new budget


# A client of the test's own in the worker: `frames(call, method, args)` is a signed request, and
# `answers_until(call)` the call ids of the answers read up to `call`'s, and that answer.
RAW_CLIENT = """\
import json, os, zmq
from klbr_kernel.host.client import PROTOCOL, sign
from klbr_kernel.host.handovers import cell as _cell
s = zmq.Context.instance().socket(zmq.DEALER); s.connect(os.environ['KLBR_HOST_ENDPOINT'])
def frames(call, method, args):
    payload = json.dumps({'call': call, 'token': os.environ['KLBR_HOST_TOKEN'], 'cell': _cell(),
                          'method': method, 'args': args}).encode()
    return [PROTOCOL, sign(os.environ['KLBR_HOST_KEY'].encode(), payload), payload]
def answers_until(call):
    calls = []
    while True:
        assert s.poll(60000), 'no answer'
        answer = json.loads(s.recv_multipart()[2])
        calls.append(answer['call'])
        if answer['call'] == call:
            return calls, answer
"""


def test_a_call_sent_again_is_answered_once_and_runs_once(tmp_path):
    """The same call id sent again while it runs (a client resending after a silence) is one more
    caller of the same answer, not one more answer; sent again after its answer, it is answered
    from the record. All on one socket, so every answer sent before the last one has come first."""
    with host_kernel(tmp_path) as (km, kc, workspace):
        go = workspace / "go"
        code = (f"{RAW_CLIENT}run = frames('A', 'run', {{'argv': ['sh', '-c', "
                f"'echo once >> ran; while [ ! -e {go} ]; do sleep 0.01; done']}})\n"
                "s.send_multipart(run); s.send_multipart(run); s.send_multipart(frames('B', 'keys', {}))\n"
                "before, _ = answers_until('B')  # both sends of A were taken in before B\n"
                f"open({str(go)!r}, 'w').close()\n"
                "first, answer = answers_until('A')\n"
                "s.send_multipart(run); s.send_multipart(frames('C', 'keys', {}))\n"
                "later, _ = answers_until('C')\n"
                "print(json.dumps([before, first, later, answer['ok']]))")
        _, outputs = execute(kc, code, timeout=60)
        assert json.loads(stream_text(outputs, "stdout")) == [["B"], ["A"], ["A", "C"], True]
        assert (workspace / "ran").read_text() == "once\n"


def test_a_call_sent_again_after_its_large_answer_was_let_go_is_told_so(tmp_path):
    """An answer of 8 MB is sent once and not kept: the call sent again is told `too_large`, and the
    command does not run again."""
    with host_kernel(tmp_path) as (km, kc, workspace):
        command = ("echo once >> ran; head -c 4000000 /dev/zero | tr '\\0' x; "
                   "head -c 4000000 /dev/zero | tr '\\0' y >&2")
        code = (f"{RAW_CLIENT}big = frames('L', 'run', {{'argv': ['sh', '-c', {command!r}], 'max_output': 4000000}})\n"
                "s.send_multipart(big); _, first = answers_until('L')\n"
                "s.send_multipart(big); _, again = answers_until('L')\n"
                "print(json.dumps([first['ok'], len(first['result']['stdout']), first['result']['stderr'][:1], "
                "again['ok'], again.get('code')]))")
        _, outputs = execute(kc, code, timeout=60)
        assert json.loads(stream_text(outputs, "stdout")) == [True, 4000000, "y", False, "too_large"]
        assert (workspace / "ran").read_text() == "once\n"


def test_the_answers_kept_are_bounded_by_bytes_large_ones_first():
    record = AnswerRecord(max_bytes=10 * LARGE)
    for i in range(8):
        record.add(f"small{i}", {"call": f"small{i}", "ok": True, "result": "s" * (LARGE // 2)})
    record.add("large", {"call": "large", "ok": True, "result": "l" * (3 * LARGE)})
    record.add("larger", {"call": "larger", "ok": True, "result": "l" * (4 * LARGE)})  # over: "large" goes
    assert record.bytes <= 10 * LARGE
    assert record.get("large")["code"] == "too_large" and record.get("larger")["ok"]
    assert all(record.get(f"small{i}")["ok"] for i in range(8))
    record.add("largest", {"call": "largest", "ok": True, "result": "l" * (20 * LARGE)})  # never kept
    assert record.get("largest")["code"] == "too_large" and record.get("larger")["code"] == "too_large"
    assert all(record.get(f"small{i}")["ok"] for i in range(8))  # the large ones went first
    for i in range(8, 21):
        record.add(f"small{i}", {"call": f"small{i}", "ok": True, "result": "s" * (LARGE // 2)})
    assert record.get("small0")["code"] == "timeout" and record.get("small20")["ok"]
    assert record.bytes <= 10 * LARGE
    assert record.get("unknown") is None


def test_forged_and_garbled_calls_are_dropped_and_the_kernel_serves_on(tmp_path):
    with host_kernel(tmp_path) as (km, kc, workspace):
        code = ("import json, os, zmq\nfrom klbr_kernel.host.client import PROTOCOL, sign\n"
                "s = zmq.Context.instance().socket(zmq.DEALER); s.connect(os.environ['KLBR_HOST_ENDPOINT'])\n"
                "payload = json.dumps({'call': 'c1', 'token': os.environ['KLBR_HOST_TOKEN'], 'method': 'keys', 'args': {}}).encode()\n"
                "s.send_multipart([PROTOCOL, sign(b'not the key', payload), payload])\n"
                "s.send_multipart([b'garbage'])\ns.send_multipart([PROTOCOL, b'x', b'{not json'])\n"
                "print(json.dumps(s.poll(1000)))")
        _, outputs = execute(kc, code)
        assert stream_text(outputs, "stdout").strip() == "0"  # no answer to any of them
        assert value(kc, "host.keys()") == []


def test_outside_a_klbr_worker_there_is_no_host():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLBR_HOST_")}
    code = "from klbr_kernel import host\ntry:\n    host.inspect()\nexcept host.HostError as e:\n    print(e.code)"
    done = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "forbidden"


# -- a worker without klbr: `python:` and `kernelspec:` on the venv that has none ---------------------

def test_a_worker_without_klbr_imports_the_placed_client_and_an_installed_klbr_wins(tmp_path):
    assert subprocess.run([str(OLDEST), "-c", "import klbr_kernel"], check=False, capture_output=True, cwd=tmp_path,
                          timeout=60).returncode != 0, "the venv for these tests must have no klbr"
    where_from = "[__import__('klbr_kernel').__file__, host.__file__, __import__('os').environ['PYTHONPATH']]"
    with host_kernel(tmp_path, where="python") as (km, kc, workspace):
        package, module, path = value(kc, where_from)
        placed = os.path.dirname(os.path.dirname(package))
        assert os.path.dirname(os.path.dirname(module)) == os.path.dirname(package) and not package.startswith(str(ROOT))
        assert path.split(os.pathsep)[-1] == placed  # last on the path
        assert value(kc, "host.inspect()['generation']") == 1
    assert not os.path.exists(placed)  # gone with its generation
    with host_kernel(tmp_path, where="python", env={"PYTHONPATH": str(ROOT)}) as (km, kc, workspace):
        package, module, path = value(kc, where_from)
        assert (package, module) == (str(ROOT / "klbr_kernel" / "__init__.py"),
                                     str(ROOT / "klbr_kernel" / "host" / "__init__.py"))
        assert path.split(os.pathsep)[0] == str(ROOT)
        assert value(kc, "host.inspect()['generation']") == 1


@ELSEWHERE
def test_every_call_works_from_a_worker_without_klbr(tmp_path, where):
    with host_kernel(tmp_path, where=where) as (km, kc, workspace):
        found = value(kc, "host.inspect()")
        assert found["generation"] == 1 and found["placement"].startswith(where)
        assert found["identity"]["interpreter"].startswith(str(ROOT / ".venv-ipykernel"))
        execute(kc, "host.put('step', {'n': 3})")
        assert value(kc, "[host.get('step'), host.get('missing', 0), host.keys()]") == [{"n": 3}, 0, ["step"]]
        ran = value(kc, "host.run(['sh', '-c', 'pwd; echo oops >&2; exit 3'])")
        assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, f"{workspace}\n", "oops\n")
        assert notes_shown(kc, "from afar") == ["**klbr note:** from afar"]
        assert refused(kc, "host.run(['true'], cwd='..')") == "forbidden"
        assert host_call_codes(kc)[-2:] == ["ok", "budget_exhausted"]


@ELSEWHERE
@pytest.mark.parametrize("call", ["restart('leaking memory')", "relocate('local')"])
def test_restart_and_relocate_from_a_worker_without_klbr(tmp_path, where, call):
    with host_kernel(tmp_path, where=where) as (km, kc, workspace):
        execute(kc, "kept = 1")
        pid = worker_pid(kc)
        reply, outputs = execute(kc, f"host.{call}\nprint('the cell finishes')")
        assert reply["content"]["status"] == "ok" and stream_text(outputs) == "the cell finishes\n"
        assert worker_pid(kc) != pid and process_gone(pid)
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
        execute(kc, "from klbr_kernel import host")
        found = value(kc, "host.inspect()")
        assert found["generation"] == 2
        assert found["placement"] == "local" if call.startswith("relocate") else found["placement"].startswith(where)


@ELSEWHERE
def test_a_call_from_an_ended_generation_without_klbr_is_stale(tmp_path, where):
    with host_kernel(tmp_path, where=where) as (km, kc, workspace):
        ready, go, out = workspace / "ready", workspace / "go", workspace / "out"
        script = (f"import os, time\nfrom klbr_kernel import host\nopen({str(ready)!r}, 'w').close()\n"
                  f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
                  f"try:\n    host.inspect()\n    code = 'answered'\nexcept host.HostError as e:\n    code = e.code\n"
                  f"open({str(out)!r}, 'w').write(code)\n")
        execute(kc, f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {script!r}], start_new_session=True)")
        until(ready.exists, 60, "the leftover process has imported the client")
        execute(kc, "%klbr restart")
        go.touch()
        until(out.exists, 60, "the leftover process has called")
        assert out.read_text() == "stale_generation"


def test_a_tcp_endpoint_never_reached_is_unavailable_saying_so(tmp_path):
    """A provisioned kernel with no route back: its call ends `unavailable`, naming the endpoint."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {**os.environ, "KERNEL_KLBR_HOST_ENDPOINT": f"tcp://127.0.0.1:{port}", "KERNEL_KLBR_HOST_TOKEN": "t",
           "KERNEL_KLBR_HOST_KEY": "k", "KERNEL_KLBR_HOST_SERVERKEY": zmq.curve_keypair()[0].decode()}
    code = ("from klbr_kernel.host import client as host\ntry:\n    host._call('keys', wait=2)\nexcept host.HostError as e:\n"
            "    print(e.code, e.message)")
    done = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith(f"unavailable no route back to the supervisor: tcp://127.0.0.1:{port}"), done


@pytest.mark.parametrize("left", ["nothing", "a socket nobody listens on"])
def test_a_call_whose_ipc_channel_is_gone_is_stale_saying_so(tmp_path, left):
    """The channel's socket went with its generation (removed, or left behind by a supervisor
    killed outright): the call ends `stale_generation` naming it, not after the whole wait."""
    path = tmp_path / "host"
    if left != "nothing":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
            unix.bind(str(path))  # bound, never listening: a connect is refused
    env = {**os.environ, "KLBR_HOST_ENDPOINT": f"ipc://{path}", "KLBR_HOST_TOKEN": "t", "KLBR_HOST_KEY": "k"}
    code = ("from klbr_kernel.host import client as host\ntry:\n    host._call('keys', wait=25)\nexcept host.HostError as e:\n"
            "    print(e.code, e.message)")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith(f"stale_generation the host channel {path} is gone"), done
    assert time.monotonic() - started < 20, "told only when the whole wait was over"
