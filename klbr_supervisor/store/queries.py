"""Reading the cell log: sessions, cells, history, notebook export, pruning.

Used by the CLI and by the proxy's history replies. Plain functions over a sqlite3 connection; no
writer state, so they work on any klbr database, also one whose kernels are long gone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

# A history_reply's entry: (session, execution count, input), or with `output`, (session, count,
# (input, its execute_result's text/plain or None)), as jupyter_client's protocol has it.
HistoryEntry = tuple[int, int, str | tuple[str, str | None]]


def connect(path: str, *, write: bool = False) -> sqlite3.Connection:
    """A connection for reading (or, for pruning, writing) an existing database."""
    mode = "rw" if write else "ro"
    conn = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, timeout=10, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


# -- listings ---------------------------------------------------------------------------------------

def sessions(conn: sqlite3.Connection, limit: int = 50) -> list[sqlite3.Row]:
    """The newest sessions first: id, notebook, kernel, started, ended, cell count, last status."""
    return conn.execute(
        """SELECT s.id, s.notebook, s.kernel, s.pid, s.started, s.ended,
                  (SELECT count(*) FROM cells c WHERE c.session_id = s.id) AS cells,
                  (SELECT status FROM cells c WHERE c.session_id = s.id ORDER BY c.id DESC LIMIT 1) AS last_status
           FROM sessions s ORDER BY s.id DESC LIMIT ?""",
        (limit,),
    ).fetchall()


def cells(conn: sqlite3.Connection, session_id: int, status: str | None = None,
          limit: int | None = None) -> list[sqlite3.Row]:
    query = ("SELECT id, generation, execution_count, status, started, finished, code, error, output_bytes,"
             " outputs_truncated FROM cells WHERE session_id = ?")
    args: list[int | str] = [session_id]
    if status:
        query += " AND status = ?"
        args.append(status)
    query += " ORDER BY id"
    if limit:
        query = f"SELECT * FROM ({query.replace('ORDER BY id', 'ORDER BY id DESC')} LIMIT ?) ORDER BY id"  # noqa: S608 — only this function's fixed SQL is interpolated; values are bound
        args.append(limit)
    return conn.execute(query, args).fetchall()


def cell(conn: sqlite3.Connection, cell_id: int) -> tuple[sqlite3.Row | None, list[sqlite3.Row]]:
    row = conn.execute("SELECT * FROM cells WHERE id = ?", (cell_id,)).fetchone()
    outs = conn.execute("SELECT seq, msg_type, content FROM outputs WHERE cell_id = ? ORDER BY seq", (cell_id,)).fetchall()
    return row, outs


def prune(conn: sqlite3.Connection, older_than_days: float) -> int:
    """Delete sessions that ended more than `older_than_days` ago, with all they hold. Returns how many."""
    cutoff = (datetime.now(UTC) - timedelta(days=older_than_days)).isoformat(timespec="milliseconds")
    cutoff = cutoff.replace("+00:00", "Z")
    conn.execute("BEGIN IMMEDIATE")
    try:
        ids = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE ended IS NOT NULL AND ended < ?", (cutoff,))]
        for sid in ids:
            conn.execute("DELETE FROM outputs WHERE cell_id IN (SELECT id FROM cells WHERE session_id = ?)", (sid,))
            for table in ("cells", "events", "generations"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))  # noqa: S608 — table from the fixed tuple above
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(ids)


class Taken(NamedTuple):
    """An execute this log recorded under a client's (client session, msg_id)."""

    resent: bool  # the same message again (its digest matched), not only another with its msg_id
    status: str
    reply: dict[str, Any] | None


def recorded_execute(conn: sqlite3.Connection, client_session: str, msg_id: str, digest: str) -> Taken | None:
    """The cell a client sent as (client session, msg_id), in any kernel session of this log (a
    resend may come to the next kernel on the file): the one whose `msg_digest` is `digest` if
    there is one, else the latest that only shares the msg_id; None when no cell had it.
    One read on `cells_client`, which narrows to the rows of that msg_id (semantics 9)."""
    row = conn.execute("SELECT msg_digest IS ?, status, reply FROM cells WHERE client_session = ? AND msg_id = ?"
                       " ORDER BY msg_digest IS ? DESC, id DESC LIMIT 1",
                       (digest, client_session, msg_id, digest)).fetchone()
    return Taken(bool(row[0]), row[1], json.loads(row[2]) if row[2] else None) if row else None


def logged_msg_ids(conn: sqlite3.Connection, client_session: str, limit: int) -> set[str] | None:
    """The msg_ids of every execute a client sent as `client_session`, in any kernel session of
    this log; None when there are more than `limit` rows of it. One range of `cells_client`."""
    rows = conn.execute("SELECT msg_id FROM cells WHERE client_session = ? LIMIT ?",
                        (client_session, limit + 1)).fetchall()
    return None if len(rows) > limit else {row[0] for row in rows}


# -- history (history_request, %klbr history) -------------------------------------------------------

def history(conn: sqlite3.Connection, content: dict[str, Any], session_ids: list[int]) -> list[HistoryEntry]:
    """A history_request's answer: the cells of `session_ids` (this notebook's sessions, oldest
    first, this one last), with integer session numbers (0 or less: relative to this session, as
    IPython counts them)."""
    output = bool(content.get("output", False))
    kind = content.get("hist_access_type", "tail")
    ids = session_ids
    if kind == "range":
        session = int(content.get("session") or 0)
        if session <= 0:
            session = ids[max(0, len(ids) - 1 + session)] if -session < len(ids) else ids[0]
        return history_range(conn, session, int(content.get("start") or 1), content.get("stop"), output)
    if kind == "search":
        return history_search(conn, ids, content.get("pattern") or "*", content.get("n"),
                              bool(content.get("unique", False)), output)
    return history_tail(conn, ids, int(content.get("n") or 10), output)


def sessions_named(conn: sqlite3.Connection, notebook: str | None, session_id: int) -> list[int]:
    """The sessions filed under the notebook's path, oldest first, or just this one: a notebook's
    sessions when nothing better is known (no klbr extension told the kernel its cells)."""
    if not notebook:
        return [session_id]
    ids = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE notebook = ? ORDER BY id", (notebook,))]
    return ids or [session_id]


# SQLite binds at most 32,766 parameters (fewer before 3.32): long lists of ids go in batches.
_BATCH = 500


def _batches(values: Sequence[Any]) -> Iterator[tuple[str, Sequence[Any]]]:
    """`values` in batches, each with its placeholders."""
    for start in range(0, len(values), _BATCH):
        batch = values[start:start + _BATCH]
        yield ",".join("?" * len(batch)), batch


def sessions_with_cells(conn: sqlite3.Connection, cell_ids: Sequence[str]) -> list[int]:
    """The sessions that recorded a cell with one of these frontend cell ids, oldest first: a
    notebook's sessions, by its cells (found by `cells_frontend_id`, whatever the notebook was
    called then)."""
    found: set[int] = set()
    for marks, batch in _batches(cell_ids):
        found.update(r[0] for r in conn.execute(
            f"SELECT DISTINCT session_id FROM cells WHERE frontend_cell_id IS NOT NULL"  # noqa: S608 — only ? placeholders are interpolated
            f" AND frontend_cell_id IN ({marks})", batch))
    return sorted(found)


_HISTORY = ("SELECT c.session_id, c.execution_count, c.code, c.id FROM cells c"
            " WHERE c.session_id IN ({sessions}) AND c.execution_count IS NOT NULL")


def _result_text(conn: sqlite3.Connection, cell_id: int) -> str | None:
    row = conn.execute("SELECT content FROM outputs WHERE cell_id = ? AND msg_type = 'execute_result'"
                       " ORDER BY seq DESC LIMIT 1", (cell_id,)).fetchone()
    if row is None:
        return None
    text: str | None = json.loads(row[0]).get("data", {}).get("text/plain")
    return text


def _entries(conn: sqlite3.Connection, rows: Iterable[sqlite3.Row], output: bool) -> list[HistoryEntry]:
    if output:
        return [(r[0], r[1], (r[2], _result_text(conn, r[3]))) for r in rows]
    return [(r[0], r[1], r[2]) for r in rows]


def history_tail(conn: sqlite3.Connection, session_ids: list[int], n: int,
                 output: bool = False) -> list[HistoryEntry]:
    marks = ",".join("?" * len(session_ids))
    rows = conn.execute(_HISTORY.format(sessions=marks) + " ORDER BY c.id DESC LIMIT ?", (*session_ids, n)).fetchall()
    return _entries(conn, rows[::-1], output)


def history_range(conn: sqlite3.Connection, session: int, start: int, stop: int | None,
                  output: bool = False) -> list[HistoryEntry]:
    query = _HISTORY.format(sessions="?") + " AND c.execution_count >= ?"
    args: list[int] = [session, start]
    if stop is not None:
        query += " AND c.execution_count < ?"
        args.append(stop)
    rows = conn.execute(query + " ORDER BY c.id", args).fetchall()
    return _entries(conn, rows, output)


def history_search(conn: sqlite3.Connection, session_ids: list[int], pattern: str, n: int | None,
                   unique: bool, output: bool = False) -> list[HistoryEntry]:
    """`pattern` as IPython takes it: a glob (* and ?), matched against the whole input."""
    marks = ",".join("?" * len(session_ids))
    rows = conn.execute(_HISTORY.format(sessions=marks) + " AND c.code GLOB ? ORDER BY c.id",
                        (*session_ids, pattern)).fetchall()
    if unique:
        latest: dict[str, sqlite3.Row] = {}
        for r in rows:
            latest.pop(r[2], None)
            latest[r[2]] = r
        rows = list(latest.values())
    if n:
        rows = rows[-n:]
    return _entries(conn, rows, output)


# -- export -----------------------------------------------------------------------------------------

# Outputs and cells are built as plain dicts in nbformat 4's schema: nbformat's new_output and
# new_code_cell validate each node (~1 ms apiece), too slow for a 10 000-cell session. The tests
# validate what this builds with nbformat.
def _to_output(msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    if msg_type == "stream":
        out = {"output_type": "stream", "name": content.get("name", "stdout"), "text": content.get("text", "")}
    elif msg_type == "error":
        out = {"output_type": "error", "ename": content.get("ename", ""), "evalue": content.get("evalue", ""),
               "traceback": content.get("traceback", [])}
    elif msg_type == "execute_result":
        out = {"output_type": "execute_result", "data": content.get("data", {}),
               "metadata": content.get("metadata", {}), "execution_count": content.get("execution_count")}
    else:
        out = {"output_type": "display_data", "data": content.get("data", {}), "metadata": content.get("metadata", {})}
    return out


def rendered_outputs(rows: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """A cell's recorded iopub outputs, `(msg_type, content JSON)` in order, as a notebook shows them
    at the end: clears and display updates applied, adjacent writes to one stream joined."""
    outputs: list[dict[str, Any]] = []
    by_display: dict[str, list[dict[str, Any]]] = {}
    parts: dict[int, list[str]] = {}  # a stream output's texts, joined once at the end (not += each)
    clear_pending = False
    for msg_type, text in rows:
        content = json.loads(text)
        if msg_type == "clear_output":
            if content.get("wait"):
                clear_pending = True
            else:
                outputs.clear()
            continue
        if msg_type == "update_display_data":
            for out in by_display.get(content.get("transient", {}).get("display_id"), []):
                out["data"], out["metadata"] = content.get("data", {}), content.get("metadata", {})
            continue
        if clear_pending:
            outputs.clear()
            clear_pending = False
        out = _to_output(msg_type, content)
        if out["output_type"] == "stream" and outputs and outputs[-1]["output_type"] == "stream" \
                and outputs[-1]["name"] == out["name"]:
            parts.setdefault(id(outputs[-1]), [outputs[-1]["text"]]).append(out["text"])
            continue
        display_id = content.get("transient", {}).get("display_id")
        if display_id:
            by_display.setdefault(display_id, []).append(out)
        outputs.append(out)
    for out in outputs:
        if id(out) in parts:
            out["text"] = "".join(parts[id(out)])
    return outputs


def export_notebook(conn: sqlite3.Connection, session_id: int) -> dict[str, Any]:
    """The session as an nbformat 4 notebook (a plain dict), outputs as recorded, each cell's status
    in its metadata."""
    session = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if session is None:
        msg = f"no session {session_id}"
        raise LookupError(msg)
    outputs: dict[int, list[tuple[str, str]]] = {}
    for cell_id, msg_type, content in conn.execute(
            "SELECT o.cell_id, o.msg_type, o.content FROM outputs o JOIN cells c ON c.id = o.cell_id"
            " WHERE c.session_id = ? ORDER BY o.cell_id, o.seq", (session_id,)):
        outputs.setdefault(cell_id, []).append((msg_type, content))
    nb: dict[str, Any] = {"nbformat": 4, "nbformat_minor": 5, "cells": [], "metadata": {
        "kernelspec": {"name": session["kernel"] or "klbr", "display_name": "Python 3 (klbr)", "language": "python"},
        "language_info": {"name": "python"},
        "klbr": {"session": session_id, "notebook": session["notebook"], "started": session["started"],
                 "ended": session["ended"]},
    }}
    rows = conn.execute("SELECT * FROM cells WHERE session_id = ? ORDER BY id", (session_id,)).fetchall()
    # A cell run again has one row per run: its frontend id goes to the last of them (what the
    # notebook showed), the others keep ids of their own, so the ids stay unique (nbformat 4.5).
    latest = {row["frontend_cell_id"]: row["id"] for row in rows if row["frontend_cell_id"]}
    for row in rows:
        meta = {"cell": row["id"], "status": row["status"], "generation": row["generation"],
                "started": row["started"], "finished": row["finished"]}
        frontend_id = row["frontend_cell_id"]
        if frontend_id:
            meta["frontend_cell_id"] = frontend_id
        if frontend_id and latest[frontend_id] == row["id"]:
            cell_id = frontend_id
        else:
            cell_id = f"klbr-{row['id']}"
            while cell_id in latest:  # a frontend that chose ids of this shape itself
                cell_id += "-"
        if row["error"]:
            meta["error"] = row["error"]
        if row["outputs_truncated"]:
            meta["outputs_truncated"] = True
        nb["cells"].append({"cell_type": "code", "id": cell_id, "source": row["code"],
                            "metadata": {"klbr": meta}, "execution_count": row["execution_count"],
                            "outputs": rendered_outputs(outputs.get(row["id"], []))})
    return nb


def write_notebook(nb: dict[str, Any], path: str) -> None:
    """Write what `export_notebook` built, as nbformat writes .ipynb files (indent 1, sorted keys)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(nb, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")


# -- replay (%klbr replay, %klbr history) -----------------------------------------------------------

_OUTPUT_COUNT = "(SELECT count(*) FROM outputs o WHERE o.cell_id = c.id)"


def recent_cells(conn: sqlite3.Connection, session_ids: list[int], n: int) -> list[sqlite3.Row]:
    """The last `n` cells of these sessions, oldest first, with their store ids and output counts."""
    marks = ",".join("?" * len(session_ids))
    rows = conn.execute(
        f"SELECT c.id, c.session_id, c.execution_count, c.code, c.status, {_OUTPUT_COUNT} AS outputs FROM cells c"  # noqa: S608 — only the constant subquery and ? placeholders are interpolated
        f" WHERE c.session_id IN ({marks}) AND c.execution_count IS NOT NULL ORDER BY c.id DESC LIMIT ?",
        (*session_ids, n)).fetchall()
    return rows[::-1]


def replay_cell(conn: sqlite3.Connection, session_id: int, session_ids: list[int], *, cell_id: int | None = None,
                count: int | None = None) -> sqlite3.Row | None:
    """The cell `%klbr replay` shows: the store's cell `cell_id`, else `In[count]` of this session,
    else the most recent cell of `session_ids` (the notebook's) that a worker ran and that has
    outputs."""
    row: sqlite3.Row | None  # the connection's row_factory (`connect`) makes fetchone's rows Rows
    if cell_id is not None:
        row = conn.execute("SELECT * FROM cells WHERE id = ?", (cell_id,)).fetchone()
    elif count is not None:
        row = conn.execute("SELECT * FROM cells WHERE session_id = ? AND execution_count = ? ORDER BY id DESC"
                           " LIMIT 1", (session_id, count)).fetchone()
    else:
        marks = ",".join("?" * len(session_ids))
        row = conn.execute(
            f"SELECT * FROM cells c WHERE c.session_id IN ({marks}) AND c.generation IS NOT NULL"  # noqa: S608 — only ? placeholders are interpolated
            " AND EXISTS (SELECT 1 FROM outputs o WHERE o.cell_id = c.id) ORDER BY c.id DESC LIMIT 1",
            session_ids).fetchone()
    return row


def replay_outputs(conn: sqlite3.Connection, cell_id: int, before_seq: int | None = None) -> list[tuple[str, str]]:
    """A cell's recorded outputs, `(msg_type, content JSON)` in order (those before `before_seq`)."""
    query = "SELECT msg_type, content FROM outputs WHERE cell_id = ?"
    args: list[int] = [cell_id]
    if before_seq is not None:
        query += " AND seq < ?"
        args.append(before_seq)
    return conn.execute(query + " ORDER BY seq", args).fetchall()


# -- restoring a page's cells (the klbr comm) ------------------------------------------------------

_RECORD = ("id, session_id, msg_id, frontend_cell_id, execution_count, code, status, started, finished,"
           " output_bytes, outputs_truncated")


def latest_by_frontend_cell(conn: sqlite3.Connection, cell_ids: Sequence[str],
                            session_id: int | None = None) -> dict[str, sqlite3.Row]:
    """The latest recorded cell for each of these frontend cell ids, of session `session_id` or, with
    None, of any session: what that cell of the notebook showed last. Rows carry no outputs
    (`replay_outputs` reads them)."""
    rows: list[sqlite3.Row] = []
    only = "" if session_id is None else " AND session_id = ?"
    for marks, batch in _batches(cell_ids):
        rows += conn.execute(
            f"SELECT {_RECORD} FROM cells WHERE id IN (SELECT max(id) FROM cells WHERE frontend_cell_id IS NOT NULL"  # noqa: S608 — only constants and ? placeholders are interpolated
            f" AND frontend_cell_id IN ({marks}){only} GROUP BY frontend_cell_id)",
            (*batch, session_id) if only else batch).fetchall()
    return {row["frontend_cell_id"]: row for row in sorted(rows, key=lambda row: row["id"])}


def session_frontend_cells(conn: sqlite3.Connection, session_id: int) -> list[sqlite3.Row]:
    """The latest recorded cell of each frontend cell id this session ran, oldest first."""
    return conn.execute(
        f"SELECT {_RECORD} FROM cells WHERE id IN (SELECT max(id) FROM cells WHERE session_id = ?"  # noqa: S608 — only a constant is interpolated
        " AND frontend_cell_id IS NOT NULL GROUP BY frontend_cell_id) ORDER BY id", (session_id,)).fetchall()


def records(conn: sqlite3.Connection, ids: Sequence[int], session_id: int | None = None) -> list[sqlite3.Row]:
    """The recorded cells with these store ids that came from a frontend cell (of session
    `session_id`, or of any with None), in the order asked."""
    found: dict[int, sqlite3.Row] = {}
    only = "" if session_id is None else " AND session_id = ?"
    for marks, batch in _batches(ids):
        for row in conn.execute(f"SELECT {_RECORD} FROM cells WHERE id IN ({marks})"  # noqa: S608 — only constants and ? placeholders are interpolated
                                f" AND frontend_cell_id IS NOT NULL{only}", (*batch, session_id) if only else batch):
            found[row["id"]] = row
    return [found[i] for i in ids if i in found]


def generations(conn: sqlite3.Connection, session_id: int) -> list[sqlite3.Row]:
    """This session's generations in order: when each started and ended, why, its peak memory, and
    how many cells it ran (the status dialog's picture)."""
    return conn.execute(
        "SELECT g.number, g.placement, g.started, g.ended, g.end_reason, g.memory_peak,"
        " (SELECT count(*) FROM cells c WHERE c.session_id = g.session_id AND c.generation = g.number) AS cells"
        " FROM generations g WHERE g.session_id = ? ORDER BY g.number", (session_id,)).fetchall()


# -- kv (host.get, host.keys) -----------------------------------------------------------------------

def kv_get(conn: sqlite3.Connection, scope: str, key: str) -> str | None:
    """The JSON text kept under `key` in `scope`, or None."""
    row = conn.execute("SELECT value FROM kv WHERE scope = ? AND key = ?", (scope, key)).fetchone()
    return row[0] if row else None


def kv_keys(conn: sqlite3.Connection, scope: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT key FROM kv WHERE scope = ? ORDER BY key", (scope,))]
