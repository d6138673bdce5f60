"""`make demo`: run a notebook on the klbr kernel with nbclient, then print its cells as the cell log
recorded them (code, generation, status, outputs) — the same record `klbr-kernel export` recovers."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from klbr_supervisor.store import Store
from klbr_supervisor.store.queries import cell, cells, connect


def _text(msg_type: str, content: dict) -> str:
    if msg_type == "stream":
        return content.get("text", "")
    if msg_type == "error":
        return f"{content.get('ename')}: {content.get('evalue')}\n"
    data = content.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:
        return "[widget]\n"
    for mime in ("text/markdown", "text/plain"):
        if mime in data:
            return data[mime] + "\n"
    return f"[{next(iter(data), 'empty')}]\n"


def _last_session(db: str) -> int:
    """The newest session in the cell log at `db` before the run (0: none, or no cell log yet)."""
    if not os.path.exists(db):
        return 0
    return connect(db).execute("SELECT coalesce(max(id), 0) FROM sessions").fetchone()[0]


def main(path: str) -> None:
    notebook = str(Path(path).resolve())
    os.environ["JPY_SESSION_NAME"] = notebook  # what jupyter_server tells a kernel: its notebook
    nb = nbformat.read(path, as_version=4)
    db = Store().path
    before = _last_session(db)
    with tempfile.TemporaryDirectory() as cwd:
        try:
            NotebookClient(nb, kernel_name="klbr", timeout=120, resources={"metadata": {"path": cwd}}).execute()
        except CellExecutionError as e:
            print(f"nbclient stopped at an unexpected error: {e}", file=sys.stderr)
    conn = connect(db)
    session = conn.execute("SELECT max(id) FROM sessions WHERE notebook = ? AND id > ?", (notebook, before)).fetchone()[0]
    if session is None:  # the kernel served without its cell log, and said why in its log (above)
        sys.exit(f"\n== {Path(path).name} ran on klbr, but its cells were not recorded in {db}: "
                 "the kernel's log above says why")
    rows = cells(conn, session)
    print(f"\n== {Path(path).name} on klbr: {len(rows)} cells in the cell log ({db}, session {session})\n")
    for row in rows:
        where = f"generation {row['generation']}" if row["generation"] else "answered by the supervisor"
        print(f"In [{row['execution_count']}]  {where}  {row['status']}")
        for line in row["code"].splitlines():
            print(f"    {line}")
        for out in cell(conn, row["id"])[1]:
            text = _text(out["msg_type"], json.loads(out["content"]))
            if len(text) > 300:
                text = text[:300] + f"... ({len(text)} characters)\n"
            body = text.rstrip("\n").replace("\n", "\n      ")
            print(f"  {out['msg_type']}: {body}")
        print()
    print(f"Recover it as a notebook: klbr-kernel export {session} -o recovered.ipynb")


if __name__ == "__main__":
    main(sys.argv[1])
