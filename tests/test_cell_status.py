"""A cell's status in the log says what klbr knows of it, never what its error is called: a cell may
raise a `WorkerLost` of its own, or a `KeyboardInterrupt` nobody sent (docs/store-schema.md, the cell statuses)."""

from __future__ import annotations

import os
import signal
import sqlite3

from klbr_kernel.requests.outcomes import ERRORS
from utils import collect, execute, start_kernel, wait_for_stream, worker_pid


def _status(db, reply: dict) -> str:
    """cells.status of the cell `reply` answers."""
    (status,) = sqlite3.connect(db).execute("SELECT status FROM cells WHERE msg_id = ?",
                                            (reply["parent_header"]["msg_id"],)).fetchone()
    return status


def _running(kc, code: str) -> str:
    """Start `code`, which prints before it waits, and return its msg_id once it runs."""
    msg_id = kc.execute(code)
    wait_for_stream(kc, msg_id)
    return msg_id


# Every error name klbr answers with (docs/errors.md).
KLBR_NAMES = ["WorkerLost", "WorkerKilled", "CellTimeout", "PlacementLost", "CrashLoop", "InternalError",
              "WorkerStartFailed", "PoisonedCell", "SessionPaused", "RebuildFailed"]


def test_a_cells_own_errors_are_errors_whatever_their_names(tmp_path):
    assert set(ERRORS) <= set(KLBR_NAMES) | {"KeyboardInterrupt"}
    db = tmp_path / "log.sqlite3"
    recorded = {}
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        for name in [*KLBR_NAMES, "KeyboardInterrupt", "CancelledError"]:
            code = f"raise {name}('mine')" if name == "KeyboardInterrupt" else \
                f"class {name}(Exception):\n    pass\nraise {name}('mine')"
            reply, _ = execute(kc, code)
            assert (reply["content"]["ename"], reply["content"]["evalue"]) == (name, "mine")
            recorded[name] = _status(db, reply)
        reply, _ = execute(kc, "1 + 1")  # nothing was taken for a loss or a refusal
        assert reply["content"]["status"] == "ok" and _status(db, reply) == "ok"
    assert recorded == dict.fromkeys(recorded, "error")


def test_a_worker_really_lost_is_lost(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        reply, _ = execute(kc, "import os\nos._exit(3)")
        assert reply["content"]["ename"] == "WorkerLost" and _status(db, reply) == "lost"
        pid = worker_pid(kc)
        msg_id = _running(kc, "import time\nprint('running', flush=True)\ntime.sleep(60)")
        os.kill(pid, signal.SIGKILL)
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "WorkerLost" and _status(db, reply) == "lost"


def test_only_an_interrupt_klbr_delivered_is_interrupted(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        msg_id = _running(kc, "import time\nprint('running', flush=True)\ntime.sleep(60)")
        km.interrupt_kernel()  # an interrupt_request: the kernelspec's interrupt_mode is message
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt" and _status(db, reply) == "interrupted"
        msg_id = _running(kc, "print('running', flush=True)\ntime.sleep(60)")
        os.kill(km.provisioner.process.pid, signal.SIGINT)
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt" and _status(db, reply) == "interrupted"
        reply, _ = execute(kc, "raise KeyboardInterrupt")  # after an interrupt: nothing was sent for this one
        assert reply["content"]["ename"] == "KeyboardInterrupt" and _status(db, reply) == "error"
        # A cell that awaits is cancelled by the interrupt: interrupted too, its namespace kept.
        msg_id = _running(kc, "import asyncio\nprint('running', flush=True)\nawait asyncio.sleep(60)")
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["ename"] == "CancelledError" and _status(db, reply) == "interrupted"


def test_a_deadline_is_timeout_unless_the_cell_caught_its_interrupt(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        reply, _ = execute(kc, "%%klbr timeout=1\nimport time\ntime.sleep(60)")
        assert reply["content"]["ename"] == "CellTimeout" and _status(db, reply) == "timeout"
        # The deadline's interrupt, caught: the cell ended as it chose, and that is its outcome.
        reply, _ = execute(kc, "%%klbr timeout=1\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                               "    print('caught')\n'went on'")
        assert reply["content"]["status"] == "ok" and _status(db, reply) == "ok"
        # A cell that awaits, cancelled by the deadline's interrupt: a timeout, the namespace kept.
        pid = worker_pid(kc)
        reply, _ = execute(kc, "%%klbr timeout=1\nimport asyncio\nawait asyncio.sleep(60)")
        assert reply["content"]["ename"] == "CellTimeout" and _status(db, reply) == "timeout"
        assert "interrupted" in reply["content"]["evalue"] and worker_pid(kc) == pid
