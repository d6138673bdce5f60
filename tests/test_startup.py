"""Start-up refusals (DESIGN.md: bad input gets a clear error): a connection file the kernel cannot
sign with is refused with a message; an empty key is allowed, as jupyter_client allows it, but loudly."""

from __future__ import annotations

import json
import subprocess
import sys

from jupyter_client.session import Session

from conftest import execute, start_kernel, stream_text


def test_a_signature_scheme_that_is_not_hmac_refuses_to_start(tmp_path):
    for scheme in ("md5", "hmac-nosuchhash"):
        conn = tmp_path / f"kernel-{scheme}.json"
        conn.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2,
                                    "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "secret",
                                    "signature_scheme": scheme}))
        done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"signature_scheme {scheme!r}" in done.stderr and "refusing to start" in done.stderr
        assert "Traceback" not in done.stderr


def test_an_empty_key_is_served_with_a_loud_warning(tmp_path):
    log = tmp_path / "kernel.log"
    with start_kernel(manager={"session": Session(key=b"")}, log=log) as (km, kc):
        reply, outputs = execute(kc, "6 * 7")
        assert reply["content"]["status"] == "ok"
        reply, outputs = execute(kc, "%klbr status")
        rows = dict(line.split(None, 1) for line in stream_text(outputs).splitlines())
        assert rows["signed"].startswith("NO: the connection file's key is empty")
    assert "has an empty key: messages are not signed" in log.read_text()
