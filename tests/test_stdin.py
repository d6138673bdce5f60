"""stdin relayed both ways: input(), getpass (never echoed back), and an interrupt during input()."""

from __future__ import annotations

import time

from utils import collect, execute, misbehaving, raw_socket, receive, results, start_kernel, until


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
    assert results(outputs) == ["('klbr', 7)"]


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
    assert results(outputs) == ["'still here'"]


def test_input_reaches_the_frontend_when_the_workers_stdin_binds_last():
    # The worker answers on shell half a second before it binds stdin: readiness waits for stdin's
    # connection too, else the input_request is dropped by the worker's ROUTER and the cell hangs.
    with misbehaving("late-stdin") as (_, kc):
        msg_id = kc.execute("answer = input('ready? ')", allow_stdin=True)
        request = kc.get_stdin_msg(timeout=10)
        assert request["content"]["prompt"] == "ready? "
        kc.input("yes")
        reply, _ = collect(kc, msg_id)
        assert reply["content"]["status"] == "ok"


def test_input_waits_for_a_stdin_that_connects_late(tmp_path):
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=["--KlbrKernelApp.log_level=INFO"], stdin=False, log=log) as (km, kc):
        msg_id = kc.execute("late = input('late? ')", allow_stdin=True)
        # The worker has asked, and nobody could hear it: the kernel says so in its log.
        until(lambda: "has no stdin connected yet" in log.read_text(), 10, "the input_request found no stdin")
        with raw_socket(km, "stdin", identity=kc.session.bsession) as (stdin, session):  # as jupyter_client's own
            request = receive(stdin, session, timeout=5)
            assert request["msg_type"] == "input_request"
            assert request["parent_header"]["msg_id"] == msg_id
            session.send(stdin, "input_reply", {"value": "on time"}, parent=request["header"])
            reply, _ = collect(kc, msg_id)
            assert reply["content"]["status"] == "ok"
            reply, outputs = execute(kc, "late")
            assert results(outputs) == ["'on time'"]


def test_input_without_a_stdin_channel_ends_in_eoferror_not_a_hang():
    with start_kernel(stdin=False) as (_, kc):
        started = time.monotonic()
        reply, outputs = execute(kc, "input('anyone? ')", allow_stdin=True, timeout=30)
        assert time.monotonic() - started < 20
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "EOFError"
        stderr = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
        assert "no stdin channel connected" in stderr and "Give the value another way" in stderr, stderr
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["status"] == "ok"
