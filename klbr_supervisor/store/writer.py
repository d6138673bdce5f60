"""How the store's writes reach the file: one thread, in order, and the loop's direct commit.

A write is a callable `apply(cursor)`, given its connection's one cursor. Queued writes are
batched into one transaction by the writer thread; `report(failure, dones)` then runs on the event
loop (`failure` is the sqlite3 or OS error that rolled the batch back, or None). When nothing is
queued or being written, `direct` commits on the loop instead (no thread handoff on the request
path) and returns the outcome to its caller,
with a connection that never waits for another kernel's lock and never checkpoints: the thread
folds the WAL back every `CHECKPOINT_EVERY` direct commits, so no cell waits for a checkpoint's copy
and sync.

Threading rule: a write runs on one thread at a time, in the order it was submitted (the writer
thread, or the loop under the writer's lock), and reads nothing but what was captured when the loop
submitted it and the row ids earlier writes set on their records; its outcome reaches the loop as
`direct`'s return value or as a `report` that runs later, never as a call back into the submitter.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

# A write gets its connection's one cursor: `Connection.execute` makes a cursor per call (~4k
# instructions, twice per cell, made and freed). What it returns is ignored.
Apply = Callable[[sqlite3.Cursor], object]
# What the submitter wants called once its write is committed: the writer only hands it back to `report`.
D = TypeVar("D")
Report = Callable[[Exception | None, list[D]], None]


class _Signal(Enum):
    """Queued between writes: the thread stops, or folds the WAL back."""

    STOP = "stop"
    CHECKPOINT = "checkpoint"

_BATCH = 1000
CHECKPOINT_EVERY = 200


def _commit(cursor: sqlite3.Cursor, applies: Iterable[Apply]) -> Exception | None:
    """Apply in one transaction (already begun); the error that rolled it back, or None."""
    conn = cursor.connection
    apply = None
    try:
        for apply in applies:
            apply(cursor)
        apply = None
        conn.execute("COMMIT")
        return None
    except (sqlite3.Error, OSError) as e:
        # For the log: which write failed (the store reads it back with getattr).
        e.klbr_write = apply.__qualname__ if apply is not None else "COMMIT"  # type: ignore[union-attr]
        try:
            conn.execute("ROLLBACK")  # an I/O error may leave the transaction open
        except sqlite3.Error:
            pass
        return e


def _alone(cursor: sqlite3.Cursor, apply: Apply) -> Exception | bool | None:
    """Apply one statement, which commits by itself (autocommit: no BEGIN and COMMIT around it).
    False: not applied, the file is another connection's to write now (busy); else as `_commit`."""
    conn = cursor.connection
    try:
        apply(cursor)
        return None
    except sqlite3.OperationalError as e:
        if e.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY and not conn.in_transaction:
            return False  # the statement was rolled back whole: nothing of it was applied
        failure: Exception = e
    except (sqlite3.Error, OSError) as e:
        failure = e
    failure.klbr_write = apply.__qualname__  # type: ignore[attr-defined]  # for the log, as `_commit`
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
    return failure


class Writer(Generic[D]):
    """Owns both connections once the store is open; `close` ends the thread, which closes its own."""

    def __init__(self, conn: sqlite3.Connection, direct_conn: sqlite3.Connection, report: Report[D]):
        """`conn` is the thread's; `direct_conn` the loop's (busy_timeout 0, wal_autocheckpoint 0)."""
        self._conn = conn
        self._direct_conn = direct_conn
        self._cursor = conn.cursor()  # the thread's
        self._direct_cursor = direct_conn.cursor()  # the loop's
        self._report = report
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[tuple[Apply, D | None] | _Signal] = queue.SimpleQueue()
        self._lock = threading.Lock()  # held while either side writes
        self._submitted = 0  # items queued (loop thread only)
        self._committed = 0  # items applied (writer thread only)
        self._direct_commits = 0
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="klbr-store", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing submitted is waiting or being written (read on the loop)."""
        return self._submitted == self._committed

    def submit(self, apply: Apply, done: D | None) -> None:
        self._submitted += 1
        self._queue.put((apply, done))

    def direct(self, apply: Apply, *, one_statement: bool = False) -> tuple[bool, Exception | None]:
        """Commit `apply` now, on the loop, if that keeps the order of writes: nothing is queued or
        being written, and no other kernel holds the file's write lock. (False, None): not done,
        submit it instead; (True, failure): done, `failure` the error that rolled it back, or None.
        `one_statement`: `apply` runs one SQL statement (or none), which commits by itself: a
        transaction around it would only add a BEGIN and a COMMIT to every cell's two writes."""
        # acquire(False), not blocking=False: the lock parses a keyword the slow way (~1k instructions).
        if self.closed or self._submitted != self._committed or not self._lock.acquire(False):
            return False, None
        try:
            if self._submitted != self._committed:  # the writer took an item meanwhile
                return False, None
            if one_statement:
                alone = _alone(self._direct_cursor, apply)
                if alone is False:
                    return False, None  # busy: the writer thread waits for the lock instead
                failure = alone if isinstance(alone, Exception) else None
            else:
                try:
                    self._direct_conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError:
                    return False, None  # busy: the writer thread waits for the lock instead
                failure = _commit(self._direct_cursor, [apply])
        finally:
            self._lock.release()
        self._direct_commits += 1
        if self._direct_commits % CHECKPOINT_EVERY == 0:
            self._queue.put(_Signal.CHECKPOINT)
        return True, failure

    def close(self, wait: float) -> None:
        """Write what is queued and stop the thread (once, at shutdown), waiting up to `wait` seconds:
        more than a write can take (the busy timeout), so no connection is closed under a write."""
        self.closed = True
        self._queue.put(_Signal.STOP)
        self._thread.join(timeout=wait)
        if self._thread.is_alive():
            log.error("klbr store: the writer did not finish within %.0f s; its last writes may be lost", wait)
        self._direct_conn.close()

    def _run(self) -> None:
        """The writer thread: batches what is queued into one transaction, then reports back."""
        try:
            self._serve()
        finally:
            self._conn.close()

    def _serve(self) -> None:
        conn = self._conn
        while True:
            item = self._queue.get()
            if item is _Signal.STOP:
                return
            if item is _Signal.CHECKPOINT:
                self._checkpoint()
                continue
            batch = [item]
            stop = checkpoint = False
            while len(batch) < _BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _Signal.STOP:
                    stop = True
                    break
                if item is _Signal.CHECKPOINT:
                    checkpoint = True
                    continue
                batch.append(item)
            with self._lock:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    failure = _commit(self._cursor, [apply for apply, _ in batch])
                except (sqlite3.Error, OSError) as e:
                    failure = e
                self._committed += len(batch)
            dones = [done for _, done in batch if done is not None]
            if failure is not None or dones:
                try:
                    self._loop.call_soon_threadsafe(self._report, failure, dones)
                except RuntimeError:
                    return  # the loop is closed: the kernel is exiting
            if checkpoint:
                self._checkpoint()
            if stop:
                return

    def _checkpoint(self) -> None:
        """Fold the WAL back into the file, off the loop; readers and writers are never blocked."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as e:
            log.debug("klbr store checkpoint skipped: %s", e)
