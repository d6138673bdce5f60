"""stdin relayed both ways: input(), getpass (never echoed back), and an interrupt during input()."""

from __future__ import annotations

import time

import zmq
from conftest import collect, execute, misbehaving, start_kernel


def test_input_and_getpass_round_trip(kernel):
    km, kc = kernel
    msg_id = kc.execute("name = input('name? ')", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=10)
    assert request["msg_type"] == "input_request"
    assert request["content"] == {"prompt": "name? ", "password": False}
    assert request["parent_header"]["msg_id"] == msg_id
    kc.input("klbr")
    reply, _ = collect(kc, msg_id)
    assert reply["content"]["status"] == "ok"

    msg_id = kc.execute("import getpass; secret = getpass.getpass('pw: ')", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=10)
    assert request["content"]["password"] is True
    kc.input("hunter2")
    reply, outputs = collect(kc, msg_id)
    assert reply["content"]["status"] == "ok"
    assert "hunter2" not in str(outputs)

    reply, outputs = execute(kc, "name, len(secret)")
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["('klbr', 7)"]


def test_interrupt_during_input_keeps_the_namespace(kernel):
    km, kc = kernel
    execute(kc, "kept = 'still here'")
    msg_id = kc.execute("answer = input('waiting: ')", allow_stdin=True)
    kc.get_stdin_msg(timeout=10)
    km.interrupt_kernel()
    reply, outputs = collect(kc, msg_id, timeout=10)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    reply, outputs = execute(kc, "kept")
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["'still here'"]


def test_input_reaches_the_frontend_when_the_workers_stdin_binds_last():
    # A worker answers on shell before the supervisor's stdin has connected to it: readiness waits
    # for stdin too, else the input_request is dropped by the worker's ROUTER and the cell hangs.
    with misbehaving("late-stdin") as (_, kc):
        msg_id = kc.execute("answer = input('ready? ')", allow_stdin=True)
        request = kc.get_stdin_msg(timeout=10)
        assert request["content"]["prompt"] == "ready? "
        kc.input("yes")
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["status"] == "ok"


def test_input_waits_for_a_stdin_that_connects_late():
    with start_kernel(stdin=False) as (km, kc):
        msg_id = kc.execute("late = input('late? ')", allow_stdin=True)
        time.sleep(1)  # the worker has asked by now, and nobody could hear it
        stdin = zmq.Context.instance().socket(zmq.DEALER)
        stdin.setsockopt(zmq.IDENTITY, kc.session.bsession)  # as jupyter_client's own stdin
        stdin.connect(f"tcp://{km.ip}:{km.stdin_port}")
        try:
            assert stdin.poll(5000), "the input_request never came"
            _, request = kc.session.recv(stdin)
            assert request["msg_type"] == "input_request"
            assert request["parent_header"]["msg_id"] == msg_id
            kc.session.send(stdin, "input_reply", {"value": "on time"}, parent=request["header"])
            reply, _ = collect(kc, msg_id)
            assert reply["content"]["status"] == "ok"
            reply, outputs = execute(kc, "late")
            assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["'on time'"]
        finally:
            stdin.close(linger=0)


def test_input_without_a_stdin_channel_ends_in_eoferror_not_a_hang():
    with start_kernel(stdin=False) as (_, kc):
        started = time.monotonic()
        reply, outputs = execute(kc, "input('anyone? ')", allow_stdin=True, timeout=30)
        assert time.monotonic() - started < 20
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "EOFError"
        stderr = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
        assert "no stdin channel connected" in stderr
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["status"] == "ok"
