"""Floods with a client that reads as fast as it can: 1 GiB of prints, and
display() calls by the ten thousand. The client reads iopub through a raw socket of its own
(jupyter_client's full decoding of every message would make the client the thing measured).

`make test` makes 20 000 display() calls; ``KLBR_THOROUGH=1`` makes 200 000 (plain
ipykernel itself takes about 5 minutes for those here: IPython's display machinery, not the wire).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import zmq
from jupyter_client.session import Session

from utils import execute, raw_socket, start_kernel


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


class Reader(threading.Thread):
    """Reads every iopub message about one request as it comes: counts them and their stream text,
    and stops at its idle."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.msg_id = None
        self.started = threading.Event()
        self.idle = threading.Event()
        self.types: dict[str, int] = {}
        self.text_bytes = 0
        self.last_display = None

    def run(self) -> None:
        self.started.set()
        while not self.idle.is_set():
            if not self.sock.poll(120_000):
                return
            frames = self.sock.recv_multipart(copy=False)
            i = next(n for n, f in enumerate(frames) if f.bytes == b"<IDS|MSG>")
            header, parent = json.loads(frames[i + 2].bytes), json.loads(frames[i + 3].bytes)
            if self.msg_id is None or parent.get("msg_id") != self.msg_id:
                continue
            kind = header["msg_type"]
            self.types[kind] = self.types.get(kind, 0) + 1
            if kind == "stream":
                self.text_bytes += len(json.loads(frames[i + 5].bytes)["text"])
            elif kind == "display_data":
                self.last_display = json.loads(frames[i + 5].bytes)["data"]["text/plain"]
            elif kind == "status" and json.loads(frames[i + 5].bytes)["execution_state"] == "idle":
                self.idle.set()


def _flood(tmp_path, code: str, timeout: float = 600):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        execute(kc, "pass")
        kernel_pid = km.provisioner.process.pid
        # No receive limit: the client's queue holds whatever its reader has not taken yet, so the
        # kernel never sees a slow reader (set after the connect, it would leave the pipe at 1000).
        with raw_socket(km, "iopub", options={zmq.RCVHWM: 0}) as (sock, _):
            reader = Reader(sock)
            reader.start()
            reader.started.wait()
            execute(kc, "'subscribed'")  # the raw socket's subscription is in place before the flood
            kc.iopub_channel.stop()  # the one reader is the raw socket (a client that reads nothing
            # would be a stalled frontend: tests/test_outbox.py)
            reader.msg_id = kc.execute(code)
            reply = kc.get_shell_msg(timeout=timeout)
            assert reply["parent_header"]["msg_id"] == reader.msg_id
            assert reader.idle.wait(timeout), "the idle never came"
        peak = _peak_rss_mib(kernel_pid)
        # A client of its own session: one more km.client() would restart the same session's msg_id
        # count, and an execute whose (session, msg_id) was taken is answered from the record.
        after = km.client(session=Session(key=km.session.key, signature_scheme=km.session.signature_scheme))
        after.start_channels()
        try:
            after.wait_for_ready(timeout=60)
            assert execute(after, "6 * 7")[0]["content"]["status"] == "ok"  # it keeps serving
        finally:
            after.stop_channels()
    return reply, reader, peak


def test_a_gib_of_prints_keeps_the_proxy_small_and_everything_arrives(tmp_path):
    writes = 16384  # of 64 KiB
    reply, reader, peak = _flood(tmp_path, f"import sys\nchunk = 'x' * 65536\nfor _ in range({writes}):\n"
                                           "    sys.stdout.write(chunk)\nsys.stdout.flush()")
    assert reply["content"]["status"] == "ok"
    assert reader.text_bytes == writes * 65536, "every byte reached a client that reads"
    assert reader.types["stream"] >= 512, "the worker flushed by size, not in one message"
    assert peak < 300, f"the proxy peaked at {peak:.0f} MiB"
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    status, truncated = db.execute("SELECT status, outputs_truncated FROM cells ORDER BY id DESC LIMIT 1 OFFSET 1").fetchone()
    assert status == "ok" and truncated > 0, "the log keeps its bounded share, and says what it dropped"


DISPLAYS = 200_000 if os.environ.get("KLBR_THOROUGH") else 20_000


def test_display_calls_by_the_ten_thousand_arrive_complete(tmp_path):
    reply, reader, _ = _flood(tmp_path, f"from IPython.display import display\nfor i in range({DISPLAYS}):\n    display(i)",
                              timeout=1800)
    assert reply["content"]["status"] == "ok"
    assert reader.types.get("display_data") == DISPLAYS and reader.last_display == str(DISPLAYS - 1)
