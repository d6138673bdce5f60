"""Only the same message sent again is a resend (semantics 9): a msg_id alone identifies
nothing, since every `KernelManager.client()` gets a `Session.clone()` whose message counter starts
again, so a second client reuses the first one's msg_ids with other code. Such a cell runs."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import uuid

import pytest
from jupyter_client.session import Session

from klbr_kernel.cell_log.recording import CellLog
from klbr_kernel.frontend import door
from klbr_kernel.proxy import resends
from klbr_kernel.proxy.brackets import Brackets
from klbr_kernel.requests.queue import ShellQueue
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.store import Store, queries
from klbr_supervisor.store.recovery import recover_orphans
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


# -- the rule on a real log, without a kernel: which executes read the log ---------------------------
# `Brackets` (its `Resends`) and `CellLog` over a `Store` on a file, fed real requests (jupyter_client's frames, cut
# and admitted as the `Frontend` does); the replies the proxy would send are collected.

class _Frontend:
    """Where `Brackets` sends the answers to resends: kept as (msg_id, content)."""

    def __init__(self):
        self.sent = []

    def reply(self, channel, idents, msg_type, content, parent, metadata=None):
        self.sent.append((parent["msg_id"], content))
        return True


class _Kernel:
    """The proxy's side of semantics 9 on one `Store`: what `Dispatch` and `Delivery` call for an
    execute, each cell run at once with the reply `{"status": "ok", "execution_count": n}`."""

    def __init__(self, path):
        self.store = Store(path=str(path))
        assert self.store.open(uuid=str(uuid.uuid4()), notebook=None, kernel=None)
        self.cell_log = CellLog(self.store)
        self.frontend = _Frontend()
        self.brackets = Brackets(self.frontend, Session(), self.cell_log, ShellQueue())
        self.reads = []  # statements on the read connection
        self.store.reader().set_trace_callback(self.reads.append)
        self.count = 0

    def send(self, frames) -> bool:
        """True: answered as a resend; else the cell ran (recorded, replied)."""
        req = door.admit("shell", Wire.parse(frames), signed=True)
        if self.brackets.resends.duplicate(req):
            return True
        self.count += 1
        assert self.cell_log.start(req, 1, _failed)
        content = {"status": "ok", "execution_count": self.count}
        self.brackets.decided(req, content)
        assert self.cell_log.finish(req, content, _failed)
        self.brackets.replied(req)
        return False


def _failed(error):
    raise AssertionError(f"a write was not committed at once: {error}")


def _frames(session: Session, code: str, msg_id: str | None = None) -> list[bytes]:
    msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                          "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    if msg_id is not None:
        msg["header"]["msg_id"] = msg_id  # what a clone's restarted counter does
    return session.serialize(msg)


@pytest.fixture
def log_path(tmp_path, monkeypatch):
    monkeypatch.delenv("KLBR_DB", raising=False)  # the run's database would override the path
    return tmp_path / "log.sqlite3"


def test_a_client_new_to_the_log_costs_one_read_and_its_resends_are_still_answered(log_path):
    """The log is read once per client session (the msg_ids it has there), not once per execute;
    a resend, of a cell running or finished, is answered from what the kernel took."""
    async def main():
        kernel, client = _Kernel(log_path), Session(key=b"k")
        sent = [_frames(client, f"x = {i}") for i in range(20)]
        assert [kernel.send(frames) for frames in sent] == [False] * 20
        assert len(kernel.reads) == 1, kernel.reads
        assert kernel.send(sent[3]) is True
        assert kernel.frontend.sent == [(Wire.parse(sent[3]).msg_id, {"status": "ok", "execution_count": 4})]
        assert len(kernel.reads) == 1
        kernel.store.close()
    asyncio.run(main())


def test_the_next_kernel_on_the_log_reads_what_a_client_sent_before_and_only_that(log_path):
    """A restart: the next kernel reads once what the client has in the log; a resend of any of it
    is answered from the record, a msg_id it had with other bytes runs, a msg_id it never had
    runs with no read. Another client, new to the log, costs one read."""
    async def main():
        client = Session(key=b"k")
        first = _Kernel(log_path)
        sent = [_frames(client, f"x = {i}") for i in range(3)]
        assert [first.send(frames) for frames in sent] == [False] * 3
        first.store.close()

        second = _Kernel(log_path)
        assert second.send(_frames(client, "y = 1")) is False  # the first sight: one read
        assert len(second.reads) == 1
        assert second.send(sent[1]) is True  # a resend of what the first kernel took
        assert second.frontend.sent == [(Wire.parse(sent[1]).msg_id, {"status": "ok", "execution_count": 2})]
        assert second.send(_frames(client, "x = 'other'", msg_id=Wire.parse(sent[0]).msg_id)) is False  # reused
        assert len(second.reads) == 3  # each looked up: its msg_id is in the log
        assert second.send(_frames(client, "y = 2")) is False
        assert len(second.reads) == 3
        other = Session(key=b"k")
        assert [second.send(_frames(other, f"z = {i}")) for i in range(3)] == [False] * 3
        assert len(second.reads) == 4
        second.store.close()
    asyncio.run(main())


def test_a_resend_after_its_msg_id_was_reused_is_answered_from_the_record(log_path):
    """The kernel remembers the newest execute of a msg_id; one sent before it, sent again, is
    found in the log by its digest."""
    async def main():
        kernel, client = _Kernel(log_path), Session(key=b"k")
        original = _frames(client, "x = 1")
        msg_id = Wire.parse(original).msg_id
        assert kernel.send(original) is False
        assert kernel.send(_frames(client, "x = 2", msg_id=msg_id)) is False
        assert kernel.send(original) is True
        assert kernel.frontend.sent == [(msg_id, {"status": "ok", "execution_count": 1})]
        kernel.store.close()
    asyncio.run(main())


@pytest.mark.parametrize("logged", [10_000, 2], ids=["kept", "past-the-bound"])
def test_an_execute_the_kernel_forgot_is_still_answered_from_the_record(log_path, monkeypatch, logged):
    """Past what `Resends` remembers, an execute's msg_id joins its client's msg_ids in the log, so
    a resend of it is looked up; past what those may hold, every execute of the client is."""
    monkeypatch.setattr(resends, "_REMEMBERED", 3)
    monkeypatch.setattr(resends, "_LOGGED", logged)

    async def main():
        kernel, client = _Kernel(log_path), Session(key=b"k")
        sent = [_frames(client, f"x = {i}") for i in range(8)]
        assert [kernel.send(frames) for frames in sent] == [False] * 8
        reads = len(kernel.reads)
        # Forgotten: x = 0 to 4. Past the bound, the third forgotten (after x = 5 was taken) leaves
        # the client with no msg_ids kept, and x = 6 and 7 were looked up.
        assert reads == (1 if logged > 5 else 1 + 2)
        assert [kernel.send(sent[i]) for i in (0, 4)] == [True, True]
        assert kernel.frontend.sent == [(Wire.parse(sent[i]).msg_id, {"status": "ok", "execution_count": i + 1})
                                        for i in (0, 4)]
        assert len(kernel.reads) == reads + 2
        kernel.store.close()
    asyncio.run(main())


def test_the_logs_reads_for_resends_and_recovery_are_index_searches(tmp_path):
    """What semantics 9 reads of the log (a client's msg_ids, one execute) and what recovery reads
    (a dead session's running cells) are each a search of an index, never a scan of `cells`."""
    conn = sqlite3.connect(tmp_path / "log.sqlite3", isolation_level=None)
    migrate(conn)
    conn.execute("INSERT INTO sessions (uuid, host, pid, started) VALUES ('u', ?, 1, 'then')", (socket.gethostname(),))
    statements = []
    conn.set_trace_callback(statements.append)
    queries.logged_msg_ids(conn, "client", 10)
    queries.recorded_execute(conn, "client", "m1", "digest")
    recover_orphans(conn, socket.gethostname(), "now")  # pid 1 is no klbr kernel: its session is dead
    conn.set_trace_callback(None)
    reads = [s for s in statements if s.startswith("SELECT") and "FROM cells" in s]
    assert len(reads) == 3, statements
    for read in reads:
        plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {read}"))
        assert "SEARCH cells USING " in plan and "SCAN cells" not in plan, (read, plan)
