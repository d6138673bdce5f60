"""One kernel session toward the frontend, and nothing of the workers' own lifecycle leaks."""

from __future__ import annotations

import time

import zmq
from jupyter_client.session import Session

from conftest import execute, start_kernel


def test_every_message_carries_one_session_across_generations():
    with start_kernel() as (km, kc):
        execute(kc, "print('one')")
        execute(kc, "import os; os.kill(os.getpid(), 9)")  # a new generation
        execute(kc, "print('two')")
        kc.complete("pri", 3)
        kc.inspect("print", 5)
        sessions, types = set(), []
        deadline = time.monotonic() + 2
        for channel in (kc.iopub_channel, kc.shell_channel):
            while time.monotonic() < deadline:
                try:
                    msg = channel.get_msg(timeout=0.5)
                except Exception:
                    break
                sessions.add(msg["header"]["session"])
                types.append((msg["msg_type"], msg["content"].get("execution_state")))
    assert len(sessions) == 1, sessions
    assert ("status", "starting") not in types
    assert ("status", "restarting") not in types
    assert ("status", "dead") not in types


def test_a_late_subscriber_gets_the_proxys_own_welcome_only(kernel):
    km, kc = kernel
    info = km.get_connection_info()
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.linger = 0
    sock.connect(f"{info['transport']}://{info['ip']}:{info['iopub_port']}")
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    session = Session(key=info["key"], signature_scheme=info["signature_scheme"])
    try:
        assert sock.poll(5000)
        idents, frames = session.feed_identities(sock.recv_multipart())
        welcome = session.deserialize(frames)
        assert welcome["msg_type"] == "iopub_welcome"
        execute(kc, "1")
        welcomes = 0
        while sock.poll(300):
            idents, frames = session.feed_identities(sock.recv_multipart())
            msg = session.deserialize(frames)
            welcomes += msg["msg_type"] == "iopub_welcome"
        assert welcomes == 0, "no worker iopub_welcome reaches the frontend"
    finally:
        sock.close()


def test_the_kernel_serves_over_ipc_too(tmp_path):
    from jupyter_client.manager import KernelManager

    from conftest import execute

    km = KernelManager(kernel_name="klbr", transport="ipc", ip=str(tmp_path / "klbr-ipc"))
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply, outputs = execute(kc, "print('over ipc')")
        assert reply["content"]["status"] == "ok"
        assert [m["content"]["text"] for m in outputs if m["msg_type"] == "stream"] == ["over ipc\n"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
