"""CurveZMQ on the frontend's sockets (issue 15, item 7): jupyter_client's `transport_encryption`
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

from conftest import collect, execute, start_kernel, stream_text

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


def _refused(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    """Wait for the handshake with the kernel to fail, as it does for a peer without CURVE."""
    while True:
        assert monitor.poll(30_000), "the kernel neither refused nor accepted the handshake within 30 s"
        event = recv_monitor_message(monitor)["event"]
        assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED, "a plaintext peer completed the handshake"
        if event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                     zmq.EVENT_DISCONNECTED):
            return


def test_a_plaintext_client_is_refused_and_the_encrypted_one_still_works(encrypted, tmp_path):
    km, kc = encrypted
    marker = tmp_path / "ran-in-plaintext"
    info = km.get_connection_info()
    for name in ("curve_publickey", "curve_secretkey"):
        info.pop(name)
    plain = BlockingKernelClient()
    plain.load_connection_info(info)
    assert plain.curve_publickey is None
    plain.start_channels()
    try:
        monitors = {channel.socket: channel.socket.get_monitor_socket()
                    for channel in (plain.shell_channel, plain.iopub_channel, plain.stdin_channel)}
        plain.execute(f"open({str(marker)!r}, 'w')")
        plain.kernel_info()
        for sock, monitor in monitors.items():
            _refused(sock, monitor)
        with pytest.raises(queue.Empty):
            plain.get_shell_msg(timeout=SILENCE)
        with pytest.raises(queue.Empty):
            plain.get_iopub_msg(timeout=0.1)  # not even an iopub_welcome
        # control and the heartbeat, by raw zmq: no answer either.
        context = zmq.Context.instance()
        for channel, kind, frames in (("control", zmq.DEALER, plain.session.serialize(plain.session.msg(
                "kernel_info_request"))), ("hb", zmq.REQ, [b"ping"])):
            sock = context.socket(kind)
            sock.linger = 0
            monitor = sock.get_monitor_socket()
            sock.connect(f"tcp://{info['ip']}:{info[f'{channel}_port']}")
            sock.send_multipart(frames)
            _refused(sock, monitor)
            assert not sock.poll(int(SILENCE * 1000)), f"a plaintext {channel} peer was answered"
            sock.disable_monitor()
            monitor.close()
            sock.close()
        for sock, monitor in monitors.items():
            sock.disable_monitor()
            monitor.close()
    finally:
        plain.stop_channels()
    reply, outputs = execute(kc, "print('still encrypted')")
    assert reply["content"]["status"] == "ok" and stream_text(outputs) == "still encrypted\n"
    assert not marker.exists()


def test_a_kernel_without_curve_keys_says_its_link_is_plaintext(kernel):
    km, kc = kernel
    assert "curve_secretkey" not in km.get_connection_info()
    assert _status(kc)["encrypted"] == "no: plaintext (the connection file has no curve keys)"
