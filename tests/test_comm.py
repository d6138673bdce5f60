"""The `klbr` comm the JupyterLab extension talks to: answered by the proxy itself, at once, also while a
cell runs; cells found by the frontend's cell id, running ones followed line by line; bad requests get
named errors and change nothing else (docs/comm-protocol.md)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import datetime

import nbformat
from jupyter_client.session import Session

from klbr_kernel.proxy.brackets import Brackets
from klbr_kernel.requests.queue import ShellQueue
from klbr_kernel.requests.request import Request
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.store.queries import connect, export_notebook
from klbr_supervisor.store.schema import MIGRATIONS, migrate
from utils import drain, execute, standby, start_kernel, until

HALTING = ("import os, time\nfor i in range({n}):\n    if i == {n} // 2:\n        while not os.path.exists({go!r}):\n"
           "            time.sleep(0.01)\n    print(f'line {{i}}', flush=True)")


def run_cell(kc, code: str, cell_id: str | None) -> str:
    """An execute_request as JupyterLab sends it: `metadata.cellId` names the notebook cell."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id} if cell_id else {})
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def wait_for_stream(kc, msg_id: str) -> dict:
    """Until the cell `msg_id` has printed something (it runs); that message."""
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            return msg


def reply_to(kc, msg_id: str, timeout: float = 60) -> dict:
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def send(kc, msg_type: str, content: dict) -> str:
    msg = kc.session.msg(msg_type, content)
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def bracket(kc, msg_id: str, seen: list | None = None, timeout: float = 30) -> list[dict]:
    """The iopub messages of one comm message, busy to idle: exactly one of each (semantics 1).
    `seen` collects the other messages read meanwhile (pushes of followed cells)."""
    got: list[dict] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            if seen is not None:
                seen.append(msg)
            continue
        got.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    states = [m["content"]["execution_state"] for m in got if m["msg_type"] == "status"]
    assert states == ["busy", "idle"] and got[0]["msg_type"] == "status", [m["msg_type"] for m in got]
    return got


def data(msgs: list[dict], comm_id: str) -> list[dict]:
    return [m["content"]["data"] for m in msgs if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id]


class Comm:
    """The extension's side of one klbr comm, over a test client."""

    def __init__(self, kc, comm_id: str | None = None):
        self.kc = kc
        self.comm_id = comm_id or uuid.uuid4().hex
        self.seen: list[dict] = []  # pushes read while waiting for something else
        opened = bracket(kc, send(kc, "comm_open", {"comm_id": self.comm_id, "target_name": "klbr", "data": {"v": 1}}))
        # A worker would close it at once (ipykernel has no `klbr` target): the proxy keeps it.
        assert [m["msg_type"] for m in opened] == ["status", "status"]

    def ask(self, payload: dict, timeout: float = 30) -> list[dict]:
        msg_id = send(self.kc, "comm_msg", {"comm_id": self.comm_id, "data": payload})
        return data(bracket(self.kc, msg_id, self.seen, timeout), self.comm_id)

    def request(self, op: str, **fields) -> list[dict]:
        return self.ask({"v": 1, "id": f"r-{op}", "op": op, **fields})

    def pushes_until(self, done, timeout: float = 60) -> list[dict]:
        """This comm's messages (those read already, then new ones) until `done(data)` is true for one."""
        pushes = data(self.seen, self.comm_id)
        self.seen.clear()
        while not any(done(d) for d in pushes):
            msg = self.kc.get_iopub_msg(timeout=timeout)
            pushes += data([msg], self.comm_id)
        return pushes


def _assembled(answer: list[dict]) -> dict[int, dict]:
    """The cells of a `cells` answer by record id, their parts' outputs joined in order."""
    cells: dict[int, dict] = {}
    assert [d["chunk"] for d in answer] == list(range(len(answer))) and answer[-1]["last"]
    for d in answer:
        for part in d["cells"]:
            cell = cells.setdefault(part["record_id"], {**part, "outputs": [], "parts": []})
            cell["parts"].append(part["part"])
            cell["outputs"] += part["outputs"]
            cell["complete"] = part["complete"]
    return cells


def _text(outputs: list[dict]) -> str:
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream")


def test_cells_are_recorded_with_their_frontend_ids_and_exported_with_them(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        for code, cell_id in [("print('a')", "cell-a"), ("print('b1')", "cell-b"), ("print('b2')", "cell-b"),
                              ("print('no id')", None)]:
            assert reply_to(kc, run_cell(kc, code, cell_id))["content"]["status"] == "ok"
    rows = sqlite3.connect(db).execute("SELECT id, frontend_cell_id FROM cells ORDER BY id").fetchall()
    assert [r[1] for r in rows] == ["cell-a", "cell-b", "cell-b", None]
    out = tmp_path / "export.ipynb"
    subprocess.run([sys.executable, "-m", "klbr_kernel", "export", "1", "-o", str(out)], check=True,
                   env={**os.environ, "KLBR_DB": str(db)}, capture_output=True)
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    # The last run of a cell carries its id; an earlier run of it, and a cell with none, ids of their own.
    assert [c.id for c in nb.cells] == ["cell-a", f"klbr-{rows[1][0]}", "cell-b", f"klbr-{rows[3][0]}"]
    assert nb.cells[1].metadata.klbr.frontend_cell_id == "cell-b" and nb.cells[2].outputs[0].text == "b2\n"


def test_a_page_gets_its_cells_while_one_runs_then_follows_it_and_the_queued_one(tmp_path):
    """The running cell's lines come once each, in order: those printed before the request in the
    answer, the rest pushed after it; the cell queued behind it is followed from its first line."""
    go = tmp_path / "go"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        assert reply_to(kc, run_cell(kc, "print('done before'); 6 * 7", "cell-1"))["content"]["status"] == "ok"
        running = run_cell(kc, HALTING.format(n=40, go=str(go)), "cell-2")
        queued = run_cell(kc, "print('queued ran')", "cell-3")
        m = wait_for_stream(kc, running)  # it runs, and waits for `go` half-way
        comm = Comm(kc)
        (hello,) = comm.request("hello")
        assert hello["op"] == "hello" and hello["id"] == "r-hello" and hello["implementation"] == "klbr"
        assert hello["generation"] == 1 and hello["recording"] == "recording" and hello["protocol"] == 1
        assert hello["kernel_session"] == m["header"]["session"]  # the proxy's one session id
        assert dict(hello["status"])["generation"] == "1"
        answer = comm.request("cells", cell_ids=["cell-1", "cell-2", "cell-3", "never-ran"], follow=True)
        cells = _assembled(answer)
        by_cell = {c["cell_id"]: c for c in cells.values()}
        assert set(by_cell) == {"cell-1", "cell-2"}  # the queued cell has no record yet
        first, second = by_cell["cell-1"], by_cell["cell-2"]
        assert not first["running"] and first["status"] == "ok" and first["execution_count"] == 1
        assert _text(first["outputs"]) == "done before\n"
        assert first["outputs"][-1]["data"]["text/plain"] == "42"
        assert second["running"] and second["status"] == "running" and second["execution_count"] == 2
        assert second["code"].startswith("import os, time")
        assert answer[-1]["queued"] == [{"cell_id": "cell-3", "msg_id": queued, "code": "print('queued ran')"}]
        assert sorted(answer[-1]["following"]) == sorted([running, queued])
        before = _text(second["outputs"])
        go.touch()
        pushes = comm.pushes_until(lambda d: d.get("op") == "ended" and d["msg_id"] == queued)
        mine = [d for d in pushes if d.get("msg_id") == running]
        assert mine[-1]["op"] == "ended" and mine[-1]["status"] == "ok" and mine[-1]["execution_count"] == 2
        after = "".join(d["content"]["text"] for d in mine if d["op"] == "output" and d["msg_type"] == "stream")
        assert (before + after).splitlines() == [f"line {i}" for i in range(40)]
        assert before and after  # some came with the answer, some after it
        theirs = [d for d in pushes if d.get("msg_id") == queued]
        assert [d["op"] for d in theirs] == ["output", "ended"] and theirs[0]["content"]["text"] == "queued ran\n"
        assert theirs[-1]["execution_count"] == 3 and theirs[-1]["record_id"] is not None
        assert reply_to(kc, running)["content"]["status"] == "ok"
        # Afterwards the page asks again: everything is recorded, nothing runs.
        cells = _assembled(comm.request("cells", cell_ids=["cell-2", "cell-3"]))
        assert {c["cell_id"]: c["running"] for c in cells.values()} == {"cell-2": False, "cell-3": False}
        assert reply_to(kc, queued)["content"]["execution_count"] == 3
        assert execute(kc, "1")[0]["content"]["execution_count"] == 4


def test_cells_come_in_chunks_bounded_in_bytes_and_unmatched_cells_are_listed(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        printing = "import sys\nfor i in range(300):\n    sys.stdout.write(f'{i:05d}' * 2000 + '\\n')"
        assert reply_to(kc, run_cell(kc, printing, "big"))["content"]["status"] == "ok"
        assert reply_to(kc, run_cell(kc, "print('elsewhere')", "gone-cell"))["content"]["status"] == "ok"
        comm = Comm(kc)
        answer = comm.request("cells", cell_ids=["big"], max_chunk_bytes=65536)
        assert len(answer) > 40
        assert all(len(json.dumps(d, ensure_ascii=False).encode()) < 65536 + 4096 for d in answer)
        (big,) = _assembled(answer).values()
        assert big["complete"] and big["parts"] == list(range(len(big["parts"])))
        assert _text(big["outputs"]) == "".join(f"{i:05d}" * 2000 + "\n" for i in range(300))
        (missing,) = answer[-1]["unmatched"]
        assert missing["cell_id"] == "gone-cell" and missing["first_line"] == "print('elsewhere')"
        # A record the page names by its store id (the notice's `%klbr replay N`) comes too.
        (cell,) = _assembled(comm.request("cells", record_ids=[missing["record_id"]])).values()
        assert _text(cell["outputs"]) == "elsewhere\n"


def test_previous_sessions_of_the_same_notebook_on_request(tmp_path):
    env = {"KLBR_DB": str(tmp_path / "log.sqlite3"), "JPY_SESSION_NAME": str(tmp_path / "analysis.ipynb")}
    with start_kernel(env=env) as (km, kc):
        assert reply_to(kc, run_cell(kc, "print('from the first kernel')", "kept"))["content"]["status"] == "ok"
    with start_kernel(env=env) as (km, kc):
        comm = Comm(kc)
        answer = comm.request("cells", cell_ids=["kept"])
        assert answer[-1]["cells"] == [] and answer[-1]["session"] == 2
        (cell,) = _assembled(comm.request("cells", cell_ids=["kept"], previous_sessions=True)).values()
        assert cell["session"] == 1 and _text(cell["outputs"]) == "from the first kernel\n"


def test_the_generation_is_pushed_when_it_changes_and_restart_is_an_op(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        comm = Comm(kc)
        (hello,) = comm.request("hello")
        assert hello["generation"] == 1
        execute(kc, "%klbr restart", seen=comm.seen)
        pushes = comm.pushes_until(lambda d: d.get("op") == "state" and d["generation"] == 2)
        assert pushes[-1]["placement"] == "local" and pushes[-1]["recording"] == "recording"
        (answer,) = [d for d in comm.request("restart") if d.get("id") == "r-restart"]
        assert answer["op"] == "restart" and answer["generation"] == 3 and "takes over" in answer["text"]
        assert execute(kc, "'fresh'")[0]["content"]["status"] == "ok"


def test_the_workers_memory_is_in_the_state_and_pushed_when_it_grows(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        comm = Comm(kc)
        assert execute(kc, "1", seen=comm.seen)[0]["content"]["status"] == "ok"  # its worker serves: sampled
        (hello,) = comm.request("hello")
        memory = hello["memory"]
        assert 10 << 20 < memory["rss"] <= memory["peak"] < 1 << 30 and memory["limit"] is None
        assert execute(kc, "x = b'1' * (300 << 20)", seen=comm.seen)[0]["content"]["status"] == "ok"
        pushes = comm.pushes_until(lambda d: d.get("op") == "state" and d["memory"]["rss"] > memory["rss"] + (250 << 20))
        assert pushes[-1]["generation"] == 1 and pushes[-1]["memory"]["peak"] >= pushes[-1]["memory"]["rss"]


def test_every_generation_has_its_peak_memory_and_hello_says_the_facts_in_data(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        comm = Comm(kc)
        assert execute(kc, "x = b'1' * (200 << 20)", seen=comm.seen)[0]["content"]["status"] == "ok"
        (answer,) = comm.request("generations")
        (serving,) = answer["generations"]
        # The serving generation's peak is sampled, not left for its end (the dialog showed none).
        assert serving["ended"] is None and serving["memory_peak"] > 200 << 20 and serving["cells"] == 1
        (hello,) = comm.request("hello")
        facts = hello["facts"]
        assert facts["cell_log"] == str(tmp_path / "log.sqlite3") and facts["cell_log_problem"] is None
        assert facts["since"].endswith("Z") and facts["host"] and facts["state"] == "ready"
        assert (facts["restarts"], facts["restart_limit"], facts["restart_window"]) == (0, 5, 300)
        assert facts["cell_timeout"] is None and facts["interrupt_grace"] > 0 and facts["memory_limit_next"] is None
        until(lambda: standby(kc, comm.seen) == "ready", 60, "the spare is ready")  # launched before the kill
        killed = time.time()
        assert execute(kc, "import os; os.kill(os.getpid(), 9)", seen=comm.seen)[0]["content"]["status"] == "error"
        assert execute(kc, "'after'", seen=comm.seen)[0]["content"]["status"] == "ok"
        (answer,) = comm.request("generations")
        first, second = answer["generations"]
        assert first["end_reason"].startswith("lost: ") and first["memory_peak"] > 200 << 20
        assert second["ended"] is None and 0 < second["memory_peak"] < 200 << 20
        (hello,) = comm.request("hello")
        assert hello["facts"]["restarts"] == 1
        # The spare, started long before, serves since it took over: "since" is then, not its launch.
        since = datetime.fromisoformat(hello["facts"]["since"].replace("Z", "+00:00")).timestamp()
        assert since >= killed, (hello["facts"]["since"], killed)


def test_bad_comm_messages_get_named_errors_and_nothing_else_changes(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        assert execute(kc, "x = 1")[0]["content"]["execution_count"] == 1
        # A version this kernel does not speak: an error on that comm, and the kernel closes it.
        msgs = bracket(kc, send(kc, "comm_open", {"comm_id": "v2", "target_name": "klbr", "data": {"v": 2}}))
        assert data(msgs, "v2")[0]["error"]["name"] == "UnsupportedVersion"
        assert any(m["msg_type"] == "comm_close" and m["content"]["comm_id"] == "v2" for m in msgs)
        # A comm id no one can be answered on: dropped, inside its bracket.
        assert data(bracket(kc, send(kc, "comm_open", {"comm_id": "c" * 100_000, "target_name": "klbr",
                                                       "data": {"v": 1}})), "c" * 100_000) == []
        comm = Comm(kc)
        bad = [
            ({"id": "a", "op": "hello"}, "UnsupportedVersion", "a"),
            ({"v": 2, "id": "b", "op": "hello"}, "UnsupportedVersion", "b"),
            ({"v": "1", "id": "c", "op": "hello"}, "UnsupportedVersion", "c"),
            ({"v": True, "id": "c2", "op": "hello"}, "UnsupportedVersion", "c2"),
            ({"v": "9" * 100_000, "id": "c3", "op": "hello"}, "UnsupportedVersion", "c3"),
            ({"v": 1, "op": "hello"}, "MalformedRequest", None),
            ({"v": 1, "id": ["x"], "op": "hello"}, "MalformedRequest", None),
            ({"v": 1, "id": "i" * 1_000_000, "op": "hello"}, "TooLarge", None),
            ({"v": 1, "id": 2**60, "op": "hello"}, "TooLarge", None),
            ({"v": 1, "id": "d", "op": "rm -rf"}, "UnknownOp", "d"),
            ({"v": 1, "id": "e", "op": {"nested": [1]}}, "UnknownOp", "e"),
            ({"v": 1, "id": "f", "op": "o" * 100_000}, "UnknownOp", "f"),
            ({"v": 1, "id": "g", "op": "cells", "cell_ids": "all"}, "MalformedRequest", "g"),
            ({"v": 1, "id": "h", "op": "cells", "cell_ids": ["../../etc"]}, "MalformedRequest", "h"),
            ({"v": 1, "id": "j", "op": "cells", "cell_ids": ["x" * 65]}, "MalformedRequest", "j"),
            ({"v": 1, "id": "k", "op": "cells", "cell_ids": [str(i) for i in range(100_001)]}, "TooLarge", "k"),
            ({"v": 1, "id": "l", "op": "cells", "record_ids": ["1"]}, "MalformedRequest", "l"),
            ({"v": 1, "id": "m", "op": "cells", "follow": "yes"}, "MalformedRequest", "m"),
            ({"v": 1, "id": "n", "op": "cells", "max_chunk_bytes": 1.5}, "MalformedRequest", "n"),
            ({"v": 1, "id": "o", "op": "unfollow"}, "MalformedRequest", "o"),
        ]
        for payload, name, request_id in bad:
            (answer,) = comm.ask(payload)
            assert answer["error"]["name"] == name and answer["id"] == request_id, (payload.get("op"), answer)
            assert len(json.dumps(answer)) < 1000  # nothing hostile is echoed back
        # The comm, the cell log and the worker's namespace are as they were.
        (hello,) = comm.request("hello")
        assert hello["generation"] == 1
        reply, _ = execute(kc, "x + 1")
        assert reply["content"]["status"] == "ok" and reply["content"]["execution_count"] == 2


def test_a_closed_comm_stops_following_and_other_clients_see_nothing_of_it(tmp_path):
    """Pushes go to the comm that asked; closing it ends its following; a second client's comm is its own."""
    go = tmp_path / "go"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        running = run_cell(kc, HALTING.format(n=10, go=str(go)), "slow")
        wait_for_stream(kc, running)
        info = km.get_connection_info()
        other = km.client(session=Session(key=info["key"], signature_scheme=info["signature_scheme"]))
        other.start_channels()
        try:
            other.wait_for_ready(timeout=30)
            watching, closing = Comm(other), Comm(kc)
            assert _assembled(watching.request("cells", cell_ids=["slow"], follow=True))
            assert _assembled(closing.request("cells", cell_ids=["slow"], follow=True))
            bracket(kc, send(kc, "comm_close", {"comm_id": closing.comm_id, "data": {}}), closing.seen)
            go.touch()
            pushes = watching.pushes_until(lambda d: d.get("op") == "ended")
            assert "".join(d["content"]["text"] for d in pushes if d.get("op") == "output").count("line") == 5
            assert reply_to(kc, running)["content"]["status"] == "ok"
            late = closing.seen + drain(kc.iopub_channel)
            assert data(late, closing.comm_id) == []
        finally:
            other.stop_channels()


def test_a_log_written_before_the_column_is_migrated_and_still_exports(tmp_path):
    db = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in MIGRATIONS[0]:  # the schema as the kernel before this column wrote it
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions (id, uuid, host, pid, started) VALUES (1, 'u', 'h', 1, '2026-01-01')")
    conn.execute("INSERT INTO cells (session_id, msg_id, execution_count, code, status, started)"
                 " VALUES (1, 'm', 1, 'x = 1', 'ok', '2026-01-01')")
    assert migrate(conn) == 1
    assert conn.execute("SELECT frontend_cell_id FROM cells").fetchall() == [(None,)]
    nb = nbformat.from_dict(export_notebook(connect(str(db)), 1))
    nbformat.validate(nb)
    assert [c.id for c in nb.cells] == ["klbr-1"]


def _statuses(kc, until_idle_of: str, timeout: float = 60) -> list[tuple[str | None, str]]:
    """Every status on iopub, as (its parent's msg_id, or None for no parent; the state), up to and
    including the idle of `until_idle_of`."""
    got: list[tuple[str | None, str]] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["msg_type"] != "status":
            continue
        got.append((msg["parent_header"].get("msg_id"), msg["content"]["execution_state"]))
        if got[-1] == (until_idle_of, "idle"):
            return got


def test_a_page_that_connects_while_a_cell_runs_sees_the_kernel_busy_until_the_cell_ends(tmp_path):
    """A frontend shows the last status it had (JupyterLab's kernel indicator, jupyter_server's
    execution_state). A page reloaded mid-cell asks kernel_info and opens the klbr comm, both answered
    at once: after each one's idle the kernel is busy again (a status with no parent, so no request
    gets a second bracket), until the running cell's own idle. With nothing running, no such status."""
    go = tmp_path / "go"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        running = run_cell(kc, HALTING.format(n=4, go=str(go)), "cell-1")
        wait_for_stream(kc, running)
        info = send(kc, "kernel_info_request", {})
        assert _statuses(kc, info) == [(info, "busy"), (info, "idle")]
        opened = send(kc, "comm_open", {"comm_id": uuid.uuid4().hex, "target_name": "klbr", "data": {"v": 1}})
        after_info = _statuses(kc, opened)
        assert after_info == [(None, "busy"), (opened, "busy"), (opened, "idle")], after_info
        go.touch()
        assert _statuses(kc, running) == [(None, "busy"), (running, "idle")]
        assert reply_to(kc, running)["content"]["status"] == "ok"
        # Nothing runs now: kernel_info's bracket alone, and the next cell's, with nothing between.
        info = send(kc, "kernel_info_request", {})
        after = run_cell(kc, "1", "cell-2")
        assert _statuses(kc, after) == [(info, "busy"), (info, "idle"), (after, "busy"), (after, "idle")]


class _Statuses:
    """Where `Brackets` sends statuses: kept as (the parent's msg_id or None, the state)."""

    def __init__(self):
        self.outbox = None
        self.sent: list[tuple[str | None, str]] = []

    def status(self, state: str, parent: dict) -> None:
        self.sent.append((parent.get("msg_id"), state))


def test_only_a_cell_in_flight_makes_the_kernel_busy_again_after_an_answer():
    """The status with no parent follows an answer only while a cell is in flight: JupyterLab and
    jupyter_server pass over the idle of a comm_info_request (their `untracked_message_types`), so a
    busy after an answer given while one ran was the last status they read, for good (a Notebook 7
    page that opened showed the kernel busy with nothing running)."""
    def request(msg_type: str, msg_id: str) -> Request:
        return Request("shell", Wire([], [], {"msg_type": msg_type, "msg_id": msg_id}, {}), {"code": "1"})

    for in_flight, after in (("execute_request", [("own", "idle"), (None, "busy")]), ("comm_info_request", [("own", "idle")])):
        frontend, queue = _Statuses(), ShellQueue()
        brackets = Brackets(frontend, Session(), None, queue)
        running = request(in_flight, "running")
        queue.push(running)
        assert queue.take() is running
        brackets.busy(running)
        own = request("comm_msg", "own")
        brackets.busy(own)
        frontend.sent.clear()
        brackets.idle(own)
        assert frontend.sent == after, in_flight
        brackets.idle(running)
        assert frontend.sent[-1] == ("running", "idle")
        brackets.idle(request("kernel_info_request", "later"))  # the cell's idle is out: nothing follows
        assert frontend.sent[-1] == ("later", "idle")
