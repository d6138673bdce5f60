"""Starting, interrupting and ending workers: always an answer, never an orphan."""

from __future__ import annotations

import os
import re
import signal
import time

from jupyter_client.manager import KernelManager
from jupyter_client.session import Session

from utils import (
    collect,
    drain,
    execute,
    hung_in_c,
    kill_quietly,
    launched,
    process_gone,
    processes,
    raw_socket,
    results,
    said,
    send_raw,
    standby,
    start_kernel,
    stream_text,
    until,
    wait_for_stream,
    worker_pid,
)


def test_kernel_info_is_answered_before_the_worker_is_ready():
    with start_kernel(extra_arguments=["--Supervisor.worker_kernel=dies-on-start"]) as (km, kc):
        kc.kernel_info()
        info = kc.get_shell_msg(timeout=5)["content"]
        assert info["implementation"] == "klbr"
        assert info["language_info"]["name"] == "python"


def test_kernel_info_is_answered_while_the_proxy_itself_still_starts(tmp_path):
    # A config file that takes 5 s: the proxy cannot serve before it has read it.
    (tmp_path / "jupyter_klbr_config.py").write_text("import time\ntime.sleep(5)\n")
    km = KernelManager(kernel_name="klbr")
    start = time.monotonic()
    km.start_kernel(env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path)})
    kc = km.client()
    kc.start_channels()
    try:
        welcome = kc.get_iopub_msg(timeout=20)
        assert welcome["msg_type"] == "iopub_welcome"
        early = kc.kernel_info()
        reply = kc.get_shell_msg(timeout=20)
        answered_in = time.monotonic() - start
        assert reply["parent_header"]["msg_id"] == early
        assert reply["content"]["implementation"] == "klbr"
        assert answered_in < 4, f"kernel_info took {answered_in:.1f} s: it waited for the proxy"
        brackets = [m for m in drain(kc.iopub_channel) if m["parent_header"].get("msg_id") == early]
        assert [m["content"]["execution_state"] for m in brackets] == ["busy", "idle"]
        # Sent before the proxy took over: all answered once it has, and a forged one never.
        Session(key=b"another key").send(kc.shell_channel.socket, "kernel_info_request")
        cell = kc.execute("40 + 2")
        later = kc.kernel_info()
        replies = {}
        while len(replies) < 2:
            msg = kc.get_shell_msg(timeout=30)
            replies[msg["parent_header"]["msg_id"]] = msg
        assert set(replies) == {cell, later}
        assert replies[cell]["content"]["status"] == "ok"
        assert not kc.shell_channel.msg_ready()
        # One session toward the frontend, before and after the handover (semantics 10).
        assert {m["header"]["session"] for m in [reply, *replies.values()]} == {reply["header"]["session"]}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_worker_that_dies_while_starting_gives_WorkerStartFailed_with_its_stderr():
    with start_kernel(extra_arguments=["--Supervisor.worker_kernel=dies-on-start"]) as (km, kc):
        for _ in range(2):  # each cell tries again, and each gets its answer
            reply, outputs = execute(kc, "1 + 1", timeout=30)
            content = reply["content"]
            assert content["status"] == "error"
            assert content["ename"] == "WorkerStartFailed"
            user, detail = said(content["evalue"])
            assert re.match(r"Cell \[\d+\] did not run: the worker to run it did not start, so nothing ran\. The "
                            r"next cell tries to start a new one; fix what stopped this one first", user), user
            assert "exited with status 3" in detail and "Last lines of its stderr" in detail, detail
            assert "the worker cannot load its numpy" in detail
            assert [m["content"]["execution_state"] for m in outputs if m["msg_type"] == "status"] == ["busy", "idle"]
            assert any(m["msg_type"] == "error" for m in outputs)


def test_interrupt_stops_the_cell_and_keeps_the_namespace(kernel):
    km, kc = kernel
    execute(kc, "kept = 42")
    msg_id = kc.execute("import time\nprint('running', flush=True)\ntime.sleep(60)")
    # Interrupted once its code runs: a SIGINT that lands before (between execute_input
    # and the code) is lost in plain ipykernel too.
    while kc.get_iopub_msg(timeout=10)["msg_type"] != "stream":
        pass
    km.interrupt_kernel()
    reply, _ = collect(kc, msg_id, timeout=10)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    _, outputs = execute(kc, "kept")
    assert results(outputs) == ["42"]


def test_debug_and_usage_requests_reach_the_worker(kernel):
    km, kc = kernel
    kc.kernel_info()
    assert kc.get_shell_msg(timeout=5)["content"]["debugger"] is True
    msg = kc.session.msg("debug_request", {"type": "request", "seq": 1, "command": "initialize",
                                           "arguments": {"clientID": "test", "adapterID": "python", "pathFormat": "path"}})
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=20)
    assert reply["msg_type"] == "debug_reply"
    assert reply["content"]["success"] is True
    msg = kc.session.msg("usage_request", {})
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=10)
    assert reply["msg_type"] == "usage_reply"
    assert reply["content"]["pid"] != km.provisioner.process.pid  # the worker's, not the proxy's


def test_shutdown_replies_fast_and_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"  # the kernel's own TMPDIR: what other processes leave in /tmp is not its
    tmp.mkdir()
    with start_kernel(env={"TMPDIR": str(tmp)}) as (km, kc):
        pid = worker_pid(kc)
        _, outputs = execute(kc, "import subprocess\nchild = subprocess.Popen(['sleep', '600'])\nchild.pid")
        grandchild = int(results(outputs)[0])
        # a cell that ignores SIGTERM: shutdown must not wait for it beyond the SIGKILL grace
        msg_id = kc.execute("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "print('ignoring SIGTERM', flush=True)\ntime.sleep(600)")
        while (m := kc.get_iopub_msg(timeout=10))["parent_header"].get("msg_id") != msg_id \
                or m["msg_type"] != "stream":
            pass
        proxy = km.provisioner.process
        start = time.monotonic()
        kc.shutdown()
        reply = kc.get_control_msg(timeout=5) if hasattr(kc, "get_control_msg") else kc.control_channel.get_msg(timeout=5)
        elapsed = time.monotonic() - start
        assert reply["msg_type"] == "shutdown_reply" and reply["content"]["status"] == "ok"
        assert elapsed < 3, f"shutdown_reply after {elapsed:.1f}s"
        assert proxy.wait(timeout=5) == 0
    assert process_gone(pid) and process_gone(grandchild)
    assert not os.listdir(tmp)


def test_a_routine_session_puts_no_warning_in_the_log(tmp_path):
    # Start, a cell, the warm spare, shutdown: what a Jupyter server's log shows of klbr.
    km = KernelManager(kernel_name="klbr")
    with open(tmp_path / "kernel.log", "w") as stderr:
        km.start_kernel(stderr=stderr)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        execute(kc, "1 + 1")
        until(lambda: standby(kc) == "ready", 30, "the spare started and is ready")
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    log = (tmp_path / "kernel.log").read_text()
    assert "WARNING" not in log and "ERROR" not in log, log


def test_sigterm_to_the_proxy_ends_its_workers():
    with start_kernel() as (km, kc):
        pid = worker_pid(kc)
        proxy = km.provisioner.process
        os.kill(proxy.pid, signal.SIGTERM)
        assert proxy.wait(timeout=5) == 0
        assert process_gone(pid, timeout=2)


def test_workers_die_with_a_sigkilled_proxy_even_hung_in_c(tmp_path):
    tmp = tmp_path / "tmp"  # the kernel's own TMPDIR, as in the shutdown test above
    tmp.mkdir()
    with start_kernel(env={"TMPDIR": str(tmp)}) as (km, kc):
        pid, grandchild = hung_in_c(kc, tmp_path)
        proxy = km.provisioner.process
        try:
            os.kill(proxy.pid, signal.SIGKILL)
            proxy.wait(timeout=5)
            assert process_gone(pid, timeout=5), "worker outlived its proxy"
            assert process_gone(grandchild, timeout=5), "the worker's child outlived the proxy"
            # The reaper removes the runtime files after it killed the groups.
            until(lambda: not os.listdir(tmp), 5, f"the dead proxy's runtime files are gone: {os.listdir(tmp)}")
        finally:
            kill_quietly(pid)
            kill_quietly(grandchild)


def test_execution_counts_and_history_agree_across_a_loss(kernel):
    km, kc = kernel
    execute(kc, "10")
    execute(kc, "20")
    reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)")
    assert reply["content"]["ename"] == "WorkerLost"
    lost = reply["content"]["execution_count"]
    assert lost == 3
    reply, outputs = execute(kc, "30")
    assert reply["content"]["execution_count"] == 4
    _, outputs = execute(kc, "print(_, Out[4], In[4], len(In))")
    assert stream_text(outputs) == "30 30 30 6\n"


def test_a_config_file_worker_replaces_the_prelaunched_one(tmp_path):
    """The default worker starts before the proxy reads its config; a config file that names another
    worker must still get it, and the early one must not linger."""
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.worker_kernel = 'misbehaving-exit'\n")
    with start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}) as (km, kc):
        reply, _ = execute(kc, "misbehave()")  # only the misbehaving worker knows this cell
        assert reply["content"]["ename"] == "WorkerLost"
        assert "exited with status 3" in reply["content"]["evalue"]
        # The prelaunched worker (`python -m klbr_supervisor.boot.worker PROXY_PID ...`) is gone while
        # the kernel serves, not only with it: the supervisor ends it before its first generation.
        proxy = str(km.provisioner.process.pid).encode()
        early = processes(lambda words: b"klbr_supervisor.boot.worker" in words and proxy in words)
        assert not early, early


def test_a_kernel_whose_tmpdir_is_unusable_still_starts_and_runs_cells():
    """The early spawn makes its directory in TMPDIR directly; when it cannot, the supervisor starts
    the first worker instead (tempfile looks further), and the user sees nothing but a working kernel."""
    with start_kernel(env={"TMPDIR": "/nonexistent/klbr-test"}) as (km, kc):
        reply, outputs = execute(kc, "6 * 7")
        assert reply["content"]["status"] == "ok"
        assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["42"]


def test_shutdown_while_a_new_generation_is_starting_still_replies_at_once():
    with start_kernel() as (km, kc):
        reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)")
        assert reply["content"]["ename"] == "WorkerLost"  # its replacement is starting now
        proxy = km.provisioner.process
        start = time.monotonic()
        kc.shutdown()
        reply = kc.control_channel.get_msg(timeout=5)
        assert reply["msg_type"] == "shutdown_reply"
        assert time.monotonic() - start < 3
        assert proxy.wait(timeout=5) == 0


def test_a_second_shutdown_request_while_stopping_is_answered_too(tmp_path):
    """A frontend that asks again (or two frontends at once): the second request came while the
    first was stopping the kernel, and was answered InternalError (an illegal move of the proxy's
    state, logged with its traceback). The worker here ignores SIGTERM, so the stop lasts its kill
    grace, long enough for the second request to come while the proxy is stopping."""
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=["--Supervisor.kill_grace=5"], log=log) as (km, kc):
        msg_id = kc.execute("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "print('ignoring SIGTERM', flush=True)\ntime.sleep(600)")
        wait_for_stream(kc, msg_id)
        proxy = km.provisioner.process
        first = kc.shutdown()
        until(lambda: _status_of(kc, first) == "busy", 30, "the first shutdown_request under way")
        second = kc.shutdown()
        replies = {}
        while len(replies) < 2:
            reply = kc.control_channel.get_msg(timeout=60)
            replies[reply["parent_header"]["msg_id"]] = reply
        assert {msg_id: (r["msg_type"], r["content"]["status"]) for msg_id, r in replies.items()} == {
            first: ("shutdown_reply", "ok"), second: ("shutdown_reply", "ok")}
        assert proxy.wait(timeout=60) == 0
    assert "InternalError" not in log.read_text() and "Traceback" not in log.read_text()


def test_shutdown_requests_until_the_kernel_has_exited_are_never_an_internal_error(tmp_path):
    """A client that sends shutdown_request, then its manager's own (kc.shutdown, then
    km.shutdown_kernel): one that came once the proxy had stopped, before its sockets closed, was
    answered InternalError with a traceback in the log (no task can start then)."""
    log = tmp_path / "kernel.log"
    with start_kernel(log=log) as (km, kc):
        proxy = km.provisioner.process
        replies = []
        with raw_socket(km, "control") as (sock, session):
            while proxy.poll() is None:
                send_raw(sock, session, "shutdown_request", {"restart": False})
                while sock.poll(1):  # what came back meanwhile, up to 1 ms for it: the next one then
                    replies.append(session.deserialize(session.feed_identities(sock.recv_multipart())[1]))
        assert proxy.wait(timeout=30) == 0
    assert replies and {(r["msg_type"], r["content"]["status"]) for r in replies} == {("shutdown_reply", "ok")}
    text = log.read_text()
    assert "InternalError" not in text and "Traceback" not in text and "never awaited" not in text


def _status_of(kc, msg_id: str) -> str | None:
    """The execution state the next iopub message says for `msg_id`, if it is a status of it."""
    msg = kc.get_iopub_msg(timeout=30)
    if msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id:
        return msg["content"]["execution_state"]
    return None


def test_shutdown_answers_a_cell_whose_outcome_is_still_committing(tmp_path):
    """The cell's worker holds the database's write lock, so its outcome cannot commit: its reply is
    held (semantics 3) when the shutdown comes, and a cell waits behind it. Shutdown wins: both are
    answered, and so is the shutdown."""
    db, log = tmp_path / "log.sqlite3", tmp_path / "kernel.log"
    with start_kernel(extra_arguments=["--log-level=DEBUG"], env={"KLBR_DB": str(db)}, log=log) as (km, kc):
        held = kc.execute(f"import sqlite3\nlock = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
                          "lock.execute('BEGIN IMMEDIATE')\n'locked'")
        # The proxy has its reply and idle (and holds them): the worker is marked done with it.
        until(lambda: "busy -> ready (cell done)" in log.read_text(), 30, "the cell is finished")
        queued = kc.execute("'behind it'")
        kc.shutdown()
        reply = kc.get_control_msg(timeout=30)
        assert reply["msg_type"] == "shutdown_reply" and reply["content"]["status"] == "ok"
        answers = {}
        while len(answers) < 2:
            msg = kc.get_shell_msg(timeout=30)
            answers[msg["parent_header"]["msg_id"]] = msg["content"]["status"]
        assert answers == {held: "ok", queued: "aborted"}


def test_a_kernel_whose_launcher_is_killed_ends_with_its_workers():
    """As ipykernel ends when the process in JPY_PARENT_PID does: a Jupyter server or papermill run
    that is SIGKILLed must not leave kernels (and their workers' memory) behind."""
    with launched("klbr", "import os; (os.getpid(),)") as (launcher, (kernel, worker)):
        launcher.kill()
        assert process_gone(kernel, timeout=15), "the kernel outlived the process that started it"
        assert process_gone(worker, timeout=5)
