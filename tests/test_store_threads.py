"""The store's threading rule, on a real SQLite file without a kernel: a write reads what was true
when it was submitted, its callback runs later on the loop, and no connection closes under a write."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from klbr_supervisor.store import CellRecord, Store


@pytest.fixture
def store_path(tmp_path, monkeypatch):
    monkeypatch.delenv("KLBR_DB", raising=False)  # the run's database would override the path
    return tmp_path / "log.sqlite3"


def _open(path) -> Store:
    store = Store(path=str(path))
    assert store.open(uuid="session-uuid", notebook=None, kernel=None)
    return store


def _started(store: Store, loop) -> tuple[CellRecord, asyncio.Future]:
    record = CellRecord("m1", "client", "print(1)", 1)
    done = loop.create_future()
    if store.cell_started(record, done.set_result):
        done.set_result(None)  # durable at once: no callback comes
    return record, done


def _rows(path) -> list[str]:
    return [r[0] for r in sqlite3.connect(path).execute("SELECT status FROM cells")]


def test_a_write_is_durable_when_the_call_says_so_and_otherwise_called_back_later(store_path):
    """A commit the loop makes itself is durable when the call returns True, and no callback comes;
    one that waits for the writer thread calls back later on the loop, never inside the call."""
    async def main():
        loop = asyncio.get_running_loop()
        store = _open(store_path)
        calls = []
        record = CellRecord("m1", "client", "print(1)", 1)
        assert store.cell_started(record, calls.append), "the writer was idle: committed on the loop"
        assert _rows(store_path) == ["running"]  # durable, read from another connection
        release = threading.Event()
        store._writer.submit(lambda conn: release.wait(10), None)  # the writer is busy now
        finished = loop.create_future()
        assert not store.cell_finished(record, status="ok", count=1, error=None, reply={"status": "ok"},
                                       generation=1, done=finished.set_result)
        assert not finished.done(), "called back inside cell_finished"
        release.set()
        assert await asyncio.wait_for(finished, 10) is None
        await asyncio.sleep(0)
        assert calls == [], "the commit that was durable at once called back too"
        store.close()

    asyncio.run(main())
    assert _rows(store_path) == ["ok"]


def test_an_outcome_records_the_outputs_counted_when_it_was_submitted(store_path):
    """The outcome of a cell is queued behind a slow write; an output counted after it was submitted
    must not leak into it (the writer thread used to read the loop's live counters)."""
    async def main():
        loop = asyncio.get_running_loop()
        store = _open(store_path)
        record, done = _started(store, loop)
        await asyncio.wait_for(done, 10)
        store.output(record, "stream", b'{"name": "stdout", "text": "before\\n"}')
        bytes_at_reply = record.output_bytes
        release = threading.Event()
        store._writer.submit(lambda conn: release.wait(10), None)  # the writer is busy
        finished = loop.create_future()
        assert not store.cell_finished(record, status="ok", count=1, error=None, reply={"status": "ok"},
                                       generation=1, done=finished.set_result)
        store.output(record, "stream", b'{"name": "stdout", "text": "after the reply\\n"}')
        assert record.output_bytes > bytes_at_reply
        release.set()
        await asyncio.wait_for(finished, 10)
        store.close()
        return bytes_at_reply

    expected = asyncio.run(main())
    (recorded,) = sqlite3.connect(store_path).execute("SELECT output_bytes FROM cells").fetchone()
    assert recorded == expected


def test_close_waits_for_a_write_that_waits_for_another_kernels_lock(store_path):
    """Another kernel holds the write lock for longer than the old 5 s close: the write still lands."""
    async def main():
        store = _open(store_path)
        other = sqlite3.connect(store_path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        threading.Timer(5.5, lambda: other.execute("COMMIT")).start()
        store.event("written_while_another_kernel_held_the_lock", {})
        store.close()  # returns once the write is done, within the busy timeout
        other.close()

    asyncio.run(main())
    kinds = [r[0] for r in sqlite3.connect(store_path).execute("SELECT kind FROM events")]
    assert "written_while_another_kernel_held_the_lock" in kinds


def test_a_cell_that_finds_another_kernels_lock_waits_for_it_on_the_writer(store_path):
    """The loop writes a cell's row without waiting for any lock: while another kernel holds the
    file's write lock, the call says not yet, and the row lands once the lock is let go."""
    async def main():
        loop = asyncio.get_running_loop()
        store = _open(store_path)
        other = sqlite3.connect(store_path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        record = CellRecord("m1", "client", "print(1)", 1)
        done = loop.create_future()
        committed_now = store.cell_started(record, done.set_result)
        assert _rows(store_path) == []
        other.execute("COMMIT")
        error = await asyncio.wait_for(done, timeout=60)
        store.close()
        other.close()
        return committed_now, error, record.id

    committed_now, error, cell_id = asyncio.run(main())
    assert (committed_now, error) == (False, None)
    assert cell_id is not None
    assert _rows(store_path) == ["running"]


async def _settled(store: Store) -> None:
    """Once every write submitted so far is committed (or has failed)."""
    future = asyncio.get_running_loop().create_future()
    if not store.settled(lambda error: future.done() or future.set_result(error)):
        await asyncio.wait_for(future, 10)


def _refusing_writes(store: Store, refusing: bool) -> None:
    """The loop's own connection refuses writes (SQLite's read-only mode for one connection): its
    direct commits fail as a full or read-only file makes them fail, while the writer thread's still
    write."""
    store._writer._direct_conn.execute(f"PRAGMA query_only = {int(refusing)}")


def test_a_direct_commit_that_fails_is_answered_once_and_not_written_behind_the_answer(store_path):
    """The loop's commit of a cell's `running` row fails: its caller hears so once (and answers the
    cell SessionPaused), and the write is not submitted again behind that answer (it used to be,
    leaving a `running` row for a cell that never ran, and calling back a second time)."""
    async def main():
        loop = asyncio.get_running_loop()
        store = _open(store_path)
        _refusing_writes(store, True)
        calls: list = []
        record = CellRecord("m1", "client", "print(1)", 1)
        assert not store.cell_started(record, calls.append)
        await _settled(store)
        for _ in range(3):  # any second call would come on a later turn of the loop
            await asyncio.sleep(0)
        paused = store.paused
        store.close()
        return calls, paused

    calls, paused = asyncio.run(main())
    assert len(calls) == 1 and calls[0] is not None and "readonly" in str(calls[0]), calls
    assert paused is calls[0]
    assert _rows(store_path) == [], "no row for a cell answered SessionPaused"


def test_an_outcome_that_could_not_be_written_is_written_when_the_store_resumes(store_path):
    """A cell's outcome fails to commit (its frontend gets its reply all the same): its row would stay
    `running`, and a later kernel would call it `unknown`. Once the file takes writes again, the
    outcome is written, before the cells after it."""
    async def main():
        loop = asyncio.get_running_loop()
        store = _open(store_path)
        first, started = _started(store, loop)
        assert await asyncio.wait_for(started, 10) is None
        _refusing_writes(store, True)
        finished = loop.create_future()
        assert not store.cell_finished(first, status="ok", count=1, error=None, reply={"status": "ok"},
                                       generation=1, done=finished.set_result)
        assert await asyncio.wait_for(finished, 10) is not None, "the caller hears of the failure"
        assert store.paused is not None and _rows(store_path) == ["running"]
        _refusing_writes(store, False)
        second, started = _started(store, loop)
        assert await asyncio.wait_for(started, 10) is None
        assert store.paused is None, "resumed"
        await _settled(store)
        store.close()

    asyncio.run(main())
    assert _rows(store_path) == ["ok", "running"]
