"""The store's schema, versioned with PRAGMA user_version and migrated forward.

These table and column names are a public interface (users query them with sqlite3): add, never
rename. Times are ISO 8601 UTC text, so they sort and read as they are.
"""

from __future__ import annotations

import sqlite3

# Each entry takes the schema from version i to i + 1: its statements, one string each (never a script
# split on ";", which a semicolon inside a statement or a comment would break).
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            uuid TEXT NOT NULL UNIQUE,          -- the kernel's header.session toward the frontend
            notebook TEXT,                      -- JPY_SESSION_NAME, when the frontend gives one
            kernel TEXT,                        -- kernelspec name
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,               -- the proxy's
            started TEXT NOT NULL,
            ended TEXT
        )""",
        """CREATE INDEX sessions_notebook ON sessions (notebook, id)""",
        """CREATE TABLE generations (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions (id),
            number INTEGER NOT NULL,
            placement TEXT NOT NULL,
            identity TEXT,                      -- JSON: interpreter, hostname, ...
            pid INTEGER,
            started TEXT NOT NULL,
            ended TEXT,
            end_reason TEXT,                    -- e.g. "lost: killed by signal 9 (SIGKILL)"
            UNIQUE (session_id, number)
        )""",
        """CREATE TABLE cells (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions (id),
            generation INTEGER,                 -- generations.number within the session
            msg_id TEXT NOT NULL,
            client_session TEXT,                -- the frontend's header.session
            execution_count INTEGER,
            code TEXT NOT NULL,
            status TEXT NOT NULL,               -- running ok error aborted interrupted killed timeout lost unknown refused
            started TEXT NOT NULL,
            finished TEXT,
            error TEXT,                         -- "ename: evalue"
            reply TEXT,                         -- the execute_reply content, JSON
            output_bytes INTEGER NOT NULL DEFAULT 0,
            outputs_truncated INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE INDEX cells_session ON cells (session_id, id)""",
        """CREATE INDEX cells_msg ON cells (msg_id, client_session)""",
        """CREATE INDEX cells_status ON cells (status) WHERE status IN ('running', 'unknown')""",
        """CREATE TABLE outputs (
            cell_id INTEGER NOT NULL REFERENCES cells (id),
            seq INTEGER NOT NULL,
            msg_type TEXT NOT NULL,             -- stream, display_data, execute_result, error, ...
            content TEXT NOT NULL,              -- the iopub message content, JSON as sent
            PRIMARY KEY (cell_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE events (
            session_id INTEGER NOT NULL REFERENCES sessions (id),
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,                 -- generation_started, generation_ended, interrupt, ...
            payload TEXT,                       -- JSON
            time TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE kv (
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,                -- JSON
            PRIMARY KEY (scope, key)
        ) WITHOUT ROWID""",
    ),
    # cells.msg_digest: what made an execute that message and no other, since a client may reuse a
    # msg_id with other code (semantics 9): its signature as received, or with no key "sha256:" and a
    # digest of its header and content. Rows written before it have none, and no resend matches them.
    # Read through cells_msg (msg_id, client_session), cells_client since schema 6: the few rows of one msg_id.
    (
        """ALTER TABLE cells ADD COLUMN msg_digest TEXT""",
    ),
    (
        # The frontend's id of the cell an execute came from (JupyterLab's `metadata.cellId`), so a
        # page can find a cell's outputs by the cell it shows; NULL when the frontend sends none.
        """ALTER TABLE cells ADD COLUMN frontend_cell_id TEXT""",
        """CREATE INDEX cells_frontend ON cells (session_id, frontend_cell_id, id)
           WHERE frontend_cell_id IS NOT NULL""",
    ),
    (
        # The peak resident set (bytes) of a local worker's process tree, as sampled about once a
        # second and at each cell's end: during a cell, and over a generation; NULL where nothing
        # was sampled (a worker elsewhere, a cell no worker ran).
        """ALTER TABLE cells ADD COLUMN memory_peak INTEGER""",
        """ALTER TABLE generations ADD COLUMN memory_peak INTEGER""",
    ),
    (
        # Every cell's `running` row entered cells_status and its outcome left it: a page more in
        # the WAL for each of a cell's two commits (~24k instructions per cell). Only recovery read
        # it, for the running cells of a dead session, which cells_session finds as well (the
        # session's rows, read once when a kernel finds its predecessor dead).
        """DROP INDEX cells_status""",
    ),
    (
        # cells_msg by client session first: what a kernel asks once of each client session it sees
        # (the msg_ids it has in the log, `queries.logged_msg_ids`) is one range of it, and the
        # lookup of one execute (`queries.recorded_execute`) still one key. It costs an INSERT
        # ~3-5k instructions more than the other order (the client session, the same for a
        # client's every row, is compared before the msg_id; with 20,000 rows before it, both
        # orders' pages were in the loop connection's cache alike), against ~60k for the read per
        # execute that it lets `Resends` skip.
        """DROP INDEX cells_msg""",
        """CREATE INDEX cells_client ON cells (client_session, msg_id)""",
    ),
    (
        # A cell `%klbr rebuild` ran again: the id of the cell it repeats (its code as that one ran),
        # NULL for every other cell. Read only for a rebuild's plan, which finds a generation's cells
        # by cells_session: no index of its own, nothing more per cell.
        """ALTER TABLE cells ADD COLUMN rebuild_of INTEGER REFERENCES cells (id)""",
    ),
    (
        # A notebook is found by its cells' ids, in any session (the history of a notebook renamed,
        # moved or reopened after a server restart; the records of a page's cells): cells_frontend
        # put the session first, so finding which sessions hold a page's 100 ids read the whole
        # index (65 ms over 200,000 cells, growing with the log; 0.15 ms with the id first); an
        # insert costs no measurable more (docs/decisions/63-notebook-by-cell-ids.md).
        """DROP INDEX cells_frontend""",
        """CREATE INDEX cells_frontend_id ON cells (frontend_cell_id, session_id, id)
           WHERE frontend_cell_id IS NOT NULL""",
    ),
]

VERSION = len(MIGRATIONS)


class SchemaTooNewError(RuntimeError):
    """The file was written by a newer klbr; this one will not guess at its schema."""


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to `VERSION`, one committed step at a time; returns the version found."""
    found: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > VERSION:
        msg = f"schema version {found} is newer than this klbr understands ({VERSION})"
        raise SchemaTooNewError(msg)
    for version in range(found, VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # A concurrent kernel may have migrated while we waited for the lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] != version:
                conn.execute("ROLLBACK")
                continue
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found
