"""CurveZMQ on the frontend's sockets: jupyter_client's `transport_encryption`
starts the klbr kernelspec with curve keys in the connection file, and the whole session runs
encrypted; a client that does not speak CURVE gets nothing answered, on any socket, while the
encrypted one carries on.

A kernel started without curve keys serves plaintext, as before: every other test module does that
(`tests/test_session.py`, for one, runs its whole session on a plaintext kernel).
"""

from __future__ import annotations

import queue

import pytest
import zmq
from jupyter_client.blocking import BlockingKernelClient
from zmq.utils.monitor import recv_monitor_message

from utils import collect, execute, start_kernel, stream_text

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="this pyzmq has no CURVE")

# What a plaintext peer is given to show that it is ignored: a bound, not a synchronisation (the
# handshake failure it waits for first is the event that says the kernel refused it).
SILENCE = 3.0


@pytest.fixture(scope="module")
def encrypted():
    with start_kernel(manager={"transport_encryption": "required"}) as (km, kc):
        yield km, kc


def _status(kc) -> dict[str, str]:
    reply, outputs = execute(kc, "%klbr status")
    assert reply["content"]["status"] == "ok", reply["content"]
    return dict(line.split(None, 1) for line in stream_text(outputs).splitlines())


def test_the_kernelspec_offers_curve_and_the_connection_file_carries_keys(encrypted):
    km, kc = encrypted
    assert "curve" in km.kernel_spec.metadata["supported_encryption"]
    info = km.get_connection_info()
    assert info["curve_publickey"] and info["curve_secretkey"]
    assert kc.curve_publickey == info["curve_publickey"].encode()


def test_an_encrypted_session_runs_cells_input_interrupts_and_heartbeats(encrypted):
    km, kc = encrypted
    reply, outputs = execute(kc, "print('over curve'); 6 * 7")
    assert reply["content"]["status"] == "ok"
    assert stream_text(outputs) == "over curve\n"
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["42"]

    # stdin: input() is asked and answered over the encrypted stdin channel.
    msg_id = kc.execute("print('got', input('name? '))", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=30)
    assert request["content"]["prompt"] == "name? "
    kc.input("curvy")
    reply, outputs = collect(kc, msg_id)
    assert reply["content"]["status"] == "ok" and "got curvy" in stream_text(outputs)

    # control: the manager's interrupt_request (interrupt_mode "message") goes over encrypted control.
    msg_id = kc.execute("import time; print('sleeping', flush=True); time.sleep(120)")
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    km.interrupt_kernel()
    reply, outputs = collect(kc, msg_id, timeout=60)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"

    assert kc.hb_channel.is_beating()
    assert kc.is_alive()
    assert _status(kc)["encrypted"] == "yes, CurveZMQ on shell, control, stdin, iopub and heartbeat"


def _refused(url: str, kind: int, frames: list[bytes]) -> zmq.Socket:
    """A plaintext socket of `kind` that connects to `url` and sends `frames`: wait for the kernel
    to refuse its handshake (libzmq does not try again after that), and give it back."""
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    monitor = sock.get_monitor_socket()  # before the connect: the refusal comes at once, and once
    try:
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(url)
        if frames:
            sock.send_multipart(frames)
        while True:
            assert monitor.poll(30_000), "the kernel neither refused nor accepted the handshake within 30 s"
            event = recv_monitor_message(monitor)["event"]
            assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED, "a plaintext peer completed the handshake"
            if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                return sock
    finally:
        sock.disable_monitor()
        monitor.close()


def test_a_plaintext_client_is_refused_and_the_encrypted_one_still_works(encrypted, tmp_path):
    km, kc = encrypted
    marker = tmp_path / "ran-in-plaintext"
    info = km.get_connection_info()
    for name in ("curve_publickey", "curve_secretkey"):
        info.pop(name)
    plain = BlockingKernelClient()
    plain.load_connection_info(info)
    assert plain.curve_publickey is None
    session = plain.session
    execute_request = session.serialize(session.msg("execute_request", {
        "code": f"open({str(marker)!r}, 'w')", "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}))
    sent = {"shell": (zmq.DEALER, execute_request),
            "control": (zmq.DEALER, session.serialize(session.msg("kernel_info_request"))),
            "stdin": (zmq.DEALER, session.serialize(session.msg("input_reply", {"value": "x"}))),
            "iopub": (zmq.SUB, []), "hb": (zmq.DEALER, [b"ping"])}
    sockets = [_refused(f"tcp://{info['ip']}:{info[f'{channel}_port']}", kind, frames)
               for channel, (kind, frames) in sent.items()]
    try:
        # jupyter_client's own client, in plaintext: not even kernel_info is answered. Its shell
        # socket may find no connection to queue the request on (libzmq drops one whose handshake
        # failed until it reconnects): a send that waited forever there is not a kernel's doing.
        plain.start_channels()
        plain.shell_channel.socket.setsockopt(zmq.SNDTIMEO, 1000)
        try:
            plain.kernel_info()
        except zmq.Again:
            pass  # nothing took it: refused all the same
        with pytest.raises(queue.Empty):
            plain.get_shell_msg(timeout=SILENCE)
        with pytest.raises(queue.Empty):
            plain.get_iopub_msg(timeout=0.1)  # not even an iopub_welcome
        assert not any(sock.poll(0) for sock in sockets), "a plaintext peer was answered"
    finally:
        plain.stop_channels()
        for sock in sockets:
            sock.close()
    reply, outputs = execute(kc, "print('still encrypted')")
    assert reply["content"]["status"] == "ok" and stream_text(outputs) == "still encrypted\n"
    assert not marker.exists()
    assert kc.is_alive()


def test_a_kernel_without_curve_keys_says_its_link_is_plaintext(kernel):
    km, kc = kernel
    assert "curve_secretkey" not in km.get_connection_info()
    assert _status(kc)["encrypted"] == "no: plaintext (the connection file has no curve keys)"
