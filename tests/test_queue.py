"""The proxy owns the queue: order, stop_on_error, and aborts, as ipykernel does."""

from __future__ import annotations

import time

from klbr_kernel.requests.queue import ShellQueue
from klbr_kernel.requests.request import Request
from klbr_supervisor.messages.wire import Wire
from utils import execute


def _req(msg_type: str, n: int, **content) -> Request:
    return Request("shell", Wire([], [], {"msg_type": msg_type, "msg_id": f"m{n}"}, {}), content)


def test_error_aborts_only_the_executes_waiting_behind_it():
    q = ShellQueue()
    failing = _req("execute_request", 0)
    waiting = [_req("execute_request", 1), _req("complete_request", 2), _req("execute_request", 3)]
    for r in [failing, *waiting]:
        q.push(r)
    assert q.take() is failing
    assert q.take() is None  # one in flight
    aborted = q.finish(failing, "error")
    assert aborted == [waiting[0], waiting[2]]
    assert q.take() is waiting[1]


def test_stop_on_error_false_and_silent_errors_abort_nothing():
    for failing in (_req("execute_request", 0, stop_on_error=False), _req("execute_request", 0, silent=True)):
        q = ShellQueue()
        q.push(failing)
        q.push(_req("execute_request", 1))
        q.take()
        assert q.finish(failing, "error") == []
        assert q.take().msg_id == "m1"


def _send_many(kc, codes, **kw):
    ids = [kc.execute(code, **kw) for code in codes]
    replies = {}
    deadline = time.monotonic() + 120
    while len(replies) < len(ids):
        msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        replies.setdefault(msg["parent_header"]["msg_id"], []).append((len(replies), msg))
    return ids, replies


def test_200_requests_at_once_are_answered_in_order(kernel):
    km, kc = kernel
    codes = [f"{i} * 2" for i in range(200)]
    ids, replies = _send_many(kc, codes)
    assert all(len(replies[i]) == 1 for i in ids), "every request answered exactly once"
    order = sorted(ids, key=lambda i: replies[i][0][0])
    assert order == ids
    counts = [replies[i][0][1]["content"]["execution_count"] for i in ids]
    assert counts == list(range(counts[0], counts[0] + 200))


def test_an_error_aborts_the_queued_executes(kernel):
    km, kc = kernel
    codes = ["a = 1", "raise ValueError('stop here')", "a = 2", "a = 3"]
    ids, replies = _send_many(kc, codes)
    statuses = [replies[i][0][1]["content"]["status"] for i in ids]
    assert statuses == ["ok", "error", "aborted", "aborted"]
    # The aborted cells did not run; later cells do.
    reply, outputs = execute(kc, "a")
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["1"]


def test_stop_on_error_false_runs_the_queued_executes(kernel):
    km, kc = kernel
    codes = ["a = 1", "raise ValueError('keep going')", "a = 2", "a = 3"]
    ids, replies = _send_many(kc, codes, stop_on_error=False)
    statuses = [replies[i][0][1]["content"]["status"] for i in ids]
    assert statuses == ["ok", "error", "ok", "ok"]


def test_aborted_requests_get_busy_and_idle(kernel):
    km, kc = kernel
    ids, replies = _send_many(kc, ["raise ValueError()", "1", "2"])
    seen: dict[str, list[str]] = {i: [] for i in ids}
    deadline = time.monotonic() + 30
    while any(seen[i].count("idle") < 1 for i in ids):
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") in seen:
            seen[msg["parent_header"]["msg_id"]].append(msg["content"]["execution_state"])
    assert all(states == ["busy", "idle"] for states in seen.values()), seen
