"""Placement: the workbench on another interpreter or kernelspec, as a visible new generation.

`make test` creates `.venv-ipykernel`, a venv with the oldest ipykernel klbr admits and nothing of
klbr (a user's other project; the main venv has the newest); a venv without ipykernel is made here. `kernelspec:` runs through jupyter_client's
provisioner with a fresh key per generation, re-signed by the proxy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import time
import venv
from pathlib import Path

import pytest
from jupyter_client.session import Session

from klbr_supervisor.boot.placement import PlacementError, parse
from klbr_supervisor.generation.resign import BadSignature, Resigner
from klbr_supervisor.targets import kind_for
from utils import (
    collect,
    execute,
    process_gone,
    results,
    said,
    standby,
    start_kernel,
    status_rows,
    stream_text,
    until,
    value,
    wait_for_stream,
    worker_pid,
)

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv without ipykernel."""
    where = tmp_path_factory.mktemp("bare-venv")
    venv.create(where, with_pip=False)
    return where / "bin" / "python"




def test_specs_are_parsed_or_refused_with_the_reason():
    assert parse("local").kind == "local"
    assert parse("python:/usr/bin/../bin/python3").spec == "python:/usr/bin/python3"
    assert parse("kernelspec:python3").target == "python3"
    ssh = parse("ssh://me@gpu-box:2222/opt/venv/bin/../bin/python")
    assert (ssh.kind, ssh.destination, ssh.port, ssh.python) == ("ssh", "me@gpu-box", 2222, "/opt/venv/bin/python")
    assert ssh.spec == "ssh://me@gpu-box:2222/opt/venv/bin/python"
    assert not kind_for(ssh).shares_key and not kind_for(ssh).warm  # what the kind declares, not the text
    assert parse("ssh://[::1]/usr/bin/python3").destination == "::1"
    for spec, words in [("python:bin/python", "absolute path"), ("elsewhere", "no placement"),
                        ("kernelspec:", "needs the name"), ("ssh://gpu-box", "absolute path"),
                        ("ssh://-oProxyCommand=x/usr/bin/python3", "not a host name"),
                        ("ssh://gpu-box:99999/usr/bin/python3", "not a port"),
                        ("ssh://-l@gpu-box/usr/bin/python3", "not a user name"),
                        ("ssh://gpu-box/usr/bin/python3;rm", "may hold only")]:
        with pytest.raises(PlacementError, match=words):
            parse(spec)


def test_a_resigned_message_carries_the_proxys_session_and_only_a_good_signature_passes():
    """What a worker with its own key sends reaches the frontend as a shared-key worker's would: the
    proxy's session id in its header (left as it is when the worker already writes it: ssh://
    starts its kernels so), signed with the frontend's key; a wrong signature never passes."""
    frontend = Session(key=b"frontend")
    for worker_session in (frontend.session, "another-session"):
        worker = Session(key=b"worker", session=worker_session)
        resigner = Resigner(worker, frontend)
        sent = worker.msg("status", {"execution_state": "idle"})
        serialized = worker.serialize(sent)
        frames = resigner.from_worker([b"ident", *serialized])
        if worker_session == frontend.session:  # its header goes on as the worker packed it
            assert frames[3] == serialized[2]
        else:  # once its own session id is known, it is replaced where the worker wrote it
            again = worker.serialize(worker.msg("status", {"execution_state": "busy"}))
            theirs, ours = (f'"session":"{sid}"'.encode() for sid in (worker_session, frontend.session))
            assert theirs in again[2]  # (orjson's spelling: jupyter_client packs with it here)
            assert resigner.from_worker([b"ident", *again])[3] == again[2].replace(theirs, ours)
        got = frontend.deserialize(frontend.feed_identities(frames)[1])  # checks the frontend's signature
        assert got["header"]["session"] == frontend.session and got["header"]["msg_id"] == sent["header"]["msg_id"]
        assert got["content"] == {"execution_state": "idle"}
    twice = worker.serialize(worker.msg("status", {}))  # a header that names a session twice is parsed
    twice[2] = twice[2].replace(b"{", f'{{"x": {{"session": "{frontend.session}"}}, '.encode(), 1)
    twice[1] = worker.sign(twice[2:6])
    header = json.loads(frontend.feed_identities(resigner.from_worker(twice))[1][1])
    assert header["session"] == frontend.session
    forged = worker.serialize(worker.msg("status", {}))
    forged[1] = b"0" * len(forged[1])
    with pytest.raises(BadSignature):
        resigner.from_worker(forged)


def test_python_placement_is_a_visible_new_generation(tmp_path, other_python):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        execute(kc, "kept = 1")
        first = worker_pid(kc)
        reply, outputs = execute(kc, f"%klbr placement python:{other_python}")
        assert reply["content"]["status"] == "ok", reply["content"]
        said = stream_text(outputs)
        # What runs there, named: its interpreter, the version, the pid.
        version = value(kc, "__import__('platform').python_version()")
        assert (f"generation 1 ended; generation 2 runs on python:{other_python} "
                f"(python {version} at {other_python}, pid {worker_pid(kc)})") in said, said
        assert value(kc, "__import__('sys').executable") == str(other_python)
        assert value(kc, "__import__('sys').prefix") == str(other_python.parent.parent)
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"  # the namespace does not move
        assert worker_pid(kc) != first
        st = status_rows(kc)
        assert st["generation"] == "2" and st["placement"] == f"python:{other_python}"
        assert str(other_python) in st["worker"] and st["key"] == "shared with the frontend"
        info = kc.kernel_info(reply=True)["content"]
        assert f"python:{other_python}" in info["banner"]
        assert info["language_info"]["name"] == "python"
        # And back: the next one is local again, on the proxy's interpreter.
        reply, _ = execute(kc, "%klbr placement local")
        assert reply["content"]["status"] == "ok"
        assert value(kc, "__import__('sys').executable") == sys.executable
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT number, placement, identity, end_reason FROM generations ORDER BY number").fetchall()
    # (numbers count spares too: a spare that waited on the old placement was never current)
    assert [p for _, p, _, _ in rows] == ["local", f"python:{other_python}", "local"]
    assert json.loads(rows[1][2])["interpreter"] == str(other_python)
    assert rows[0][3].startswith("relocated") and rows[1][3].startswith("relocated")
    moves = [json.loads(p) for (p,) in conn.execute("SELECT payload FROM events WHERE kind = 'placement'")]
    assert moves[0] == {"from": "local", "to": f"python:{other_python}", "generation": 1}
    gens = [g for (g,) in conn.execute("SELECT generation FROM cells WHERE code LIKE '%sys%' ORDER BY id")]
    assert gens == [2, 2, rows[2][0]]


@pytest.mark.parametrize("spec, words", [
    ("python:relative/python", "absolute path"),
    ("python:/nonexistent/bin/python", "does not exist"),
    ("kernelspec:no-such-kernel", "no kernelspec named 'no-such-kernel'"),
    ("nowhere", "no placement"),
])
def test_a_bad_spec_leaves_the_session_where_it_was(kernel, spec, words):
    km, kc = kernel
    execute(kc, "kept = 41")
    pid = worker_pid(kc)
    reply, _ = execute(kc, f"%klbr placement {spec}")
    assert reply["content"]["status"] == "error" and words in reply["content"]["evalue"]
    assert value(kc, "kept + 1") == 42 and worker_pid(kc) == pid
    assert status_rows(kc)["placement"] == "local"


def test_an_interpreter_without_ipykernel_is_named(kernel, bare_python):
    km, kc = kernel
    execute(kc, "kept = 41")
    reply, _ = execute(kc, f"%klbr placement python:{bare_python}")
    assert reply["content"]["status"] == "error"
    assert "has no ipykernel" in reply["content"]["evalue"] and str(bare_python) in reply["content"]["evalue"]
    assert value(kc, "kept + 1") == 42


def test_the_first_generation_runs_where_the_config_says(other_python):
    with start_kernel(extra_arguments=[f"--Supervisor.placement=python:{other_python}"]) as (km, kc):
        assert value(kc, "__import__('sys').executable") == str(other_python)
        assert status_rows(kc)["standby"] != "off"  # a spare on this machine is cheap: kept warm


def test_a_bad_configured_placement_fails_loudly_never_falls_back_to_local(bare_python):
    with start_kernel(extra_arguments=[f"--Supervisor.placement=python:{bare_python}"]) as (km, kc):
        for _ in range(2):  # the next request tries again, and fails the same way
            reply, _ = execute(kc, "1 + 1")
            assert reply["content"]["ename"] == "WorkerStartFailed"
            assert "has no ipykernel" in reply["content"]["evalue"]
        reply, _ = execute(kc, "%klbr placement local")
        assert reply["content"]["status"] == "ok"
        assert value(kc, "1 + 1") == 2


@pytest.fixture
def kernelspec_dir(tmp_path) -> Path:
    """A kernelspec only this test's kernel sees: ipykernel on the test's interpreter."""
    spec = tmp_path / "specs" / "kernels" / "plain-ipykernel"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain ipykernel", "language": "python"}))
    return tmp_path / "specs"


def test_kernelspec_placement_resigns_with_a_fresh_key(tmp_path, kernelspec_dir):
    path = os.pathsep.join([str(kernelspec_dir), os.environ["JUPYTER_PATH"]])
    with start_kernel(env={"JUPYTER_PATH": path, "KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        reply, outputs = execute(kc, "%klbr placement kernelspec:plain-ipykernel")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "generation 2 runs on kernelspec:plain-ipykernel" in stream_text(outputs)
        key = value(kc, "get_ipython().kernel.session.key")
        assert key and key != km.session.key
        # Everything still flows both ways through the re-signing: outputs, input, interrupts.
        reply, outputs = execute(kc, "print('through'); 6 * 7")
        assert stream_text(outputs) == "through\n" and results(outputs) == ["42"]
        # An output past 64 KiB, received as a frame and re-signed without a copy: whole, and recorded.
        reply, outputs = execute(kc, "print('y' * 300_000)")
        assert stream_text(outputs) == "y" * 300_000 + "\n"
        with sqlite3.connect(tmp_path / "log.sqlite3") as db:  # the cell's stream, in however many messages
            rows = db.execute("SELECT content FROM outputs WHERE cell_id = (SELECT max(id) FROM cells)"
                              " AND msg_type = 'stream' ORDER BY seq").fetchall()
        assert "".join(json.loads(content)["text"] for (content,) in rows) == "y" * 300_000 + "\n"
        msg_id = kc.execute("answer = input('name? ')", allow_stdin=True)
        request = kc.get_stdin_msg(timeout=30)
        assert request["content"]["prompt"] == "name? "
        kc.input("klbr")
        execute_done = kc.get_shell_msg(timeout=30)
        assert execute_done["parent_header"]["msg_id"] == msg_id and execute_done["content"]["status"] == "ok"
        assert value(kc, "answer") == "klbr"
        st = status_rows(kc)
        assert st["key"] == "its own, re-signed by the proxy" and st["standby"] == "off"
        assert kc.kernel_info(reply=True)["content"]["banner"].splitlines()[0].endswith("kernelspec:plain-ipykernel)")
        msg_id = kc.execute("print('asleep', flush=True); import time; time.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert value(kc, "answer") == "klbr"  # the same generation, still serving


def test_cell_code_relocates_when_its_cell_ends(tmp_path, other_python, bare_python):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        reply, _ = execute(kc, f"from klbr_kernel import host\ntry:\n    host.relocate('python:{bare_python}')\n"
                               "except host.HostError as e:\n    refused = (e.code, str(e))")
        code, text = value(kc, "refused")
        assert code == "invalid" and "has no ipykernel" in text
        reply, outputs = execute(kc, f"host.relocate('python:{other_python}'); print('finishes here')")
        assert reply["content"]["status"] == "ok" and stream_text(outputs) == "finishes here\n"
        # The move happens once the cell has ended; the next cell waits for the new generation.
        assert value(kc, "__import__('sys').executable") == str(other_python)
        assert status_rows(kc)["placement"] == f"python:{other_python}"


def _on_kernelspec(tmp_path, kernelspec_dir, *options):
    path = os.pathsep.join([str(kernelspec_dir), os.environ["JUPYTER_PATH"]])
    return start_kernel(extra_arguments=["--Supervisor.placement=kernelspec:plain-ipykernel", *options],
                        env={"JUPYTER_PATH": path, "KLBR_DB": str(tmp_path / "log.sqlite3")})


def test_a_silent_link_is_placement_lost_never_rerun_and_no_second_kernel(tmp_path, kernelspec_dir):
    """The worker stops answering (SIGSTOP: a stalled link) mid-cell: PlacementLost within
    link_timeout + 5 s, `unknown` in the store, refusals and no new kernel until `%klbr reconnect`."""
    with _on_kernelspec(tmp_path, kernelspec_dir, "--Supervisor.link_timeout=2") as (km, kc):
        execute(kc, "kept = 1")
        pid = worker_pid(kc)
        msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        reply, outputs = collect(kc, msg_id, timeout=30)
        assert reply["content"]["ename"] == "PlacementLost", reply["content"]
        assert time.monotonic() - stopped < 2 + 5
        user, detail = said(reply["content"]["evalue"])
        assert re.match(r"Cell \[\d+\]'s outcome is unknown: klbr lost the link to the worker running it", user), user
        assert "is not re-run" in user and "`%klbr reconnect`" in user, user
        assert "was running it when the link to it was lost" in detail, detail
        assert process_gone(pid), "the stalled kernel is ended, not left running"
        for _ in range(2):
            reply, _ = execute(kc, "1 + 1")
            assert reply["content"]["ename"] == "PlacementLost" and "%klbr reconnect" in reply["content"]["evalue"]
            assert reply["content"]["evalue"].startswith("Nothing ran: klbr lost the link"), reply["content"]
        assert status_rows(kc)["state"] == "stopped: link lost"  # no second kernel meanwhile
        reply, outputs = execute(kc, "%klbr reconnect")
        assert reply["content"]["status"] == "ok" and "runs on kernelspec:plain-ipykernel" in stream_text(outputs)
        assert value(kc, "1 + 1") == 2
        assert execute(kc, "kept")[0]["content"]["ename"] == "NameError"
    rows = sqlite3.connect(tmp_path / "log.sqlite3").execute("SELECT code, status FROM cells ORDER BY id").fetchall()
    assert ("print('running', flush=True)\nimport time\ntime.sleep(60)", "unknown") in rows
    assert [s for c, s in rows if c == "1 + 1"] == ["refused", "refused", "ok"]


def test_a_worker_elsewhere_that_exits_is_worker_lost_and_replaced(tmp_path, kernelspec_dir):
    with _on_kernelspec(tmp_path, kernelspec_dir) as (km, kc):
        reply, _ = execute(kc, "import os; os._exit(3)")
        assert reply["content"]["ename"] == "WorkerLost" and "exited with status 3" in reply["content"]["evalue"]
        assert value(kc, "6 * 7") == 42
        assert status_rows(kc)["placement"] == "kernelspec:plain-ipykernel"


def test_a_kernel_that_was_stopped_itself_does_not_call_its_worker_lost(tmp_path, kernelspec_dir):
    """Ctrl-Z on the server: the kernel process stops for longer than link_timeout while its worker
    runs on. Sending no pings meanwhile, it has heard nothing, but that silence is its own."""
    with _on_kernelspec(tmp_path, kernelspec_dir, "--Supervisor.link_timeout=2") as (km, kc):
        pid = worker_pid(kc)
        os.kill(km.provisioner.process.pid, signal.SIGSTOP)
        time.sleep(4)  # not synchronisation: the pause itself, twice the link timeout
        os.kill(km.provisioner.process.pid, signal.SIGCONT)
        assert worker_pid(kc) == pid
        assert value(kc, "6 * 7") == 42


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_starved_kernel_loses_nothing_its_worker_publishes(tmp_path, other_python, where):
    """The kernel process is stopped while its worker prints 5000 lines: ipykernel's iopub would drop
    past 1000 waiting messages, the cell's idle included. klbr starts its workers without that mark,
    also on another interpreter."""
    done = tmp_path / "done"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        if where == "python":
            assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"
        proxy = km.provisioner.process.pid
        msg_id = kc.execute(f"import os, signal\nos.kill({proxy}, signal.SIGSTOP)\n"
                            "for i in range(5000):\n    print(i, flush=True)\n"
                            f"open({str(done)!r}, 'w').close()")
        try:
            until(done.exists, 120, "the worker has printed everything while the kernel was stopped")
        finally:
            os.kill(proxy, signal.SIGCONT)
        reply, outputs = collect(kc, msg_id, timeout=60)
        assert reply["content"]["status"] == "ok"
        assert stream_text(outputs).split() == [str(i) for i in range(5000)]


def test_a_kernelspec_worker_that_drops_outputs_while_the_kernel_is_stopped_says_how_many(tmp_path):
    """A kernelspec's worker keeps its own iopub high-water mark (here 20 messages, ipykernel's is
    1000): while the kernel process is stopped, it drops what it publishes past it. jupyter_client
    numbers each message a worker makes, on every channel, so the numbers that never came tell how
    many; the cell says so before its idle, and the cell log keeps the notice."""
    displays = 2000
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        assert execute(kc, "%klbr placement kernelspec:misbehaving-small-iopub-queue")[0]["content"]["status"] == "ok"
        proxy = km.provisioner.process.pid
        reply, outputs = execute(kc, f"import os, signal\nfrom IPython.display import display\n"
                                     f"os.kill({proxy}, signal.SIGSTOP)\ntry:\n"
                                     f"    for i in range({displays}):\n        display(i)\n"
                                     f"finally:\n    os.kill({proxy}, signal.SIGCONT)", timeout=60)
        assert reply["content"]["status"] == "ok"
        shown = [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "display_data"]
        notice = stream_text(outputs, "stderr")
        assert notice.startswith("klbr: the worker dropped "), (len(shown), notice)
        told = int(notice.split()[4])
        assert told > 0 and len(shown) + told == displays, f"{len(shown)} shown, told of {told}, of {displays}"
        assert shown == sorted(shown, key=int), "what came, came in order"
        _, replayed = execute(kc, "%klbr replay")
        assert f"the worker dropped {told} messages" in stream_text(replayed)
        # Nothing dropped, nothing told: also when an interrupt goes as a message through
        # jupyter_client's manager, whose socket gets the worker's answer (klbr never sees it).
        msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, outputs = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "KeyboardInterrupt" and stream_text(outputs, "stderr") == ""
        reply, outputs = execute(kc, "print('after')")
        assert stream_text(outputs) == "after\n"


@pytest.mark.parametrize("where", ["local", "python"])
def test_only_the_iopub_socket_loses_its_high_water_mark(tmp_path, other_python, where):
    """On the newest ipykernel (local) and the oldest admitted (python:): the socket toward the proxy
    takes everything, the sockets ipykernel makes for itself keep their marks."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        if where == "python":
            assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"
        iopub, other = value(kc, "import zmq\nfrom ipykernel.kernelapp import IPKernelApp\n"
                                 "app = IPKernelApp.instance()\n"
                                 "(app.iopub_thread.socket.getsockopt(zmq.SNDHWM), app.context.socket(zmq.PAIR).getsockopt(zmq.SNDHWM))")
        assert (iopub, other) == (0, 1000)


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_workers_shell_is_served_on_its_main_thread(tmp_path, other_python, where):
    """ipykernel 7 reads shell on a thread of its own for subshells, which klbr does not offer: its
    worker serves shell on the main thread, as ipykernel 6 does (where nothing is changed), and
    still serves comms while a cell awaits (tests/test_widgets.py)."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        if where == "python":
            assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"
        threads = value(kc, "import threading\nsorted(t.name for t in threading.enumerate())")
        assert "Shell channel" not in threads and "MainThread" in threads, threads
        # A cell with a top-level await asks ipykernel 7 which thread reads shell: it is answered.
        reply, outputs = execute(kc, "import asyncio\nawait asyncio.sleep(0)\n'awaited'")
        assert reply["content"]["status"] == "ok" and results(outputs) == ["'awaited'"], reply["content"]
        assert value(kc, "import ipykernel\nipykernel.__version__").startswith("6." if where == "python" else "7.")


# Outputs in the order the cell made them, each flush with text to send sending it: a print before a
# display, on a thread, after a flush, to both streams. And then how many times an empty flush hands
# work to the iopub thread once it has sent what it had (ipykernel's own flush: twice, and waits;
# klbr's too when something came meanwhile, the worker's answer to a control request say: the fewest).
IN_ORDER = """\
import sys, threading
from IPython.display import display
print('a')
display('b')
print('c', end='')
sys.stdout.flush()
print('d', file=sys.stderr)
sys.stderr.flush()
thread = threading.Thread(target=lambda: (print('e'), sys.stdout.flush()))
thread.start(); thread.join()
display('f')
"""
EMPTY_FLUSH_HANDOVERS = """\
import threading
from ipykernel.iostream import IOPubThread
_schedule, handed, counts = IOPubThread.schedule, [], []
IOPubThread.schedule = lambda self, f: (handed.append(f), _schedule(self, f))[1]
try:
    for _ in range(20):
        print('.', end='', flush=True)
        for _ in range(2):  # what the iopub thread had queued is sent, and what that queued (the stream's send)
            sent = threading.Event()
            _schedule(sys.stdout.pub_thread, sent.set)
            assert sent.wait(10)
        before = len(handed)
        sys.stdout.flush(); sys.stderr.flush()
        counts.append(len(handed) - before)
finally:
    IOPubThread.schedule = _schedule
min(counts)
"""

SLOW_SENDS = """\
import sys, time, threading
def slow(msg):
    time.sleep(0.5)
    return msg
hooked = threading.Event()
sys.stdout.pub_thread.schedule(lambda: (sys.stdout.register_hook(slow), hooked.set()))
assert hooked.wait(10)
"""


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_flush_sends_what_waits_in_order_and_an_empty_one_returns_at_once(tmp_path, other_python, where):
    """klbr's workers return at once from a flush with nothing to send (ipykernel waits for a round
    trip to its iopub thread, four times a cell); outputs still come in the order they were made,
    on the newest ipykernel and on the oldest admitted."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        if where == "python":
            assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"
        reply, outputs = execute(kc, IN_ORDER)
        assert reply["content"]["status"] == "ok", reply["content"]
        made = [(m["content"]["name"], m["content"]["text"]) if m["msg_type"] == "stream"
                else ("display", m["content"]["data"]["text/plain"])
                for m in outputs if m["msg_type"] in ("stream", "display_data")]
        assert made == [("stdout", "a\n"), ("display", "'b'"), ("stdout", "c"), ("stderr", "d\n"),
                        ("stdout", "e\n"), ("display", "'f'")], made
        assert value(kc, EMPTY_FLUSH_HANDOVERS) == 0
        # A timed flush under way has emptied the buffers and not yet queued its message (slowed here
        # by a hook on the iopub thread): the cell's last flush waits for it, its idle comes after.
        execute(kc, SLOW_SENDS)
        reply, outputs = execute(kc, "import time\nprint('x')\ntime.sleep(0.3)")
        assert [m["msg_type"] for m in outputs][-2:] == ["stream", "status"], outputs
        execute(kc, "sys.stdout.pub_thread.schedule(lambda: sys.stdout.unregister_hook(slow))")


# An ipykernel whose init_iopub makes its socket from its own context, not the one it is handed: as
# a later ipykernel might. The bootstrap cannot lift the mark there, and must say so.
INIT_IOPUB_ELSEWHERE = """\
from ipykernel.kernelapp import IPKernelApp
_init_iopub = IPKernelApp.init_iopub
def init_iopub(self, context):
    _init_iopub(self, self.context)
IPKernelApp.init_iopub = init_iopub
"""


def test_a_worker_whose_ipykernel_lacks_a_patch_target_says_once_what_is_absent(tmp_path, other_python):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INIT_IOPUB_ELSEWHERE)
    python = tmp_path / "python"  # that interpreter, with the changed ipykernel
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {other_python} "$@"\n')
    python.chmod(0o755)
    log = tmp_path / "kernel.log"
    notice = f" on {other_python}: iopub keeps ipykernel's high-water mark"
    with start_kernel(extra_arguments=[f"--Supervisor.placement=python:{python}"], log=log,
                      env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        assert value(kc, "6 * 7") == 42  # it serves, with ipykernel's own iopub
        until(lambda: notice in log.read_text(), 30, "the kernel's log says what is absent")
        until(lambda: standby(kc) == "ready", 60, "the spare started, on the same interpreter")
        assert execute(kc, "%klbr restart")[0]["content"]["status"] == "ok"
        assert value(kc, "6 * 7") == 42  # a third worker, and each said it as it started
    said = [line for line in log.read_text().splitlines() if line.startswith("klbr worker: ")]
    assert len(said) == 1 and notice in said[0], said
    assert "IPKernelApp.init_iopub made no PUB socket" in said[0] and "may lose outputs" in said[0]
