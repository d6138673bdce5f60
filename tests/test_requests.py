"""A request's life as a state machine, walked without a kernel: every move goes through one door
that refuses what the machine does not allow."""

from __future__ import annotations

import pytest

from klbr_kernel.requests import TRANSITIONS, IllegalMove, Phase, Request
from klbr_supervisor.wire import Wire


def _req(msg_type: str = "execute_request") -> Request:
    return Request("shell", Wire([], [], {"msg_type": msg_type, "msg_id": "m1"}, {}), {"code": "1"})


@pytest.mark.parametrize("path", [
    ["RECORDING", "SENT", "ANSWERED", "DONE"],  # a recorded cell the worker answers
    ["SENT", "ANSWERED", "DONE"],  # a completion, a comm message
    ["PROXY", "ANSWERED", "DONE"],  # a %klbr cell
    ["ANSWERED", "DONE"],  # refused, aborted, or history from the cell log
    ["SENT", "QUEUED", "SENT", "ANSWERED", "DONE"],  # retried once after a loss
    ["RECORDING", "QUEUED", "SENT", "ANSWERED", "DONE"],  # its generation ended while its row committed
    ["RECORDING", "ANSWERED", "DONE"],  # the row could not be written: SessionPaused
])
def test_the_lives_a_request_can_have(path):
    req = _req()
    for phase in path:
        req.move(Phase[phase])
    assert req.phase is Phase.DONE


@pytest.mark.parametrize("start, to", [
    ("QUEUED", "DONE"),  # nothing reaches the frontend without an answer first
    ("SENT", "RECORDING"),  # a row is written before the worker sees the cell, never after
    ("PROXY", "SENT"),  # a %klbr cell never goes to a worker
    ("PROXY", "QUEUED"),  # nor is it retried
    ("ANSWERED", "SENT"),  # an answered request is never sent again (no replay)
    ("ANSWERED", "QUEUED"),
    ("DONE", "ANSWERED"),  # nor answered twice
    ("DONE", "QUEUED"),
])
def test_illegal_moves_are_refused(start, to):
    req = _req()
    req.phase = Phase[start]
    with pytest.raises(IllegalMove):
        req.move(Phase[to])
    assert req.phase is Phase[start]


def test_done_is_the_only_end_and_every_phase_can_reach_it():
    assert TRANSITIONS[Phase.DONE] == frozenset()
    for phase in Phase:
        seen, todo = set(), [phase]
        while todo:
            p = todo.pop()
            seen.add(p)
            todo += [q for q in TRANSITIONS[p] if q not in seen]
        assert Phase.DONE in seen, f"{phase} cannot be answered"


def test_which_requests_expect_a_reply_from_the_worker():
    assert _req("execute_request").expects_reply
    assert _req("complete_request").expects_reply
    assert not _req("comm_msg").expects_reply
    control = Request("control", Wire([], [], {"msg_type": "debug_request", "msg_id": "d"}, {}))
    assert control.expects_reply
    assert not Request("control", Wire([], [], {"msg_type": "abort_request", "msg_id": "a"}, {})).expects_reply
