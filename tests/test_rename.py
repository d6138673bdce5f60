"""The history follows the notebook, not the name it had when its kernel started: the extension tells
the kernel where the notebook is and which cells it holds (the klbr comm's `notebook`), and a new
`Untitled.ipynb` inherits no one's cells. A notice of outputs that reached no notebook is given only
while it is true (docs/reconnecting.md)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from jupyter_client.session import Session

from test_comm import HALTING, Comm, bracket, reply_to, run_cell, send
from utils import execute, start_kernel, stream_text


def _env(tmp_path, name: str) -> dict[str, str]:
    """A kernel the server started for the notebook `name` of the root `tmp_path` (its path then)."""
    return {"KLBR_DB": str(tmp_path / "log.sqlite3"), "JPY_SESSION_NAME": str(tmp_path / name)}


def _history(kc) -> str:
    return stream_text(execute(kc, "%klbr history")[1], "stdout")


def _sessions(tmp_path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(tmp_path / "log.sqlite3")
    try:
        return conn.execute("SELECT id, notebook FROM sessions ORDER BY id").fetchall()
    finally:
        conn.close()


def test_a_renamed_notebook_keeps_its_history_and_a_new_untitled_gets_none(tmp_path):
    # JupyterLab's ordinary flow: a new notebook, Untitled.ipynb, a cell run, then a rename.
    with start_kernel(env=_env(tmp_path, "Untitled.ipynb")) as (km, kc):
        comm = Comm(kc)
        (told,) = comm.request("notebook", path="Untitled.ipynb", cell_ids=["first-cell"])
        assert told["notebook"] == str(tmp_path / "Untitled.ipynb")
        assert reply_to(kc, run_cell(kc, "print('before the rename')", "first-cell"))["content"]["status"] == "ok"
        (told,) = comm.request("notebook", path="work/analysis.ipynb", cell_ids=["first-cell"])
        assert told["notebook"] == str(tmp_path / "work" / "analysis.ipynb") and told["sessions"] == [1]
    assert _sessions(tmp_path) == [(1, str(tmp_path / "work" / "analysis.ipynb"))]
    listed = subprocess.run([sys.executable, "-m", "klbr_kernel", "sessions", "--db", str(tmp_path / "log.sqlite3")],
                            capture_output=True, text=True, check=True).stdout
    assert "work/analysis.ipynb" in listed and "Untitled" not in listed, listed

    # The server restarts; the renamed notebook is opened: its kernel starts under the new name.
    with start_kernel(env=_env(tmp_path, "work/analysis.ipynb")) as (km, kc):
        assert "print('before the rename')" in _history(kc)  # a frontend without the extension: by its path
        comm = Comm(kc)
        (told,) = comm.request("notebook", path="work/analysis.ipynb", cell_ids=["first-cell"])
        assert told["sessions"] == [1, 2]
        (answer,) = comm.request("cells", cell_ids=["first-cell"], previous_sessions=True)
        (cell,) = answer["cells"]
        assert cell["session"] == 1 and cell["outputs"][0]["text"] == "before the rename\n"
        assert "print('before the rename')" in _history(kc)

    # A second new notebook, Untitled.ipynb again: none of those cells, with the extension or without.
    with start_kernel(env=_env(tmp_path, "Untitled.ipynb")) as (km, kc):
        assert _history(kc) == "No cells recorded yet.\n"
        comm = Comm(kc)
        (told,) = comm.request("notebook", path="Untitled.ipynb", cell_ids=["a-new-cell"])
        assert told["sessions"] == [3]
        assert "before the rename" not in _history(kc)  # only its own cell: the `%klbr history` above
        reply, _ = execute(kc, "%klbr replay")
        assert "no cell of this notebook has outputs" in reply["content"]["evalue"]


def test_a_copy_shares_the_history_of_the_cells_it_holds(tmp_path):
    """A copy holds the same cell ids: it shows what they ran, wherever; its own cells are its own."""
    with start_kernel(env=_env(tmp_path, "a.ipynb")) as (km, kc):
        assert reply_to(kc, run_cell(kc, "print('in a')", "shared"))["content"]["status"] == "ok"
    with start_kernel(env=_env(tmp_path, "a-Copy1.ipynb")) as (km, kc):
        assert _history(kc) == "No cells recorded yet.\n"  # by its name alone: nothing
        comm = Comm(kc)
        (told,) = comm.request("notebook", path="a-Copy1.ipynb", cell_ids=["shared"])
        assert told["sessions"] == [1, 2]
        assert "print('in a')" in _history(kc)


def test_bad_notebook_requests_are_named_errors(tmp_path):
    with start_kernel(env=_env(tmp_path, "x.ipynb")) as (km, kc):
        comm = Comm(kc)
        for fields, says in [({}, "'path' is a path"), ({"path": "a\0b"}, "'path' is a path"),
                             ({"path": "x.ipynb", "cell_ids": "c"}, "'cell_ids' is a list"),
                             ({"path": "x" * 5000}, "at most 4096 characters")]:
            (answer,) = comm.request("notebook", **fields)
            assert answer["error"]["name"] in ("MalformedRequest", "TooLarge") and says in answer["error"]["message"], answer
        assert _sessions(tmp_path) == [(1, str(tmp_path / "x.ipynb"))]  # nothing changed
        assert execute(kc, "1 + 1")[0]["content"]["status"] == "ok"


def _orphaned(km, kc, tmp_path):
    """A cell whose frontend leaves mid-cell (a reloaded page) ends: another client, with a klbr
    comm, is there when it does. That client and its comm."""
    go = tmp_path / "go"
    running = run_cell(kc, HALTING.format(n=20, go=str(go)), "printing")
    while kc.get_iopub_msg(timeout=60)["msg_type"] != "stream":
        pass
    kc.stop_channels()
    info = km.get_connection_info()
    other = km.client(session=Session(key=info["key"], signature_scheme=info["signature_scheme"]))
    other.start_channels()
    other.wait_for_ready(timeout=30)
    comm = Comm(other)
    go.touch()
    while not ((m := other.get_iopub_msg(timeout=30))["parent_header"].get("msg_id") == running
               and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"):
        pass
    return other, comm


def _notices(outputs) -> list[str]:
    return [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "display_data"
            and m["content"].get("metadata", {}).get("klbr", {}).get("notice") == "unseen"]


def test_no_notice_of_outputs_the_extension_put_back(tmp_path):
    with start_kernel(env=_env(tmp_path, "n.ipynb")) as (km, kc):
        other, comm = _orphaned(km, kc, tmp_path)
        try:
            (answer,) = comm.request("restored", record_ids=[1])  # the page put cell 1's outputs back
            assert answer["op"] == "restored"
            _, outputs = execute(other, "'next'")
            assert _notices(outputs) == [] and "reached no notebook" not in stream_text(outputs)
        finally:
            other.stop_channels()


def test_a_notice_shown_is_emptied_once_the_outputs_are_put_back(tmp_path):
    with start_kernel(env=_env(tmp_path, "n.ipynb")) as (km, kc):
        other, comm = _orphaned(km, kc, tmp_path)
        try:
            _, outputs = execute(other, "'next'")  # no page restored it yet: the notice is true
            (notice,) = _notices(outputs)
            assert "cell [1] ended after the frontend that ran it disconnected" in notice
            said = bracket(other, send(other, "comm_msg", {"comm_id": comm.comm_id, "data": {
                "v": 1, "id": "r", "op": "restored", "record_ids": [1]}}))
            (update,) = [m for m in said if m["msg_type"] == "update_display_data"]
            assert update["content"]["transient"]["display_id"] == "klbr-unseen-1"
            assert update["content"]["data"] == {"text/plain": ""}
        finally:
            other.stop_channels()
