"""Reading what built a generation's namespace: a session's generations, the cells each ran in the
order they ran, and which of them asked for the generation's end (`%klbr rebuild`).

Plain functions over a read connection, as in `queries`: no writer state. Rows are inserted in the
order cells start, one at a time per session (the proxy has one execute in flight), so a
generation's cells by `id` are the order they ran.
"""

from __future__ import annotations

import json
import sqlite3

# Events that say a cell asked for its generation's end (`host.restart`, `host.relocate`): the
# generation ended right after that cell, its last one.
_ASKED_END = ("host_restart", "host_relocate")


def generations(conn: sqlite3.Connection, session_id: int) -> list[sqlite3.Row]:
    """The session's generations that served, oldest first: number, placement, started, ended,
    end_reason."""
    return conn.execute("SELECT number, placement, started, ended, end_reason FROM generations"
                        " WHERE session_id = ? ORDER BY number", (session_id,)).fetchall()


def generation_cells(conn: sqlite3.Connection, session_id: int, number: int) -> list[sqlite3.Row]:
    """The cells generation `number` of the session ran, in the order they ran: id, execution_count,
    code, status, started, finished, error, frontend_cell_id, rebuild_of, and `origin_count`, the
    execution count of the cell a rebuilt one repeats (followed to the first run, which has one)."""
    return conn.execute(
        """WITH RECURSIVE origin (id, start, count) AS (
               SELECT c.id, c.rebuild_of, c.execution_count FROM cells c
               WHERE c.session_id = ? AND c.generation = ? AND c.rebuild_of IS NOT NULL
             UNION ALL
               SELECT o.id, c.rebuild_of, c.execution_count FROM origin o JOIN cells c ON c.id = o.start
               WHERE o.count IS NULL
           )
           SELECT c.id, c.execution_count, c.code, c.status, c.started, c.finished, c.error, c.frontend_cell_id,
                  c.rebuild_of, coalesce(c.execution_count,
                                         (SELECT max(o.count) FROM origin o WHERE o.id = c.id)) AS origin_count
           FROM cells c WHERE c.session_id = ? AND c.generation = ? ORDER BY c.id""",
        (session_id, number, session_id, number)).fetchall()


def ended_by_request(conn: sqlite3.Connection, session_id: int, number: int) -> bool:
    """Whether a cell of generation `number` asked for its end (`host.restart`, `host.relocate`)."""
    rows = conn.execute("SELECT payload FROM events WHERE session_id = ? AND kind IN (?, ?)",
                        (session_id, *_ASKED_END)).fetchall()
    return any(json.loads(row[0] or "{}").get("generation") == number for row in rows)


def cell_generations(conn: sqlite3.Connection, session_id: int) -> dict[str, int]:
    """For each frontend cell id of the session, the last generation whose namespace has what it
    made: the one its latest run ran in, or a later one that rebuilt that run (`rebuild_of`, followed
    through rebuilds of rebuilds) and ended ok. Cells that never reached a worker are left out."""
    latest = conn.execute(
        "SELECT id, frontend_cell_id, generation FROM cells WHERE id IN (SELECT max(id) FROM cells"
        " WHERE session_id = ? AND frontend_cell_id IS NOT NULL GROUP BY frontend_cell_id)", (session_id,)).fetchall()
    origin: dict[int, int] = {}  # a rebuilt row's id: the id of the run it repeats, first of the chain
    newest: dict[int, int] = {}  # a run's id: the last generation that rebuilt it, ok
    for row in conn.execute("SELECT id, rebuild_of, generation, status FROM cells WHERE session_id = ?"
                            " AND rebuild_of IS NOT NULL ORDER BY id", (session_id,)):
        first = origin[row["id"]] = origin.get(row["rebuild_of"], row["rebuild_of"])
        if row["status"] == "ok" and row["generation"] is not None:
            newest[first] = max(newest.get(first, 0), row["generation"])
    return {row["frontend_cell_id"]: max(row["generation"], newest.get(row["id"], 0))
            for row in latest if row["generation"] is not None}
