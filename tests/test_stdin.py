"""stdin relayed both ways: input(), getpass (never echoed back), and an interrupt during input()."""

from __future__ import annotations

from conftest import collect, execute


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
