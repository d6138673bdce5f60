"""Only the same message sent again is a resend (DESIGN.md semantics 9): a msg_id alone identifies
nothing, since every `KernelManager.client()` gets a `Session.clone()` whose message counter starts
again, so a second client reuses the first one's msg_ids with other code. Such a cell runs."""

from __future__ import annotations

import sqlite3

import pytest
from jupyter_client.session import Session

from klbr_supervisor.store import queries
from klbr_supervisor.store.schema import MIGRATIONS, VERSION, migrate
from utils import execute, raw_socket, receive, start_kernel


def _client(km):
    """A new client of `km`, as a script or nbclient makes one, once its iopub is subscribed (the
    kernel greets each subscriber), having sent nothing: its next msg_id is its counter's first."""
    kc = km.client()
    kc.start_channels()
    while kc.get_iopub_msg(timeout=30)["msg_type"] != "iopub_welcome":
        pass
    return kc


def _run(kc, code: str) -> tuple[dict, list[dict]]:
    """`code` through `execute_interactive`, which waits for its idle (a bracket that never closes
    is its TimeoutError); the reply, and the iopub messages of the request in order."""
    seen: list[dict] = []
    reply = kc.execute_interactive(code, output_hook=seen.append, timeout=30)
    return reply, seen


@pytest.mark.parametrize("key", [None, b""], ids=["signed", "unsigned"])
def test_a_second_client_reusing_the_first_ones_msg_ids_runs_its_cell(tmp_path, key):
    db, log = tmp_path / "log.sqlite3", tmp_path / "kernel.log"
    manager = {"session": Session(key=key)} if key is not None else None
    with start_kernel(env={"KLBR_DB": str(db)}, manager=manager, log=log) as (km, _):
        first = _client(km)
        reply1, _ = _run(first, "print(1)")
        first.stop_channels()
        second = _client(km)
        reply2, seen = _run(second, "print(2)")
        second.stop_channels()
    assert reply2["parent_header"]["msg_id"] == reply1["parent_header"]["msg_id"]  # the premise
    assert reply1["content"]["execution_count"] == 1
    assert reply2["content"]["status"] == "ok" and reply2["content"]["execution_count"] == 2
    kinds = [(m["msg_type"], m["content"].get("execution_state")) for m in seen]
    assert kinds[0] == ("status", "busy") and kinds[-1] == ("status", "idle")
    assert [m["content"]["text"] for m in seen if m["msg_type"] == "stream"] == ["2\n"]
    rows = sqlite3.connect(db).execute("SELECT code, execution_count, status FROM cells ORDER BY id").fetchall()
    assert rows == [("print(1)", 1, "ok"), ("print(2)", 2, "ok")]
    assert log.read_text().count("reuses the msg_id of an earlier, different execute") == 1


def _once(ran, word: str) -> dict:
    """An execute whose every run adds `word` to the file `ran`."""
    return {"code": f"open({str(ran)!r}, 'a').write({word!r} + '\\n')", "silent": False, "store_history": True,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}


def test_the_next_kernel_on_the_file_answers_a_resend_from_the_record_and_runs_a_reused_msg_id(tmp_path):
    """jupyter_client's restart: a new kernel process on the same connection file and database.
    The same frames sent to it are answered from the record; the same msg_id with other code runs."""
    db, ran = tmp_path / "log.sqlite3", tmp_path / "ran"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        with raw_socket(km, "shell") as (sock, session):
            msg = session.msg("execute_request", _once(ran, "one"))
            frames = session.serialize(msg)
            sock.send_multipart(frames)
            first = receive(sock, session)
            assert first["content"]["status"] == "ok"
            km.restart_kernel()
            kc.wait_for_ready(timeout=60)
            sock.send_multipart(frames)
            again = receive(sock, session, timeout=30)
            assert again["content"] == first["content"]
            reused = dict(msg, content=_once(ran, "two"))  # the same header: its msg_id and client session
            sock.send_multipart(session.serialize(reused))
            other = receive(sock, session, timeout=30)
        assert other["parent_header"]["msg_id"] == msg["header"]["msg_id"]
        assert other["content"]["status"] == "ok"
        assert ran.read_text() == "one\ntwo\n"
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["status"] == "ok"
    rows = sqlite3.connect(db).execute("SELECT code FROM cells WHERE msg_id = ? ORDER BY id",
                                       (msg["header"]["msg_id"],)).fetchall()
    assert [code for (code,) in rows] == [_once(ran, "one")["code"], _once(ran, "two")["code"]]


def test_a_database_of_the_first_schema_moves_forward_and_its_rows_match_no_resend(tmp_path):
    """A file written before `cells.msg_digest` existed keeps its rows; they say nothing of which
    message a cell was, so a msg_id they hold is taken for a reuse (it runs), never for a resend."""
    db = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions (id, uuid, host, pid, started) VALUES (1, 'u', 'h', 1, '2026-01-01')")
    conn.execute("INSERT INTO cells (session_id, msg_id, client_session, code, status, started, reply)"
                 " VALUES (1, 'm1', 'c', 'x = 1', 'ok', '2026-01-01', '{\"status\": \"ok\"}')")
    assert migrate(conn) == 1 and conn.execute("PRAGMA user_version").fetchone()[0] == VERSION
    assert conn.execute("SELECT code, msg_digest FROM cells").fetchall() == [("x = 1", None)]
    assert queries.recorded_execute(conn, "c", "m1", "abc").resent is False
    conn.execute("INSERT INTO cells (session_id, msg_id, client_session, msg_digest, code, status, started)"
                 " VALUES (1, 'm1', 'c', 'abc', 'x = 2', 'running', '2026-01-02')")
    conn.execute("INSERT INTO cells (session_id, msg_id, client_session, msg_digest, code, status, started)"
                 " VALUES (1, 'm1', 'c', 'def', 'x = 3', 'ok', '2026-01-03')")
    assert queries.recorded_execute(conn, "c", "m1", "abc") == queries.Taken(True, "running", None)
    assert queries.recorded_execute(conn, "c", "m1", "xyz") == queries.Taken(False, "ok", None)
    assert queries.recorded_execute(conn, "other", "m1", "abc") is None
