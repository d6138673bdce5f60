"""The door: a message the worker could not read is answered by the proxy, never forwarded, and
never costs the kernel its queue (an unanswered request would hold every shell request behind it:
semantics 1). Each case is followed by a cell that works.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from klbr_kernel.proxy.delivery import GRACE_CHECK, NO_REPLY_GRACE
from utils import (
    collect,
    drain,
    execute,
    misbehaving,
    raw_socket,
    receive,
    results,
    said,
    send_raw,
    start_kernel,
    status_row,
)

OLDEST = Path(__file__).parent.parent / ".venv-ipykernel" / "bin" / "python"  # `python:`'s interpreter


def _still_serving(kc) -> None:
    reply, outputs = execute(kc, "6 * 7", timeout=60)
    assert reply["content"]["status"] == "ok"
    assert results(outputs) == ["42"]


def _error_reply(sock, session, msg_id, ename="InvalidMessage") -> dict:
    reply = receive(sock, session)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == ename, reply["content"]
    return reply


def test_an_execute_whose_msg_id_is_a_list_is_answered_before_and_after_the_first_worker_is_ready():
    # The late-stdin worker is ready half a second after it starts serving: the first execute waits
    # in the queue for it. A list msg_id there used to raise in the supervisor's task: the kernel exited.
    with misbehaving("late-stdin") as (km, kc), raw_socket(km, "shell") as (sock, session):
        for _ in range(2):  # queued before the first generation is ready, then with it ready
            bad = ["a", "list"]
            send_raw(sock, session, "execute_request", {"code": "x = 1"}, msg_id=bad)
            _error_reply(sock, session, bad)
            _still_serving(kc)


@pytest.mark.parametrize("case", ["metadata is a list", "metadata is not JSON", "no version", "version 4",
                                  "a date that does not parse", "cursor_pos past the code",
                                  "an unknown history access", "a subshell_id"])
def test_what_the_worker_would_drop_is_answered_by_the_proxy(kernel, case):
    km, kc = kernel
    with raw_socket(km, "shell") as (sock, session):
        ename = "SubshellsNotSupported" if case == "a subshell_id" else "InvalidMessage"
        msg_type, content = "execute_request", {"code": "ran = True"}
        if case == "cursor_pos past the code":
            msg_type, content = "complete_request", {"code": "pri", "cursor_pos": 99}
        elif case == "an unknown history access":
            msg_type, content = "history_request", {"hist_access_type": "bogus"}
        msg = session.msg(msg_type, content)
        if case == "metadata is a list":
            msg["metadata"] = []
        elif case == "no version":
            del msg["header"]["version"]
        elif case == "version 4":
            msg["header"]["version"] = "4.1"
        elif case == "a date that does not parse":
            msg["header"]["date"] = "2026-13-45T25:61:00Z"
        elif case == "a subshell_id":
            msg["header"]["subshell_id"] = "s1"
        frames = session.serialize(msg)
        if case == "metadata is not JSON":
            parts = frames[2:6]
            parts[2] = b"{not json"
            frames[1:6] = [session.sign(parts), *parts]
        sock.send_multipart(frames)
        _error_reply(sock, session, msg["header"]["msg_id"], ename)
    _still_serving(kc)
    _, outputs = execute(kc, "'ran' in globals()")
    assert results(outputs) == ["False"]


def test_a_header_past_any_use_is_dropped_and_the_kernel_keeps_serving(kernel):
    km, kc = kernel
    with raw_socket(km, "shell") as (sock, session):
        send_raw(sock, session, "x" * 10_000, {})
        send_raw(sock, session, "execute_request", {"code": "ran = True"}, msg_type=["execute_request"])
        _still_serving(kc)
        # Replies on one socket come in the order the proxy sent them: anything it sent for the two
        # would come before this one's reply, however slow it was.
        asked = send_raw(sock, session, "kernel_info_request", {})
        reply = receive(sock, session, timeout=30)
        assert reply["parent_header"]["msg_id"] == asked["header"]["msg_id"], \
            f"nothing answers a message with no usable type, yet {reply['msg_type']} came"
    # Dropped, both: neither answered nor sent on to a worker (which would drop it without a word).
    assert status_row(kc, "dropped").startswith("2 messages from the frontend, 0 more answered with an error")
    _, outputs = execute(kc, "'ran' in globals()")
    assert results(outputs) == ["False"]


def test_only_input_replies_go_to_the_worker_on_stdin(kernel):
    km, kc = kernel
    with raw_socket(km, "stdin") as (sock, session):
        send_raw(sock, session, "execute_request", {"code": "ran = True"})
    _still_serving(kc)
    _, outputs = execute(kc, "'ran' in globals()")
    assert results(outputs) == ["False"]


def test_a_replayed_execute_on_control_runs_once():
    """Byte-identical frames on control, as on shell, are answered from the first, not run again."""
    with start_kernel() as (km, kc):
        execute(kc, "runs = 0")
        with raw_socket(km, "control") as (sock, session):
            msg = session.msg("execute_request", {"code": "runs += 1\nruns", "silent": False, "store_history": True,
                                                  "user_expressions": {}, "allow_stdin": False})
            frames = session.serialize(msg)
            sock.send_multipart(frames)
            sock.send_multipart(frames)
            replies = [receive(sock, session), receive(sock, session)]
        assert {r["parent_header"]["msg_id"] for r in replies} == {msg["header"]["msg_id"]}
        assert [r["content"]["status"] for r in replies] == ["ok", "ok"]
        assert len({json.dumps(r["content"], sort_keys=True) for r in replies}) == 1
        _, outputs = execute(kc, "runs")
        assert results(outputs) == ["1"]


def test_a_request_the_worker_drops_is_answered_after_its_idle():
    """ipykernel logs an exception in a handler and never replies; the proxy replies instead."""
    with misbehaving("drops-is-complete") as (km, kc):
        start = time.monotonic()
        msg_id = kc.is_complete("x = (")
        reply, outputs = collect(kc, msg_id, timeout=NO_REPLY_GRACE + 20)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "InternalError"
        user, detail = said(reply["content"]["evalue"])
        assert user.startswith("The worker finished this is_complete_request without replying to it, so klbr answers "
                               "in its place; its outputs were kept, and the kernel keeps serving."), user
        assert detail == f"It was still silent {NO_REPLY_GRACE:g} s after going idle.", detail
        assert time.monotonic() - start >= NO_REPLY_GRACE
        assert [m["content"]["execution_state"] for m in outputs if m["msg_type"] == "status"] == ["busy", "idle"]
        _still_serving(kc)


def test_a_request_whose_idle_never_comes_is_closed_after_its_reply():
    """A worker that replies and never goes idle (its iopub lost the idle): the proxy closes the
    bracket itself, once, after the grace; the queue behind it goes on."""
    with misbehaving("drops-idle") as (km, kc):
        start = time.monotonic()
        msg_id = kc.is_complete("x = 1")
        reply, outputs = collect(kc, msg_id, timeout=NO_REPLY_GRACE + 20)
        assert reply["content"]["status"] == "complete"  # the worker's own reply
        assert time.monotonic() - start >= NO_REPLY_GRACE
        assert [m["content"]["execution_state"] for m in outputs if m["msg_type"] == "status"] == ["busy", "idle"]
        # Once: the grace timer's next look (a second later) finds it answered.
        later = drain(kc.iopub_channel, quiet=GRACE_CHECK + 1)
        assert not [m for m in later if m["parent_header"].get("msg_id") == msg_id], later
        _still_serving(kc)


def test_integers_past_64_bits_reach_the_worker_exactly():
    """A client's metadata and content go to the worker as they were sent: an integer JSON allows
    but 64 bits do not hold stays that integer (a fast parser's float would be another value). The
    worker is a `python:` one whose jupyter_client parses with the standard library: one with orjson
    installed makes such an integer a float itself, as it would under plain ipykernel."""
    big = 2**70 + 1
    with start_kernel(extra_arguments=[f"--Supervisor.placement=python:{OLDEST}"]) as (km, kc):
        msg = kc.session.msg("execute_request", {
            "code": "parent = get_ipython().kernel.get_parent()\nseen = parent['metadata']['big']",
            "silent": False, "store_history": True, "allow_stdin": False, "stop_on_error": True,
            "user_expressions": {"n": f"{big} + 0"}}, metadata={"big": big})
        kc.shell_channel.send(msg)
        reply, _ = collect(kc, msg["header"]["msg_id"], timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert reply["content"]["user_expressions"]["n"]["data"]["text/plain"] == str(big)
        assert results(execute(kc, "seen")[1]) == [str(big)]
