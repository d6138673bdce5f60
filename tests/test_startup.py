"""Start-up refusals (bad input gets a clear named error): a connection file the kernel cannot
sign with is refused with a message; an empty key is allowed, as jupyter_client allows it, but loudly."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import zmq
from jupyter_client.session import Session

from utils import execute, start_kernel, stream_text


def test_a_signature_scheme_that_is_not_hmac_refuses_to_start(tmp_path):
    for scheme in ("md5", "hmac-nosuchhash"):
        conn = tmp_path / f"kernel-{scheme}.json"
        conn.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2,
                                    "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "secret",
                                    "signature_scheme": scheme}))
        done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn)], check=False, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"signature_scheme {scheme!r}" in done.stderr and "refusing to start" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_connection_file_the_kernel_cannot_read_refuses_to_start_saying_why(tmp_path):
    good = {"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
            "control_port": 4, "hb_port": 5, "key": "secret"}
    for text, words in ((None, "No such file"), ("{not json", "cannot be read"), ("[1, 2]", "not a JSON object"),
                        (json.dumps({**good, "key": 5}), "key is not a string"),
                        (json.dumps({**good, "shell_port": "x"}), "shell_port 'x' is not a port number")):
        conn = tmp_path / "kernel.json"
        conn.unlink(missing_ok=True)
        if text is not None:
            conn.write_text(text)
        done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn)], check=False, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr and "refusing to start" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr


def test_an_empty_key_is_served_with_a_loud_warning(tmp_path):
    log = tmp_path / "kernel.log"
    with start_kernel(manager={"session": Session(key=b"")}, log=log) as (km, kc):
        reply, outputs = execute(kc, "6 * 7")
        assert reply["content"]["status"] == "ok"
        reply, outputs = execute(kc, "%klbr status")
        rows = dict(line.split(None, 1) for line in stream_text(outputs).splitlines())
        assert rows["signed"].startswith("NO: the connection file's key is empty")
    assert "has an empty key: messages are not signed" in log.read_text()


def _refusal(tmp_path, extra: dict, python: list[str] | None = None) -> subprocess.CompletedProcess:
    conn = tmp_path / "kernel.json"
    conn.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2,
                                "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "secret",
                                "signature_scheme": "hmac-sha256", **extra}))
    done = subprocess.run([*(python or [sys.executable, "-m", "klbr_kernel"]), "-f", str(conn)], check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not list(tmp_path.glob("k-*")), "a socket was bound"
    return done


def test_curve_keys_the_kernel_cannot_serve_refuse_to_start(tmp_path):
    public, secret = (key.decode() for key in zmq.curve_keypair())
    other, _ = (key.decode() for key in zmq.curve_keypair())
    assert "carries curve_publickey but no curve_secretkey" in _refusal(tmp_path, {"curve_publickey": public}).stderr
    assert "curve_publickey is not the public key of its curve_secretkey" in _refusal(
        tmp_path, {"curve_publickey": other, "curve_secretkey": secret}).stderr
    assert "curve_secretkey is not a Z85-encoded" in _refusal(
        tmp_path, {"curve_publickey": public, "curve_secretkey": "too short"}).stderr
    # A pyzmq without CURVE (its capability query says so): encryption is asked for, so no plaintext.
    without_curve = ("import runpy, sys, zmq; has = zmq.has; zmq.has = lambda f: f != 'curve' and has(f); "
                     "sys.argv[0] = 'klbr_kernel'; runpy.run_module('klbr_kernel', run_name='__main__')")
    done = _refusal(tmp_path, {"curve_publickey": public, "curve_secretkey": secret},
                    [sys.executable, "-c", without_curve])
    assert "asks for CurveZMQ transport encryption" in done.stderr and "built without CURVE" in done.stderr


def test_a_port_another_process_holds_refuses_the_start_saying_which(tmp_path):
    """jupyter_client picks free ports and writes them into the connection file; one taken before
    the kernel binds it (another process got there first) ends the start with one line naming the
    channel and the address, as a connection file it cannot serve does, not a traceback."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    free = []
    for _ in range(4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free.append(s.getsockname()[1])
    conn = tmp_path / "kernel.json"
    conn.write_text(json.dumps({"transport": "tcp", "ip": "127.0.0.1", "shell_port": free[0], "iopub_port": free[1],
                                "stdin_port": free[2], "control_port": taken, "hb_port": free[3], "key": "secret",
                                "signature_scheme": "hmac-sha256"}))
    try:
        done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn)], capture_output=True,
                              text=True, timeout=120, check=False)
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    assert f"control cannot be bound at tcp://127.0.0.1:{taken}" in done.stderr, done.stderr
    assert "refusing to start" in done.stderr and "Traceback" not in done.stderr, done.stderr
