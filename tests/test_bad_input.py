"""Bad input gets dropped or a named error, is logged, and loses nothing: the kernel keeps serving."""

from __future__ import annotations

import json

from jupyter_client.session import Session

from utils import execute, raw_socket, receive, results


def test_bad_signature_and_malformed_frames_are_dropped(kernel):
    km, kc = kernel
    with raw_socket(km, "shell") as (sock, session):
        msg = session.msg("execute_request", {"code": "evil = 1", "silent": False})
        frames = session.serialize(msg)
        frames[1] = b"0" * 64  # wrong HMAC
        sock.send_multipart(frames)
        sock.send_multipart([b"no delimiter at all"])
        sock.send_multipart([b"<IDS|MSG>", b"sig", b"{not json"])
        forged = Session(key=b"another key").serialize(Session(key=b"another key").msg("kernel_info_request"))
        sock.send_multipart(forged)
        assert not sock.poll(500), "nothing answers a message that failed verification"
    reply, outputs = execute(kc, "'evil' in globals()")
    assert reply["content"]["status"] == "ok"
    assert results(outputs) == ["False"]


def test_a_replayed_request_is_dropped_as_jupyter_client_drops_it(kernel):
    """Byte-identical frames (same signature) are a replay: answered once. Executes are the exception,
    answered from the record (test_store), so a reconnecting client is not left waiting."""
    km, kc = kernel
    with raw_socket(km, "shell") as (sock, session):
        msg = session.msg("is_complete_request", {"code": "x = ("})
        frames = session.serialize(msg)
        sock.send_multipart(frames)
        sock.send_multipart(frames)
        assert receive(sock, session, timeout=5)["content"]["status"] == "incomplete"
        assert not sock.poll(1000), "a replay got a second reply"
    reply, _ = execute(kc, "1 + 1")
    assert reply["content"]["status"] == "ok"


def test_signed_but_undecodable_content_gets_a_named_error(kernel):
    km, kc = kernel
    with raw_socket(km, "shell") as (sock, session):
        msg = session.msg("execute_request", {})
        header, parent, metadata = (session.pack(msg[k]) for k in ("header", "parent_header", "metadata"))
        content = b"[1, 2"  # signed, but not JSON
        sock.send_multipart([b"<IDS|MSG>", session.sign([header, parent, metadata, content]), header, parent, metadata, content])
        reply = receive(sock, session, timeout=5)
        assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "InvalidMessage"
    reply, _ = execute(kc, "1 + 1")
    assert reply["content"]["status"] == "ok"


def test_unknown_message_types_get_busy_and_idle_and_no_reply(kernel):
    km, kc = kernel
    msg = kc.session.msg("no_such_request", {})
    kc.shell_channel.send(msg)
    states = []
    while len(states) < 2:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg["header"]["msg_id"] and m["msg_type"] == "status":
            states.append(m["content"]["execution_state"])
    assert states == ["busy", "idle"]
    reply, _ = execute(kc, "2")
    assert reply["content"]["status"] == "ok"


def test_subshell_requests_get_error_replies(kernel):
    km, kc = kernel
    msg = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=10)
    assert reply["msg_type"] == "create_subshell_reply"
    assert reply["content"]["status"] == "error"
    kc.kernel_info()
    info = kc.get_shell_msg(timeout=10)["content"]
    assert "kernel subshells" not in info["supported_features"]
    assert info["implementation"] == "klbr"
    assert json.dumps(info["language_info"])


def test_requests_a_worker_would_choke_on_get_a_named_error(kernel):
    """ipykernel logs an exception and never replies to an execute whose code is not a string."""
    km, kc = kernel
    for msg_type, content in [("execute_request", {"code": 123}), ("complete_request", {"code": "pri"}),
                              ("inspect_request", {"code": "x", "cursor_pos": "end"}),
                              ("execute_request", {"code": "1", "silent": "no"}),
                              ("execute_request", {"code": "1", "user_expressions": None})]:
        msg = kc.session.msg(msg_type, content)
        kc.shell_channel.send(msg)
        reply = kc.get_shell_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "InvalidMessage"
    reply, _ = execute(kc, "1 + 1")
    assert reply["content"]["status"] == "ok"
