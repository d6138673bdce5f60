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

from utils import cpu_burners, execute, raw_socket, start_kernel


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
        self.welcomed = threading.Event()  # a message came: this socket's subscription is in place
        self.idle = threading.Event()
        self.types: dict[str, int] = {}
        self.text_bytes = 0
        self.last_display = None
        self.chunks: list[int] = []  # the numbers of the flood's chunks, as they arrived
        self.notice: str | None = None  # the proxy's word on outputs it could not deliver
        self.unaligned = 0  # stream messages of the flood that began or ended inside a chunk

    def run(self) -> None:
        self.started.set()
        while not self.idle.is_set():
            if not self.sock.poll(120_000):
                return
            frames = self.sock.recv_multipart(copy=False)
            i = next(n for n, f in enumerate(frames) if f.bytes == b"<IDS|MSG>")
            header, parent = json.loads(frames[i + 2].bytes), json.loads(frames[i + 3].bytes)
            self.welcomed.set()
            if self.msg_id is None or parent.get("msg_id") != self.msg_id:
                continue
            kind = header["msg_type"]
            self.types[kind] = self.types.get(kind, 0) + 1
            if kind == "stream":
                content = json.loads(frames[i + 5].bytes)
                if content["name"] == "stderr" and content["text"].startswith("klbr: "):
                    self.notice = content["text"]
                    continue
                text = content["text"]
                self.text_bytes += len(text)
                # whole chunks only: a flush sends what whole writes left, never part of one
                numbers = [text[at:at + 8] for at in range(0, len(text), CHUNK)]
                self.chunks += [int(n) for n in numbers if n.isdigit()]
                self.unaligned += sum(1 for n in numbers if not n.isdigit()) + (len(text) % CHUNK > 0)
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
            # A SUB socket receives nothing until its subscription has reached the kernel (ZMQ's "slow
            # joiner"): the kernel greets each subscription (JEP 65 iopub_welcome), and anything
            # received means this one is in place. Before, the test only ran a cell through another
            # client's sockets, and under load the flood's busy and first outputs went out before the
            # raw socket's subscription had come (2 runs in about 15).
            assert reader.welcomed.wait(60), "the kernel never greeted the raw socket's subscription"
            kc.iopub_channel.stop()  # the one reader is the raw socket (a client that reads nothing
            # would be a stalled frontend: tests/test_outbox.py)
            # The reader knows the request before it is sent: its first outputs may come before an
            # execute() call returns to this thread (a loaded machine), and would not count as its.
            msg = kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                     "user_expressions": {}, "allow_stdin": kc.allow_stdin,
                                                     "stop_on_error": True})
            reader.msg_id = msg["header"]["msg_id"]
            kc.shell_channel.send(msg)
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


CHUNK = 65536  # characters of each write of the flood, its number first


def test_a_gib_of_prints_keeps_the_proxy_small_and_loses_nothing_silently(tmp_path):
    """1 GiB of prints to a client that reads as fast as it can. On an idle machine it keeps up and
    gets every byte; on a busy one the flood can outrun it, and past the outbox's bound the oldest
    outputs waiting for it are dropped (the proxy stays small): then it is told how many, and what
    it got is in order, with each gap a run of whole outputs it was told of."""
    writes = 16384  # of 64 KiB
    reply, reader, peak = _flood(tmp_path, f"import sys\nfor i in range({writes}):\n"
                                           f"    sys.stdout.write(f'{{i:08d}}' + 'x' * {CHUNK - 8})\nsys.stdout.flush()")
    assert reply["content"]["status"] == "ok"
    assert reader.unaligned == 0, "an output held part of a write"
    assert reader.chunks == sorted(set(reader.chunks)), "outputs arrived once each, in order"
    missing = sorted(set(range(writes)) - set(reader.chunks))
    if reader.notice is None:
        assert not missing and reader.text_bytes == writes * CHUNK, "every byte reached a client that reads"
    else:
        told = int(reader.notice.split()[1])
        assert "the cell log kept this cell's outputs up to its size limit" in reader.notice, reader.notice
        gaps = sum(1 for n, chunk in enumerate(missing) if n == 0 or missing[n - 1] != chunk - 1)
        assert gaps <= told <= len(missing), f"told of {told} outputs, {len(missing)} chunks in {gaps} gaps missing"
        assert reader.text_bytes == (writes - len(missing)) * CHUNK
    assert reader.types["stream"] >= 512 or reader.notice, "the worker flushed by size, not in one message"
    print(f"{reader.types.get('stream', 0)} stream messages, the proxy peaked at {peak:.0f} MiB")
    assert peak < 300, f"the proxy peaked at {peak:.0f} MiB"
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    status, truncated = db.execute("SELECT status, outputs_truncated FROM cells ORDER BY id DESC LIMIT 1 OFFSET 1").fetchone()
    assert status == "ok" and truncated > 0, "the log keeps its bounded share, and says what it dropped"


DISPLAYS = 200_000 if os.environ.get("KLBR_THOROUGH") else 20_000


def test_display_calls_by_the_ten_thousand_arrive_complete_on_a_loaded_machine(tmp_path):
    """Every display arrives, busy first, or the cell says how many did not (the outbox's bound),
    with two CPU-burning loops beside the kernel and its reader."""
    with cpu_burners(2):
        reply, reader, _ = _flood(tmp_path, f"from IPython.display import display\nfor i in range({DISPLAYS}):\n"
                                            "    display(i)", timeout=1800)
    assert reply["content"]["status"] == "ok"
    assert reader.types.get("status") == 2, f"busy and idle, once each: {reader.types}"
    displays = reader.types.get("display_data", 0)
    told = int(reader.notice.split()[1]) if reader.notice else 0
    assert displays + told == DISPLAYS, f"{displays} displays arrived, {told} told of, of {DISPLAYS}"
    assert reader.last_display == str(DISPLAYS - 1)
