"""The proxy alone, in-process, between a stand-in frontend and a stand-in supervisor
(tests/harness.py): the races of delivery and of a generation's end, each set up message by
message, in milliseconds. What a real kernel does with the same races is in test_generations.py,
test_door.py and test_resend.py; here each order is played on purpose.
"""

from __future__ import annotations

import asyncio

import pytest

import klbr_kernel.proxy.delivery as delivery
from harness import proxy
from klbr_supervisor.policy import Refusal
from klbr_supervisor.states import EndReason

BRACKET = [("iopub", "status"), ("shell", "execute_reply"), ("iopub", "status")]


def _run(main) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.fixture
def tmp_path(tmp_path, monkeypatch):
    """The test's directory, where its cell log is: the run's own database would override the path."""
    monkeypatch.delenv("KLBR_DB", raising=False)
    return tmp_path


@pytest.mark.parametrize("idle_first", [False, True], ids=["reply-first", "idle-first"])
def test_a_cells_reply_and_idle_go_out_once_each_after_its_outcome_is_committed(tmp_path, idle_first):
    """Semantics 1 and 3, whichever of the worker's reply and idle comes first: the frontend sees
    busy, the reply and idle once each, and the row says `ok` when the reply is seen."""
    async def main():
        async with proxy(tmp_path) as h:
            msg = h.execute("1")
            status_at_reply = []
            h.frontend.on_event = lambda event: event[1] == "execute_reply" and status_at_reply.append(
                h.row(msg)["status"])
            h.worker.runs(msg, 1)
            if idle_first:
                h.worker.idle(msg)
                h.worker.reply(msg, {"status": "ok", "execution_count": 1})
            else:
                h.worker.reply(msg, {"status": "ok", "execution_count": 1})
                h.worker.idle(msg)
            await h.settled()
            seen = [kind for kind in h.frontend.seen(msg) if kind[1] in ("status", "execute_reply")]
            assert sorted(seen) == sorted(BRACKET) and seen[0] == ("iopub", "status")
            assert status_at_reply == ["ok"]
    _run(main)


def test_an_output_between_the_reply_and_the_idle_is_committed_before_the_idle_goes_out(tmp_path):
    async def main():
        async with proxy(tmp_path) as h:
            msg = h.execute("print('late')")
            outputs_at_idle = []
            h.frontend.on_event = lambda event: (event[1] == "status" and event[3]["execution_state"] == "idle"
                                                 and outputs_at_idle.append(h.row(msg)["output_bytes"]))
            h.worker.runs(msg, 1)
            h.worker.reply(msg, {"status": "ok", "execution_count": 1})
            h.worker.stream(msg, "late\n")  # on iopub, after the reply on shell
            h.worker.idle(msg)
            await h.settled()
            assert outputs_at_idle and outputs_at_idle[0] > 0
            assert h.frontend.seen(msg)[-1] == ("iopub", "status")
    _run(main)


def test_a_worker_lost_after_its_reply_keeps_that_reply_and_gets_the_proxys_idle(tmp_path):
    """The generation ends between the reply and the idle: the worker's reply stands as the only
    one, no WorkerLost is made up for it, and the proxy closes the bracket."""
    async def main():
        async with proxy(tmp_path) as h:
            msg = h.execute("1")
            h.worker.runs(msg, 1)
            h.worker.reply(msg, {"status": "ok", "execution_count": 1})
            h.supervisor.end(EndReason.LOST)
            await h.settled()
            assert h.frontend.seen(msg) == [*BRACKET[:1], ("iopub", "execute_input"), *BRACKET[1:]]
            assert [c["status"] for c in h.frontend.contents(msg, "execute_reply")] == ["ok"]
            assert h.row(msg)["status"] == "ok" and not h.supervisor.called_back
    _run(main)


def test_a_worker_lost_mid_cell_answers_it_aborts_what_waits_and_calls_nothing_back(tmp_path):
    """The running cell is answered WorkerLost, the one queued behind it aborted (semantics 1, 2,
    11), while the supervisor hands over: the proxy calls nothing of it meanwhile. The next
    generation runs what comes after."""
    async def main():
        async with proxy(tmp_path) as h:
            running, queued = h.execute("crash()"), h.execute("after = 1")
            h.worker.runs(running, 1, "working\n")
            h.supervisor.end(EndReason.LOST)
            await h.settled()
            assert not h.supervisor.called_back
            (lost,) = h.frontend.contents(running, "execute_reply")
            assert lost["ename"] == "WorkerLost" and "killed by signal 9 (SIGKILL)" in lost["evalue"]
            assert [c["status"] for c in h.frontend.contents(queued, "execute_reply")] == ["aborted"]
            assert (h.row(running)["status"], h.row(queued)["status"]) == ("lost", "aborted")
            h.supervisor.ready()
            msg = h.execute("2")
            await h.settled()
            assert h.supervisor.sent[-1] == ("shell", "execute_request", msg["header"]["msg_id"])
    _run(main)


def test_a_crash_loop_told_with_the_end_refuses_what_is_queued_without_asking(tmp_path):
    async def main():
        async with proxy(tmp_path) as h:
            running, queued = h.execute("crash()", stop_on_error=False), h.execute("x = 1")
            h.worker.runs(running, 1)
            h.supervisor.end(EndReason.LOST, refusal=Refusal("crash_loop", 5, 300.0))
            await h.settled()
            assert not h.supervisor.called_back
            (refused,) = h.frontend.contents(queued, "execute_reply")
            assert refused["ename"] == "CrashLoop" and h.row(queued)["status"] == "refused"
            assert h.supervisor.started == 0  # no generation asked for: the user says what next
    _run(main)


def test_an_idempotent_request_in_flight_is_sent_once_more_with_one_bracket(tmp_path):
    """Semantics 8: a completion whose worker was lost before replying goes to the next generation;
    the frontend sees one busy, one reply, one idle for it."""
    async def main():
        async with proxy(tmp_path) as h:
            msg = h.request("complete_request", {"code": "imp", "cursor_pos": 3})
            await h.settled()
            h.worker.busy(msg)
            h.supervisor.end(EndReason.LOST)
            h.supervisor.ready()
            await h.settled()
            assert [s[1] for s in h.supervisor.sent].count("complete_request") == 2
            h.worker.busy(msg)
            h.worker.reply(msg, {"status": "ok", "matches": ["import"], "cursor_start": 0, "cursor_end": 3,
                                 "metadata": {}})
            h.worker.idle(msg)
            await h.settled()
            assert h.frontend.seen(msg) == [("iopub", "status"), ("shell", "complete_reply"), ("iopub", "status")]
    _run(main)


def test_a_worker_idle_without_a_reply_is_answered_once_the_grace_is_over(tmp_path, monkeypatch):
    """ipykernel drops what its handler raised on: the proxy replies InternalError in its place,
    once, after the grace (shortened here: the timer is the loop's)."""
    monkeypatch.setattr(delivery, "NO_REPLY_GRACE", 0.02)
    monkeypatch.setattr(delivery, "GRACE_CHECK", 0.01)

    async def main():
        async with proxy(tmp_path) as h:
            msg = h.execute("1")
            replied = asyncio.Event()
            h.frontend.on_event = lambda event: event[1] == "execute_reply" and replied.set()
            h.worker.runs(msg, 1)
            h.worker.idle(msg)
            await replied.wait()  # the grace's own timer, on the loop, answers it
            await h.settled()
            (reply,) = h.frontend.contents(msg, "execute_reply")
            assert reply["ename"] == "InternalError" and h.row(msg)["status"] == "error"
            assert h.frontend.seen(msg).count(("iopub", "status")) == 2
    _run(main)


def test_an_execute_sent_again_while_it_runs_gets_its_reply_and_no_second_bracket(tmp_path):
    """Semantics 9: the same message again, while the first runs, is not run again; it gets the
    first one's reply when that comes, and the frontend has one busy/idle pair for the msg_id."""
    async def main():
        async with proxy(tmp_path) as h:
            msg = h.execute("x = 1")
            h.worker.runs(msg, 1)
            h.request("execute_request", {}, msg=msg)
            h.worker.reply(msg, {"status": "ok", "execution_count": 1})
            h.worker.idle(msg)
            await h.settled()
            assert [s[1] for s in h.supervisor.sent].count("execute_request") == 1
            assert [c["status"] for c in h.frontend.contents(msg, "execute_reply")] == ["ok", "ok"]
            assert h.frontend.seen(msg).count(("iopub", "status")) == 2
    _run(main)


def test_the_stand_in_supervisor_takes_what_the_real_one_takes():
    """The harness's supervisor is called as the proxy calls the real one: a method whose parameters
    drift (a new keyword the proxy passes) would fail every test here with an InternalError."""
    import inspect  # noqa: PLC0415

    import harness  # noqa: PLC0415
    from klbr_supervisor.supervisor import Supervisor  # noqa: PLC0415

    for name, method in vars(harness.Supervisor).items():
        real = getattr(Supervisor, name, None)
        if name.startswith("_") or not callable(method) or not callable(real):
            continue
        assert list(inspect.signature(method).parameters) == list(inspect.signature(real).parameters), name
