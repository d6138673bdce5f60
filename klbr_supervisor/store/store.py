"""The store: one SQLite file, written in the order things happened (see `writer`).

The proxy's request path calls `cell_started` (the row is committed before the worker sees the
cell), `output` (queued; batched into the writer's next transaction) and `cell_finished` (the
outcome and every output received so far commit together, before the frontend sees the reply), or
`answered` for a cell that never ran (its whole row, also before the frontend sees the reply).
These three return True when the loop committed the write itself (the common case: the row is
durable now, and `done` is never called); otherwise `done` runs later on the loop, never inside the
call that took it, and exactly once: one owner decides each write's outcome (`_write`). The threading
rule is in `writer`. A write that fails pauses the store (`paused` says why); the next `cell_started`
tries again and resumes it when the file takes writes again, and the outcomes that failed meanwhile
are written then (a row never stays `running` for a cell its frontend got an answer for, unless the
file never takes writes again before the kernel ends: recovery then calls it `unknown`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from jupyter_core.paths import jupyter_data_dir
from traitlets import Bool, CaselessStrEnum, Float, Int, Unicode, default
from traitlets.config import LoggingConfigurable

from ..system import facts
from .queries import connect
from .records import CellRecord
from .recovery import recover_orphans
from .schema import migrate
from .writer import Apply, Writer

if TYPE_CHECKING:
    from typing_extensions import Buffer  # bytes, or a zmq.Frame as received

log = logging.getLogger(__name__)

Done = Callable[["StoreError | None"], None]
# How often the path is checked for a deleted or replaced file (a stat per cell costs too much).
_FILE_CHECK_INTERVAL = 0.5
# Filesystems on which SQLite's WAL (shared memory between processes) is not safe.
_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs", "ceph", "glusterfs", "lustre"}

# sqlite3 binds a None (NULL) only after looking for an adapter of it: finding none, it asks its
# protocol type for `__adapt__`, whose AttributeError is made, formatted and dropped, ~4,500
# instructions per None bound (a cell binds 2 or 3: no frontend cell id, no error, no memory
# sample). An adapter of None to None is found at once; a builtin's call costs less than a lambda's
# (an empty dict's `get` is None for any key). The module's adapters are the process's: any None
# bound anywhere still goes in as NULL.
_NOTHING: dict[None, None] = {}
sqlite3.register_adapter(type(None), _NOTHING.get)


@functools.lru_cache(maxsize=1)
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


_MILLIS = [f".{ms:03d}Z" for ms in range(1000)]  # what follows the second, made once: no format per call


def now() -> str:
    """UTC now to the millisecond, as `datetime.now(UTC).isoformat(timespec="milliseconds")` writes
    it but with "Z" (2026-12-03T10:15:02.123Z); the text up to the second is made once a second:
    twice per cell, the datetime and its isoformat cost ~10k instructions each."""
    millis = time.time_ns() // 1_000_000
    return _second(millis // 1000) + _MILLIS[millis % 1000]


def dumps(value: Any) -> str:
    """JSON text of a value for the store: orjson's, or where orjson refuses the value (an integer
    past 64 bits, a key that is not a string, nesting past 254) the standard library's, as before.
    Every value not JSON's own is written as its `str()` by both, but for what orjson writes
    itself (a datetime in ISO form with its "T"); NaN and infinities become null (JSON has none:
    the standard library wrote NaN, which `json.loads` reads and SQLite's JSON functions refuse).
    `json.dumps` with a `default` builds a JSONEncoder per call: ~28k instructions for a cell's reply."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(_finite(value), default=str)


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as None, as orjson writes them (for the standard library's
    turn, which would write NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class StoreError(Exception):
    """The store cannot be written (read-only, full, deleted, locked too long); names the path."""

    def __init__(self, path: str, cause: BaseException | str):
        self.path = path
        self.cause = cause
        super().__init__(f"{path}: {cause}")


class Store(LoggingConfigurable):
    path = Unicode(config=True, help="The SQLite file (env KLBR_DB overrides; default <jupyter data dir>/klbr/klbr.sqlite3).")
    max_output_bytes = Int(
        10 * 2**20, config=True,
        help="Bytes of output kept per cell; the rest is counted, not kept, and the truncation recorded.",
    )
    synchronous = CaselessStrEnum(
        ["NORMAL", "FULL"], "NORMAL", config=True,
        help="NORMAL survives a crash of any process; FULL also survives power loss (slower commits).",
    )
    required = Bool(
        False, config=True,
        help="Refuse cells when the store cannot be opened (default: run unrecorded and say so).",
    )
    busy_timeout = Float(10.0, config=True, help="Seconds to wait for another kernel's write lock.")

    @default("path")
    def _path_default(self) -> str:
        return os.environ.get("KLBR_DB") or os.path.join(jupyter_data_dir(), "klbr", "klbr.sqlite3")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if os.environ.get("KLBR_DB"):
            self.path = os.environ["KLBR_DB"]
        self.session_id: int | None = None
        self.unavailable: StoreError | None = None  # could not be opened at start
        self.paused: StoreError | None = None  # stopped taking writes mid-session
        self._writer: Writer[Done] | None = None
        self._reader: sqlite3.Connection | None = None
        self._inode: tuple[int, int] | None = None
        self._file_checked = 0.0
        self._replaced: StoreError | None = None
        self._event_seq = 0
        # Cell outcomes whose write failed, by cell, in the order they failed: written again when the
        # file takes writes again, and at close (see `_retry_owed`).
        self._owed: dict[CellRecord, Apply] = {}

    # -- opening -----------------------------------------------------------------------------------

    def open(self, *, uuid: str, notebook: str | None, kernel: str | None) -> bool:
        """Open (creating 0600, migrating), recover orphans, record this session. False if unavailable."""
        conn = direct_conn = None
        try:
            conn = self._connect()
            migrate(conn)
            recovered = recover_orphans(conn, socket.gethostname(), now())
            with conn:
                cur = conn.execute(
                    "INSERT INTO sessions (uuid, notebook, kernel, host, pid, started) VALUES (?, ?, ?, ?, ?, ?)",
                    (uuid, notebook, kernel, socket.gethostname(), os.getpid(), now()),
                )
            self.session_id = cur.lastrowid
            # The loop's own connection for direct commits: it never waits for another kernel's
            # lock, and never checkpoints (the writer thread does).
            direct_conn = self._connect(busy_timeout=0)
            direct_conn.execute("PRAGMA wal_autocheckpoint = 0")
        except (sqlite3.Error, OSError, RuntimeError) as e:
            self.unavailable = StoreError(self.path, e)
            log.error("klbr store unavailable, this session is not recorded: %s", self.unavailable)
            for c in (conn, direct_conn):
                if c is not None:
                    c.close()
            return False
        for cell_id in recovered:
            log.warning("cell %d was running when its kernel died: now 'unknown' (not re-run)", cell_id)
        self._writer = Writer(conn, direct_conn, self._report)
        return True

    def _connect(self, busy_timeout: float | None = None) -> sqlite3.Connection:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Created 0600 before SQLite sees it: cells hold code and outputs. WAL/SHM files follow it.
        # Only when it does not exist: closing any descriptor of an open database drops this
        # process's POSIX locks on it, and another process closing its last connection would then
        # believe it the last one, checkpoint, and delete the WAL we still write to.
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        timeout = self.busy_timeout if busy_timeout is None else busy_timeout
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        fstype = facts.filesystem_type(path)
        if fstype in _NETWORK_FS:
            log.warning("klbr store %s is on %s: WAL is unsafe there, using a rollback journal", path, fstype)
            conn.execute("PRAGMA journal_mode = DELETE")
        else:
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        st = os.stat(path)
        self._inode = (st.st_dev, st.st_ino)
        return conn

    @property
    def recording(self) -> bool:
        return self._writer is not None

    def reader(self) -> sqlite3.Connection:
        """A read connection for the loop thread (history, replay, resent executes; see `queries`): WAL
        lets it read while the writer writes."""
        if self._reader is None:
            self._reader = connect(self.path)
        return self._reader

    def settled(self, done: Done) -> bool:
        """True when every write submitted so far is committed; else `done` runs later on the loop,
        once they are (or have failed)."""
        if self._writer is None or self._writer.closed or self._writer.idle:
            return True
        self._submit(lambda c: None, done, resuming=True)  # queued behind all of them
        return False

    def close(self) -> None:
        """Mark the session ended and stop the writer (called once, at shutdown)."""
        if self._writer is None or self._writer.closed:
            return
        session_id, ended = self.session_id, now()
        if self._owed:  # a last try, paused or not: what fails now is left `running`, for recovery
            self._retry_owed()
        self._submit(lambda c: c.execute("UPDATE sessions SET ended = ? WHERE id = ?", (ended, session_id)))
        self._writer.close(wait=self.busy_timeout + 5)
        if self._reader is not None:
            self._reader.close()

    def _later(self, done: Done, error: StoreError | None) -> None:
        asyncio.get_running_loop().call_soon(done, error)

    # -- the request path --------------------------------------------------------------------------

    def cell_started(self, cell: CellRecord, done: Done) -> bool:
        """Insert the cell as `running`. True: committed now. Else `done(None)` once it is committed,
        `done(error)` if it was not, later on the loop."""
        replaced = self._file_replaced()
        if replaced is not None:
            if self.paused is not replaced:
                self._pause(replaced)
            self._later(done, replaced)
            return False
        session_id, started = self.session_id, now()

        def insert(c: sqlite3.Cursor) -> None:
            if cell.rebuild_of is not None:  # a cell `%klbr rebuild` runs again (rare: a statement of its own)
                cur = c.execute(
                    "INSERT INTO cells (session_id, generation, msg_id, client_session, code, status, started,"
                    " rebuild_of) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                    (session_id, cell.generation, cell.msg_id, cell.client_session, cell.code, started,
                     cell.rebuild_of))
                cell.id = cur.lastrowid
                return
            cur = c.execute(
                "INSERT INTO cells (session_id, generation, msg_id, client_session, msg_digest, frontend_cell_id,"
                " code, status, started) VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                (session_id, cell.generation, cell.msg_id, cell.client_session, cell.msg_digest, cell.frontend_cell_id,
                 cell.code, started),
            )
            cell.id = cur.lastrowid

        def committed(error: StoreError | None) -> None:
            if error is None and self.paused is not None:
                self._resumed()
            done(error)

        if self._write(insert, committed, one_statement=True, resuming=True):
            if self.paused is not None:
                self._resumed()
            return True
        return False

    def _resumed(self) -> None:
        """The file takes writes again: the outcomes that could not be recorded meanwhile go first."""
        log.warning("klbr store %s takes writes again: recording resumed", self.path)
        self._pause(None)
        self._retry_owed()
        self.event("store_resumed", {})

    def _retry_owed(self) -> None:
        """Write again each cell outcome whose write failed (its row still says `running`, though its
        frontend got its reply): submitted in the order they were owed, each settling its own debt."""
        owed, self._owed = self._owed, {}
        for record, update in owed.items():
            self._submit(update, self._owing(record, update), resuming=True)

    def _owing(self, record: CellRecord, update: Apply, done: Done | None = None) -> Done:
        """`done`, after noting that `record`'s outcome is owed to the file if its write failed."""
        def landed(error: StoreError | None) -> None:
            if error is None:
                self._owed.pop(record, None)
            else:
                self._owed[record] = update
            if done is not None:
                done(error)
        return landed

    def output(self, cell: CellRecord, msg_type: str, content: Buffer) -> None:
        """Queue one iopub output of `cell` (its content JSON as sent, bytes or a received frame);
        bounded per cell. Past the bound nothing is copied: only the length is counted."""
        with memoryview(content) as view:  # a Buffer need not be Sized: its length is the view's
            size = view.nbytes
        if cell.truncated:
            cell.output_bytes += size
            return
        if cell.output_bytes + size > self.max_output_bytes:
            cell.truncated = True
            cell.output_bytes += size
            return
        cell.output_bytes += size
        cell.seq += 1
        seq = cell.seq
        text = str(content, "utf-8", "replace")  # straight from the frame's buffer

        def insert(c: sqlite3.Cursor) -> None:
            if cell.id is not None:
                c.execute("INSERT INTO outputs (cell_id, seq, msg_type, content) VALUES (?, ?, ?, ?)",
                          (cell.id, seq, msg_type, text))

        self._submit(insert)

    def cell_finished(self, cell: CellRecord, *, status: str, count: int | None, error: str | None,
                      reply: dict[str, Any] | None, generation: int | None, done: Done,
                      memory_peak: int | None = None) -> bool:
        """Record the outcome, with every output before it. True: committed now. Else `done` runs once
        it is committed (or has failed), later on the loop."""
        reply_text = dumps(reply) if reply is not None else None
        finished, output_bytes, truncated = now(), cell.output_bytes, int(cell.truncated)  # as of now

        def update(c: sqlite3.Cursor) -> None:
            if cell.id is None:
                return
            c.execute(
                "UPDATE cells SET status = ?, finished = ?, error = ?, reply = ?, execution_count = ?,"
                " generation = coalesce(?, generation), output_bytes = ?, outputs_truncated = ?, memory_peak = ?"
                " WHERE id = ?",
                (status, finished, error, reply_text, count, generation, output_bytes, truncated, memory_peak,
                 cell.id),
            )

        if self._write(update, self._owing(cell, update, done), one_statement=True):
            self._owed.pop(cell, None)  # an earlier, failed commit of it is not owed any more
            return True
        return False

    def answered(self, cell: CellRecord, *, status: str, count: int | None, error: str, reply: dict[str, Any],
                 outputs: Sequence[tuple[str, dict[str, Any]]] = (), done: Done) -> bool:
        """A cell answered without running (aborted, refused, a `%klbr` line): its row and outputs.
        True: committed now; else `done` runs once it is committed (or has failed), later on the loop."""
        session_id, when = self.session_id, now()
        texts = [(msg_type, dumps(content)) for msg_type, content in outputs]

        def insert(c: sqlite3.Cursor) -> None:
            cur = c.execute(
                "INSERT INTO cells (session_id, generation, msg_id, client_session, msg_digest, frontend_cell_id,"
                " execution_count, code, status, started, finished, error, reply)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, cell.generation, cell.msg_id, cell.client_session, cell.msg_digest, cell.frontend_cell_id,
                 count, cell.code, status,
                 when, when, error or None, dumps(reply)),
            )
            cell.id = cur.lastrowid
            c.executemany("INSERT INTO outputs (cell_id, seq, msg_type, content) VALUES (?, ?, ?, ?)",
                          [(cell.id, seq, t, text) for seq, (t, text) in enumerate(texts, 1)])

        return self._write(insert, done)

    def kv_put(self, scope: str, key: str, value: str, done: Done) -> bool:
        """Keep `value` (JSON text) under `key` in `scope` (a notebook). True: committed now; else
        `done` runs later on the loop, once it is committed or has failed."""
        def upsert(c: sqlite3.Cursor) -> None:
            c.execute("INSERT INTO kv (scope, key, value) VALUES (?, ?, ?)"
                      " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value", (scope, key, value))

        return self._write(upsert, done)

    def notebook_moved(self, old: str | None, new: str) -> None:
        """The notebook this session serves is now at `new` (renamed, moved, saved as): the session is
        filed under it, and the values `host.put` kept under the old path go with it (but for keys
        the new path has already)."""
        session_id = self.session_id

        def move(c: sqlite3.Cursor) -> None:
            c.execute("UPDATE sessions SET notebook = ? WHERE id = ?", (new, session_id))
            if old:
                c.execute("UPDATE OR IGNORE kv SET scope = ? WHERE scope = ?", (new, old))

        self._submit(move)
        self.event("notebook", {"from": old, "to": new})

    def event(self, kind: str, payload: dict[str, Any]) -> None:
        """A durable event: generation starts and ends, interrupts, restarts, placement changes."""
        self._event_seq += 1
        seq, session_id, text, when = self._event_seq, self.session_id, dumps(payload), now()
        self._submit(lambda c: c.execute(
            "INSERT INTO events (session_id, seq, kind, payload, time) VALUES (?, ?, ?, ?, ?)",
            (session_id, seq, kind, text, when)))

    def generation_started(self, number: int, placement: str, identity: dict[str, Any], pid: int | None) -> None:
        session_id, text, started = self.session_id, dumps(identity), now()
        self._submit(lambda c: c.execute(
            "INSERT OR REPLACE INTO generations (session_id, number, placement, identity, pid, started)"
            " VALUES (?, ?, ?, ?, ?, ?)", (session_id, number, placement, text, pid, started)))
        self.event("generation_started", {"generation": number, "pid": pid, "placement": placement})

    def generation_ended(self, number: int, end_reason: str, memory_peak: int | None = None) -> None:
        session_id, ended = self.session_id, now()
        self._submit(lambda c: c.execute(
            "UPDATE generations SET ended = ?, end_reason = ?, memory_peak = ? WHERE session_id = ? AND number = ?",
            (ended, end_reason, memory_peak, session_id, number)))
        self.event("generation_ended", {"generation": number, "reason": end_reason})

    # -- the writer --------------------------------------------------------------------------------

    def _write(self, apply: Apply, done: Done, *, one_statement: bool = False, resuming: bool = False) -> bool:
        """The one owner of a request-path write's outcome. True: committed now on the loop (see
        `Writer.direct`), and `done` is never called. Otherwise `done` runs exactly once, later on
        the loop: None once the writer thread committed it, or the error that rolled it back, which
        pauses the store. A direct commit that failed is reported, never submitted again: the write
        it would repeat was already answered as failed (a cell refused `SessionPaused` must not get
        a `running` row behind its back)."""
        if self._writer is not None:
            ran, cause = self._writer.direct(apply, one_statement=one_statement)
            if ran and cause is None:
                return True
            if ran:
                asyncio.get_running_loop().call_soon(self._report, cause, [done])
                return False
        self._submit(apply, done, resuming=resuming)
        return False

    def _submit(self, apply: Apply, done: Done | None = None, *,
                resuming: bool = False) -> None:
        if self._writer is None or self._writer.closed:
            if done is not None:
                self._later(done, self.unavailable or StoreError(self.path, "the store is closed"))
            return
        if self.paused is not None and not resuming:
            if done is not None:
                self._later(done, self.paused)
            return
        self._writer.submit(apply, done)

    def _report(self, cause: Exception | None, dones: list[Done]) -> None:
        """From the writer, on the loop: what it committed, or the error that rolled it back."""
        failure = StoreError(self.path, cause) if cause is not None else None
        if failure is not None and self.paused is None:
            self._pause(failure)
        for done in dones:
            done(failure)

    def _pause(self, error: StoreError | None) -> None:
        if error is not None:
            # Which write failed (the writer names it), for whoever reads the log after the fact.
            write = getattr(error.cause, "klbr_write", None)
            log.error("klbr store paused: %s%s", error, f" (in {write})" if write else "")
        self.paused = error

    def _file_replaced(self) -> StoreError | None:
        """SQLite keeps writing to a deleted file's inode: notice a deleted or replaced file.

        Looked at no more than every half second; once seen, it stays so for this session.
        """
        now_ = time.monotonic()
        if self._replaced is not None or now_ - self._file_checked < _FILE_CHECK_INTERVAL:
            return self._replaced
        self._file_checked = now_
        try:
            st = os.stat(self.path)
        except OSError as e:
            self._replaced = StoreError(self.path, f"the database file is gone ({e.strerror})")
        else:
            if (st.st_dev, st.st_ino) != self._inode:
                self._replaced = StoreError(self.path, "the database file was replaced")
        return self._replaced
