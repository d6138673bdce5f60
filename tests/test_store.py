"""The cell log: durable, recoverable, exportable, and safe when the disk is not."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from jupyter_client.session import Session

from klbr_supervisor.store.queries import connect, export_notebook, write_notebook
from klbr_supervisor.store.schema import migrate
from utils import collect, execute, raw_socket, receive, results, said, start_kernel, stream_text


def _db(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    return conn


def _cells(path, session=None):
    conn = _db(path)
    if session is None:
        session = conn.execute("SELECT max(id) FROM sessions").fetchone()[0]
    return conn.execute("SELECT * FROM cells WHERE session_id = ? ORDER BY id", (session,)).fetchall()


def _cli(*args, db) -> str:
    return subprocess.run([sys.executable, "-m", "klbr_kernel", *args, "--db", str(db)],
                          check=True, capture_output=True, text=True).stdout


@contextmanager
def kernel_on(db: Path, *extra: str, env: dict | None = None):
    with start_kernel(extra_arguments=list(extra), env={"KLBR_DB": str(db), **(env or {})}) as (km, kc):
        yield km, kc


def test_every_cell_is_recorded_with_outputs_and_outcome(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        execute(kc, "print('hello'); 6 * 7")
        execute(kc, "1 / 0")
        execute(kc, "x = 1", silent=True)  # a variable explorer's probe: not a cell
        execute(kc, "y = 2", store_history=False)
    rows = _cells(db)
    assert [(r["execution_count"], r["status"], r["code"]) for r in rows] == [
        (1, "ok", "print('hello'); 6 * 7"), (2, "error", "1 / 0")]
    assert rows[1]["error"].startswith("ZeroDivisionError")
    outs = _db(db).execute("SELECT msg_type FROM outputs WHERE cell_id = ? ORDER BY seq", (rows[0]["id"],)).fetchall()
    assert [o[0] for o in outs] == ["stream", "execute_result"]
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    session = _db(db).execute("SELECT * FROM sessions").fetchone()
    assert session["ended"] is not None and session["kernel"] == "klbr"


def test_a_flood_of_output_messages_loses_none_on_the_way_or_in_the_log(tmp_path):
    """20 000 flushed prints are 20 000 iopub messages, far past ZMQ's default high-water mark of
    1000 between worker and proxy: the frontend and the cell log still see every line."""
    db = tmp_path / "log.sqlite3"
    lines = 20_000
    with kernel_on(db) as (km, kc):
        reply, outputs = execute(kc, f"for i in range({lines}):\n    print(i, flush=True)", timeout=120)
    assert reply["content"]["status"] == "ok"
    shown = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream")
    assert shown.split() == [str(i) for i in range(lines)]
    cell = _cells(db)[0]
    recorded = _db(db).execute("SELECT content FROM outputs WHERE cell_id = ? ORDER BY seq", (cell["id"],)).fetchall()
    text = "".join(json.loads(row[0])["text"] for row in recorded)
    assert text.split() == [str(i) for i in range(lines)]
    assert not cell["outputs_truncated"]


def test_getpass_answers_are_never_stored(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        msg_id = kc.execute("import getpass\nsecret = getpass.getpass('pw: ')\nlen(secret)", allow_stdin=True)
        kc.get_stdin_msg(timeout=10)
        kc.input("correct horse battery staple")
        collect(kc, msg_id)
    data = db.read_bytes() + (db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists() else b"")
    assert b"correct horse" not in data
    assert _cells(db)[0]["status"] == "ok"


def test_a_cell_running_when_the_proxy_is_sigkilled_reads_unknown(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        execute(kc, "before = 1")
        kc.execute("import time\ntime.sleep(600)")
        while kc.get_iopub_msg(timeout=10)["msg_type"] != "execute_input":
            pass
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        km.provisioner.process.wait(timeout=5)
    assert [r["status"] for r in _cells(db)] == ["ok", "running"]
    with kernel_on(db) as (km, kc):  # a new kernel on the same file recovers the orphan
        execute(kc, "1")
        conn = _db(db)
        first = conn.execute("SELECT min(id) FROM sessions").fetchone()[0]
        rows = _cells(db, first)
        assert [r["status"] for r in rows] == ["ok", "unknown"]
        assert "not re-run" in rows[1]["error"]
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE session_id = ?", (first,))]
        assert "cell_unknown" in kinds
        assert conn.execute("SELECT ended FROM sessions WHERE id = ?", (first,)).fetchone()[0] is not None


def test_lost_and_aborted_cells_are_recorded_and_history_survives_the_loss(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        execute(kc, "a = 'first'")
        # The lost cell must have the other queued behind it when it dies: a silent execute (no
        # cell) holds the worker until the proxy has read both, which its own answer to a
        # kernel_info sent after them on the same socket proves. (Sent and run at once, the loss
        # could be over before the second arrived, which then rightly ran on the next generation.)
        go = tmp_path / "go"
        kc.execute(f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)",
                   silent=True, store_history=False)
        ids = [kc.execute(c) for c in ("import os; os.kill(os.getpid(), 9)", "b = 2")]
        info = kc.kernel_info()
        while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != info:
            pass
        go.touch()
        replied = set()
        while not set(ids) <= replied:
            replied.add(kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id"))
        msg_id = kc.history(hist_access_type="tail", n=10, output=False, raw=True)
        reply = kc.get_shell_msg(timeout=10)
        while reply["parent_header"]["msg_id"] != msg_id:
            reply = kc.get_shell_msg(timeout=10)
        codes = [h[2] for h in reply["content"]["history"]]
        assert codes[:2] == ["a = 'first'", "import os; os.kill(os.getpid(), 9)"]
        _, outputs = execute(kc, "%klbr history 5")
        assert "a = 'first'" in stream_text(outputs)
    statuses = [(r["code"][:8], r["status"], r["generation"]) for r in _cells(db)]
    assert statuses[:3] == [("a = 'fir", "ok", 1), ("import o", "lost", 1), ("b = 2", "aborted", None)]


def test_export_validates_and_shows_the_recorded_outputs(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        execute(kc, "print('kept output')")
        execute(kc, "h = display('v1', display_id=True); h.update('v2')")
        execute(kc, "raise ValueError('recorded error')")
        ids = [kc.execute(code) for code in ("import os; os.kill(os.getpid(), 9)", "'never runs'")]
        for _ in ids:
            kc.get_shell_msg(timeout=30)
    session = _db(db).execute("SELECT max(id) FROM sessions").fetchone()[0]
    out = tmp_path / "recovered.ipynb"
    assert "Wrote 5 cells" in _cli("export", str(session), "-o", str(out), db=db)
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].outputs[0].text == "kept output\n"
    assert nb.cells[1].outputs[0].data["text/plain"] == "'v2'"
    assert nb.cells[2].outputs[-1].ename == "ValueError"
    assert [c.metadata.klbr.status for c in nb.cells] == ["ok", "ok", "error", "lost", "aborted"]
    assert nb.cells[3].outputs[-1].ename == "WorkerLost"
    listing = _cli("sessions", db=db)
    assert f"{session} " in listing and "ended" in listing and "aborted" in listing
    assert "ValueError" in _cli("cells", str(session), db=db)
    assert "kept output" in _cli("show", str(_cells(db, session)[0]["id"]), db=db)


def test_a_10000_cell_session_exports_in_seconds(tmp_path):
    db = tmp_path / "big.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions (id, uuid, host, pid, started) VALUES (1, 'u', 'h', 1, '2026-01-01')")
    for i in range(1, 10_001):
        conn.execute("INSERT INTO cells (id, session_id, msg_id, execution_count, code, status, started)"
                     " VALUES (?, 1, ?, ?, ?, 'ok', '2026-01-01')", (i, f"m{i}", i, f"x = {i}\nprint(x)"))
        conn.execute("INSERT INTO outputs VALUES (?, 1, 'stream', ?)", (i, f'{{"name": "stdout", "text": "{i}\\n"}}'))
    conn.execute("COMMIT")
    start = time.perf_counter()
    write_notebook(export_notebook(connect(str(db)), 1), str(tmp_path / "big.ipynb"))
    elapsed = time.perf_counter() - start
    nb = nbformat.read(tmp_path / "big.ipynb", as_version=4)
    nbformat.validate(nb)
    assert len(nb.cells) == 10_000 and nb.cells[-1].outputs[0].text == "10000\n"
    # A generous bound: the speed is a figure, not a behaviour (with 50 kernels running beside it,
    # this machine took 4.9 s).
    assert elapsed < 20, f"{elapsed:.2f}s"


def test_outputs_past_the_limit_are_counted_not_kept(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db, "--Store.max_output_bytes=10000") as (km, kc):
        reply, outputs = execute(kc, "for i in range(50):\n    print('z' * 1000, flush=True)")
        shown = sum(len(m["content"]["text"]) for m in outputs if m["msg_type"] == "stream")
        assert shown == 50 * 1001  # the notebook still sees everything
    row = _cells(db)[0]
    assert row["outputs_truncated"] == 1 and row["output_bytes"] > 50_000
    kept = _db(db).execute("SELECT sum(length(content)) FROM outputs WHERE cell_id = ?", (row["id"],)).fetchone()[0]
    assert kept <= 10_000


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    # The machine's tools (mount, umount, chattr) by name, here and below.
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)  # noqa: S607


def test_a_full_disk_pauses_the_session_and_it_resumes_when_space_returns(tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "4m")
    try:
        db = mnt / "log.sqlite3"
        with kernel_on(db) as (km, kc):
            execute(kc, "1")
            filler = mnt / "filler"
            try:  # fill the disk behind the kernel's back
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            except OSError:
                pass
            paused = None
            for i in range(20):  # the next writes fail: a big output cell
                reply, _ = execute(kc, f"print('x' * 200_000)  # {i}")
                if reply["content"].get("ename") == "SessionPaused":
                    paused = reply["content"]
                    break
            assert paused is not None, "the session paused"
            user, detail = said(paused["evalue"])
            assert user.startswith("This cell was not run, and the namespace is as it was: klbr runs nothing it cannot "
                                   "record"), user
            assert "Recording resumes by itself at the next cell" in user and "`%klbr status`" in user, user
            assert str(db) in detail and "full" in detail, detail
            _, outputs = execute(kc, "%klbr status")
            assert "PAUSED" in stream_text(outputs)
            reply, _ = execute(kc, "1 + 1")
            assert reply["content"]["ename"] == "SessionPaused"  # still refused, still answering
            filler.unlink()
            reply, outputs = execute(kc, "'resumed'")
            assert reply["content"]["status"] == "ok"
        assert _cells(db)[-1]["code"] == "'resumed'"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # noqa: S607 — the machine's tool, by name


def test_a_read_only_database_pauses_the_session(tmp_path):
    db = tmp_path / "log.sqlite3"
    files = [db, db.with_name(db.name + "-wal")]
    with kernel_on(db) as (km, kc):
        execute(kc, "1")
        # Root ignores permission bits: make the files immutable instead, mid-session.
        subprocess.run(["chattr", "+i", *map(str, files)], check=True)  # noqa: S607 — the machine's tool, by name
        try:
            reply, _ = execute(kc, "2")
            assert reply["content"]["ename"] == "SessionPaused"
            assert str(db) in reply["content"]["evalue"]
            reply, _ = execute(kc, "%klbr status")
            assert reply["content"]["status"] == "ok"  # the kernel keeps answering
        finally:
            subprocess.run(["chattr", "-i", *map(str, files)], check=True)  # noqa: S607 — the machine's tool, by name
        reply, _ = execute(kc, "3")
        assert reply["content"]["status"] == "ok"
    assert [r["code"] for r in _cells(db)][-1] == "3"


def test_a_store_that_cannot_open_runs_unrecorded_or_refuses_when_required(tmp_path):
    bad = "/proc/klbr-cannot-be-here/log.sqlite3"
    with kernel_on(Path(bad)) as (km, kc):
        reply, outputs = execute(kc, "print('still runs')")
        streams = [m["content"] for m in outputs if m["msg_type"] == "stream"]
        assert streams[0]["name"] == "stderr" and "runs unrecorded" in streams[0]["text"] and bad in streams[0]["text"]
        assert streams[-1]["text"] == "still runs\n"
    with kernel_on(Path(bad), "--Store.required=True") as (km, kc):
        reply, _ = execute(kc, "print('must not run')")
        assert reply["content"]["ename"] == "SessionPaused"


def test_eight_kernels_share_one_file_without_losing_a_row(tmp_path):
    db = tmp_path / "shared.sqlite3"
    errors: list = []

    def one_kernel(k: int) -> None:
        try:
            with kernel_on(db, "--Supervisor.standby=False") as (km, kc):
                ids = {kc.execute(f"{k} * 1000 + {i}") for i in range(200)}
                while ids:
                    msg = kc.get_shell_msg(timeout=120)
                    if msg["parent_header"].get("msg_id") in ids:
                        assert msg["content"]["status"] == "ok", msg["content"]
                        ids.discard(msg["parent_header"]["msg_id"])
        except Exception as e:  # reported below, with the kernel's number
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=one_kernel, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    conn = _db(db)
    assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 8
    counts = [r[0] for r in conn.execute("SELECT count(*) FROM cells WHERE status = 'ok' GROUP BY session_id")]
    assert counts == [200] * 8
    assert conn.execute("SELECT count(*) FROM outputs").fetchone()[0] == 1600


def test_a_kernel_keeps_recording_after_another_kernel_on_its_file_shuts_down(tmp_path):
    # Two notebooks on the default store: closing one must not cost the other its log. (A kernel
    # that dropped its own file locks let the other, closing last as it believed, delete the WAL.)
    db = tmp_path / "shared.sqlite3"
    with kernel_on(db) as (_, kc):
        execute(kc, "print('before')")
        with kernel_on(db) as (_, kc2):
            execute(kc2, "print('other')")
        reply, _ = execute(kc, "print('after')")
        assert reply["content"]["status"] == "ok"
        rows = _db(db).execute("SELECT code, status FROM cells ORDER BY id").fetchall()
        assert [tuple(r) for r in rows] == [("print('before')", "ok"), ("print('other')", "ok"),
                                             ("print('after')", "ok")]
        texts = [r[0] for r in _db(db).execute("SELECT content FROM outputs ORDER BY cell_id")]
        assert [json.loads(t)["text"] for t in texts] == ["before\n", "other\n", "after\n"]


def test_prune_deletes_old_ended_sessions_only(tmp_path):
    db = tmp_path / "log.sqlite3"
    with kernel_on(db) as (km, kc):
        execute(kc, "1")
    conn = _db(db)
    conn.execute("UPDATE sessions SET ended = '2000-01-01T00:00:00.000Z'")
    conn.commit()
    with kernel_on(db) as (km, kc):
        execute(kc, "2")
        assert "Pruned 1" in _cli("prune", "--older-than", "30", db=db)
        assert _db(db).execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
        reply, _ = execute(kc, "3")
        assert reply["content"]["status"] == "ok"


@pytest.mark.parametrize("key", [None, b""], ids=["signed", "unsigned"])
def test_a_resent_execute_is_answered_from_the_record_not_run_again(tmp_path, key):
    """The same frames again are answered once, never re-run; the same msg_id in other bytes (here
    only a later date, signed anew) is another message, and runs (semantics 9)."""
    db = tmp_path / "log.sqlite3"
    manager = {"session": Session(key=key)} if key is not None else None
    with start_kernel(env={"KLBR_DB": str(db)}, manager=manager) as (km, kc):
        execute(kc, "runs = 0")
        with raw_socket(km, "shell") as (sock, session):
            msg = session.msg("execute_request", {"code": "runs += 1\nruns", "silent": False, "store_history": True,
                                                  "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
            frames = session.serialize(msg)
            sock.send_multipart(frames)
            sock.send_multipart(frames)  # byte-identical: a client resending after a reconnect
            replies = [receive(sock, session) for _ in range(2)]
            again = dict(msg, header=dict(msg["header"], date="2030-01-01T00:00:00Z"))  # same msg_id, other bytes
            sock.send_multipart(session.serialize(again))
            other = receive(sock, session)
        assert {r["parent_header"]["msg_id"] for r in [*replies, other]} == {msg["header"]["msg_id"]}
        assert [r["content"] for r in replies][1:] == [replies[0]["content"]]
        assert other["content"]["execution_count"] == replies[0]["content"]["execution_count"] + 1
        _, outputs = execute(kc, "runs")
        assert results(outputs) == ["2"]
    assert [r["code"] for r in _cells(db)].count("runs += 1\nruns") == 2
