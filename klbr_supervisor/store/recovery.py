"""At start: cells left `running` by a kernel that is gone become `unknown`, never re-run.

A cell that was running when its kernel died may have had effects (files written, money moved), so
it is neither marked failed nor run again: it is `unknown`, with an event saying why.
"""

from __future__ import annotations

import json
import os
import sqlite3

from ..system import facts

UNKNOWN_WHY = "its kernel died while it ran: it may have had effects, and it was not re-run"


def kernel_alive(pid: int) -> bool:
    """Whether `pid` is a live klbr kernel on this host (not merely a reused pid). Where nothing here
    can show its command line (another user's, /proc hidden), it is alive while the pid is: a session
    is closed only when its kernel is known to be gone."""
    if not facts.exists(pid):
        return False
    argv = facts.command_line(pid)
    return argv is None or b"klbr_kernel" in "\0".join(argv).encode()


def recover_orphans(conn: sqlite3.Connection, host: str, when: str) -> list[int]:
    """Close this host's sessions whose kernel is gone; their running cells become `unknown`."""
    rows = conn.execute("SELECT id, pid FROM sessions WHERE ended IS NULL AND host = ?", (host,)).fetchall()
    dead = [sid for sid, pid in rows if pid != os.getpid() and not kernel_alive(pid)]
    recovered: list[int] = []
    if not dead:
        return recovered
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sid in dead:
            cells = [r[0] for r in conn.execute(
                "SELECT id FROM cells WHERE session_id = ? AND status = 'running'", (sid,))]
            conn.execute(
                "UPDATE cells SET status = 'unknown', finished = ?, error = ? WHERE session_id = ? AND status = 'running'",
                (when, UNKNOWN_WHY, sid))
            conn.execute("UPDATE generations SET ended = ?, end_reason = 'lost: the kernel died'"
                         " WHERE session_id = ? AND ended IS NULL", (when, sid))
            conn.execute("UPDATE sessions SET ended = ? WHERE id = ?", (when, sid))
            seq = conn.execute("SELECT coalesce(max(seq), 0) FROM events WHERE session_id = ?", (sid,)).fetchone()[0]
            for cell_id in cells:
                seq += 1
                conn.execute("INSERT INTO events (session_id, seq, kind, payload, time) VALUES (?, ?, ?, ?, ?)",
                             (sid, seq, "cell_unknown", json.dumps({"cell": cell_id, "why": UNKNOWN_WHY}), when))
            recovered.extend(cells)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return recovered
