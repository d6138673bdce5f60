"""Outputs come back: `%klbr replay` shows a cell's recorded outputs again, and outputs that reached no
frontend are noticed by the next cell."""

from __future__ import annotations

import json
import sqlite3
import time

from jupyter_client.session import Session

from utils import collect, execute, raw_socket, receive, results, start_kernel, stream_text

PRINTING = "import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep({pause})"
# Prints half its lines, waits for the file `go`, prints the rest: it runs for as long as a test needs.
HALTING = ("import os, time\nfor i in range({n}):\n    if i == {n} // 2:\n        while not os.path.exists({go!r}):\n"
           "            time.sleep(0.01)\n    print(f'line {{i}}', flush=True)")


def _lines(outputs) -> list[str]:
    return [line for line in stream_text(outputs, "stdout").splitlines() if line.startswith("line ")]


def _notices(outputs) -> list[str]:
    """The texts of the notices among a request's iopub messages (a display of klbr's own, with a
    display id, so that a later update can take its words back)."""
    return [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "display_data"
            and m["content"].get("metadata", {}).get("klbr", {}).get("notice") == "unseen"]


def _cleared(outputs) -> list[str]:
    """The display ids of the notices a request's iopub messages empty."""
    return [m["content"]["transient"]["display_id"] for m in outputs if m["msg_type"] == "update_display_data"
            and m["content"]["data"] == {"text/plain": ""}]


def _other_client(km):
    """A second frontend, with a session of its own (as two notebooks, or two pages, have)."""
    info = km.get_connection_info()
    kc = km.client(session=Session(key=info["key"], signature_scheme=info["signature_scheme"]))
    kc.start_channels()
    kc.wait_for_ready(timeout=30)
    return kc


def test_a_replay_shows_a_cell_as_it_rendered_and_is_not_recorded_twice(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        execute(kc, "print('hello'); 6 * 7")
        execute(kc, "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))\n"
                    "h = display('v1', display_id=True); h.update('v2')\nraise ValueError('boom')")
        reply, outputs = execute(kc, "%klbr replay")  # the latest cell with outputs
        assert reply["content"]["status"] == "ok"
        header = stream_text(outputs).splitlines()[0]
        assert header.startswith("klbr replay: cell 2 (In [2] of session 1, generation 1)") and "ended error" in header
        shown = [(m["msg_type"], m["content"]) for m in outputs if m["msg_type"] in ("display_data", "error")]
        assert [kind for kind, _ in shown] == ["display_data", "display_data", "error"]
        assert shown[0][1]["data"]["text/html"] == "<b>bold</b>"
        assert shown[1][1]["data"]["text/plain"] == "'v2'"  # the update, as the notebook showed it last
        assert shown[2][1]["ename"] == "ValueError" and shown[2][1]["evalue"] == "boom"
        for spec in ("1", "In[1]"):
            _, outputs = execute(kc, f"%klbr replay {spec}")
            assert stream_text(outputs).splitlines()[1:] == ["hello", "Out[1]:"]
            assert results(outputs) == [] and outputs[-2]["content"]["data"]["text/plain"] == "42"
        _, outputs = execute(kc, "%klbr history")
        listing = stream_text(outputs)
        assert "cell 1  ok  2 outputs  print('hello'); 6 * 7" in listing
        assert "cell 3  ok  1 output  %klbr replay" in listing
    conn = sqlite3.connect(db)
    replays = conn.execute("SELECT id FROM cells WHERE code LIKE '%klbr replay%'").fetchall()
    for (cell_id,) in replays:  # a replay's row keeps its header line, not a second copy of the outputs
        assert conn.execute("SELECT count(*) FROM outputs WHERE cell_id = ?", (cell_id,)).fetchone()[0] == 1


def test_bad_replays_are_usage_errors(kernel):
    km, kc = kernel
    reply, _ = execute(kc, "%klbr replay")
    assert reply["content"]["ename"] == "UsageError" and "no cell of this notebook has outputs" in reply["content"]["evalue"]
    for spec, says in [("9999", "no cell 9999"), ("In[99]", "no In[99]"), ("first", "usage"), ("1 2", "usage")]:
        reply, _ = execute(kc, f"%klbr replay {spec}")
        assert reply["content"]["ename"] == "UsageError" and says in reply["content"]["evalue"], reply["content"]
    reply, _ = execute(kc, "1 + 1")
    assert reply["content"]["status"] == "ok"


def test_a_replay_of_a_running_cell_follows_it_to_its_end(tmp_path):
    """A second frontend asks while the cell runs: what it printed so far, then the rest as it comes,
    each line once and in order; the replay is answered at once, not queued behind the cell."""
    go = tmp_path / "go"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        running = kc.execute(HALTING.format(n=30, go=str(go)))
        while (m := kc.get_iopub_msg(timeout=60))["msg_type"] != "stream":
            pass  # it runs
        other = _other_client(km)
        try:
            msg_id = other.execute("%klbr replay --follow")
            header = ""
            while not header.startswith("klbr replay:"):  # the replay has begun: let the cell go on
                m = other.get_iopub_msg(timeout=30)
                if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                    header = m["content"]["text"]
            assert "still running: its outputs so far, then the rest as they come" in header
            go.touch()
            reply, outputs = collect(other, msg_id, timeout=60)
            assert reply["content"]["status"] == "ok"
            assert _lines(outputs) == [f"line {i}" for i in range(30)]
            assert stream_text(outputs).endswith("klbr replay: cell 1 ended ok.\n")
        finally:
            other.stop_channels()
        reply, _ = collect(kc, running)
        assert reply["content"]["status"] == "ok"
        reply, _ = execute(kc, "'after'")
        assert reply["content"]["execution_count"] == 3  # In[1] the cell, In[2] the replay


def test_outputs_published_while_no_frontend_listened_are_noticed_once(tmp_path):
    """A client's iopub disconnects mid-cell and comes back: the next cell says how many outputs of
    which cell went to no one, and the `%klbr replay` line that brings them back shows all of them."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        kc.stop_channels()  # the test's own sockets below are the only frontend
        _noticed_once(km)


def _welcomed(iopub, session) -> None:
    """Wait for a new subscriber's iopub_welcome; what came before it (the previous cell's idle,
    which travels apart from its reply) is not this test's business."""
    while receive(iopub, session)["msg_type"] != "iopub_welcome":
        pass


def _noticed_once(km) -> None:
    with raw_socket(km, "shell") as (shell, session):
        with raw_socket(km, "iopub") as (iopub, _):
            _welcomed(iopub, session)
            cell = session.send(shell, "execute_request", {"code": PRINTING.format(n=20, pause=0.05), "silent": False})
            while receive(iopub, session)["msg_type"] != "stream":
                pass  # it prints, and the subscriber goes
        reply = receive(shell, session, timeout=30)
        assert reply["parent_header"]["msg_id"] == cell["header"]["msg_id"], reply
        with raw_socket(km, "iopub") as (iopub, _):
            _welcomed(iopub, session)
            seen = []
            for code in ("'next'", "'and the one after'"):
                msg = session.send(shell, "execute_request", {"code": code, "silent": False})
                receive(shell, session)
                while True:
                    m = receive(iopub, session)
                    seen.append(m)
                    if m["parent_header"].get("msg_id") == msg["header"]["msg_id"] and m["msg_type"] == "status" \
                            and m["content"]["execution_state"] == "idle":
                        break
    notices = _notices(seen)
    assert len(notices) == 1, notices  # once
    assert "outputs of cell [1] were published while no frontend was connected" in notices[0], notices
    assert "`%klbr replay 1` brings them back" in notices[0], notices
    other = _other_client(km)
    try:
        _, outputs = execute(other, "%klbr replay 1")
        assert _lines(outputs) == [f"line {i}" for i in range(20)]
        # Acted on: the notice no longer holds, and its words leave every notebook that shows it.
        assert _cleared(outputs) == ["klbr-unseen-1"] and _notices(outputs) == []
    finally:
        other.stop_channels()


def test_a_cell_that_outlives_its_frontend_is_noticed_by_the_next_one(tmp_path):
    """The frontend that ran a cell leaves (a closed tab) and another connects: when the cell ends,
    its reply finds no one, and the next cell's output starts by saying so."""
    go = tmp_path / "go"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        running = kc.execute(HALTING.format(n=20, go=str(go)))
        while (m := kc.get_iopub_msg(timeout=60))["msg_type"] != "stream":
            pass
        kc.stop_channels()
        other = _other_client(km)
        go.touch()
        try:
            while not ((m := other.get_iopub_msg(timeout=30))["parent_header"].get("msg_id") == running
                       and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"):
                pass  # the cell has ended
            _, outputs = execute(other, "'next'")
            (notice,) = _notices(outputs)
            assert stream_text(outputs, "stderr") == ""  # a display of its own, not the cell's stderr
            assert "cell [1] ended after the frontend that ran it disconnected, so its 20 outputs reached no notebook" \
                in notice and "`%klbr replay 1`" in notice
            _, outputs = execute(other, "%klbr replay 1")  # the line the notice gave
            assert _lines(outputs) == [f"line {i}" for i in range(20)]
        finally:
            other.stop_channels()


def test_ten_mib_replay_in_messages_of_at_most_one_mib():
    with start_kernel(extra_arguments=["--Store.max_output_bytes=33554432"]) as (km, kc):
        _ten_mib(kc)


def _ten_mib(kc) -> None:
    execute(kc, "import sys\nfor i in range(160):\n    sys.stdout.write(('%04d' % i) * 16384)\n    sys.stdout.flush()",
            timeout=120)
    started = time.monotonic()
    _, outputs = execute(kc, "%klbr replay", timeout=120)
    streams = [m["content"]["text"] for m in outputs if m["msg_type"] == "stream"][1:]  # after the header
    assert max(len(text.encode()) for text in streams) <= 2**20
    assert "".join(streams) == "".join(f"{i:04d}" * 16384 for i in range(160))
    assert time.monotonic() - started < 60


def test_a_replay_after_the_kernel_restarts_finds_the_notebooks_last_cell(tmp_path):
    db = tmp_path / "log.sqlite3"
    env = {"KLBR_DB": str(db), "JPY_SESSION_NAME": str(tmp_path / "analysis.ipynb")}
    with start_kernel(env=env) as (km, kc):
        execute(kc, "print('from the first session')")
    with start_kernel(env=env) as (km, kc):
        _, outputs = execute(kc, "%klbr replay")
        text = stream_text(outputs)
        assert "of session 1" in text.splitlines()[0] and "from the first session" in text


def test_a_widget_replays_as_its_static_fallback(kernel):
    km, kc = kernel
    execute(kc, "import ipywidgets as w\ndisplay(w.IntSlider(value=3))")
    _, outputs = execute(kc, "%klbr replay")
    displays = [m["content"]["data"] for m in outputs if m["msg_type"] == "display_data"]
    assert displays and all("application/vnd.jupyter.widget-view+json" not in data for data in displays)
    assert "IntSlider" in json.dumps(displays)
