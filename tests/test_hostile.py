"""Hostile frames on every socket: whatever reaches shell, control, stdin or iopub,
the kernel answers what it must, drops the rest, counts what it drops and logs it at a bounded rate,
never runs a signed execute twice, and the next normal cell works.

The header and content variants are drawn by hypothesis, against one kernel that all of the module's
examples share. `make test` runs about 300 examples, derandomized (the same ones every run), and the
replay checks at full scale. For 25 times as many examples, new ones each run, and a replay
after 70 000 executes:

    KLBR_THOROUGH=1 .venv/bin/python -m pytest -m thorough tests/test_hostile.py

(without KLBR_THOROUGH the `thorough` tests skip, and the rest run with their `make test` counts).
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session

from utils import execute, raw_socket, receive, results, said, start_kernel, stream_text, thorough, until

DELIM = b"<IDS|MSG>"
MiB = 1 << 20

# Message types a frontend sends, and a few that no kernel knows.
TYPES = ["execute_request", "kernel_info_request", "shutdown_request", "interrupt_request", "complete_request",
         "inspect_request", "history_request", "is_complete_request", "comm_info_request", "comm_open",
         "comm_msg", "comm_close", "input_reply", "debug_request", "usage_request", "create_subshell_request",
         "no_such_request", "no_such_message"]


def examples(n: int, thorough: bool = False) -> settings:
    """Hypothesis settings for `n` examples against a real kernel: no deadline, no example database
    in the repo; in `make test` the same examples every run, in a thorough run 25 times as many,
    new ones each time."""
    return settings(max_examples=n * 25 if thorough else n, derandomize=not thorough, deadline=None,
                    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the test's own peer: raw sockets, one identity, the kernel's key ---------------------------------


class Peer:
    """The test's sockets on the kernel's shell, control and stdin (one identity, as a frontend's
    shell and stdin share one) and iopub, with a Session signing with the kernel's key."""

    def __init__(self, km, stack: ExitStack):
        identity = f"hostile-{uuid.uuid4()}".encode()
        self.sockets: dict[str, zmq.Socket] = {}
        for channel in ("shell", "control", "stdin", "iopub"):
            sock, self.session = stack.enter_context(raw_socket(km, channel, None if channel == "iopub" else identity))
            self.sockets[channel] = sock
        # Subscribed once the kernel greets this socket (JEP 65): nothing published before is missed.
        until_message(self.iopub, self.session, lambda m: m["msg_type"] == "iopub_welcome", "the iopub welcome")
        self.counts()

    @property
    def iopub(self) -> zmq.Socket:
        return self.sockets["iopub"]

    def send(self, channel: str, msg_type: str, content: dict, **header) -> dict:
        msg = self.session.msg(msg_type, content)
        msg["header"].update(header)
        self.sockets[channel].send_multipart(self.session.serialize(msg))
        return msg

    def probe(self, channel: str) -> tuple[list[dict], list[dict]]:
        """A kernel_info_request on `channel`, which the proxy answers at once: what came back before
        its reply on that socket, and before its idle on iopub. (When its reply comes, everything sent
        before it on that socket has been handled.)"""
        msg_id = self.send(channel, "kernel_info_request", {})["header"]["msg_id"]
        back = until_message(self.sockets[channel], self.session, lambda m: m["parent_header"].get("msg_id") == msg_id,
                             f"the kernel_info_reply on {channel}")
        published = until_message(self.iopub, self.session, lambda m: _is_idle(m, msg_id), "the probe's idle")
        return back[:-1], [m for m in published if m["parent_header"].get("msg_id") != msg_id]

    def cell(self, code: str, **content) -> tuple[dict, list[dict]]:
        """A normal cell from this peer's shell: its reply, and its iopub messages up to its idle."""
        msg_id = self.send("shell", "execute_request", {"code": code, "silent": False, "store_history": True,
                                                        "user_expressions": {}, "allow_stdin": False,
                                                        "stop_on_error": True, **content})["header"]["msg_id"]
        return self.collect(msg_id)

    def collect(self, msg_id: str) -> tuple[dict, list[dict]]:
        """The reply to `msg_id` and every iopub message up to its idle (also any about others)."""
        outputs = until_message(self.iopub, self.session, lambda m: _is_idle(m, msg_id), "the cell's idle")
        reply = until_message(self.sockets["shell"], self.session, lambda m: m["parent_header"].get("msg_id") == msg_id,
                              "the execute_reply")[-1]
        return reply, outputs

    def ask(self, frames: list[list[bytes]] = ()) -> None:
        """A cell that waits for input(): `frames` go to stdin while it waits, then its answer, which
        it prints. (Then everything this peer sent on stdin before has been handled.)"""
        msg_id = self.send("shell", "execute_request", {"code": "print(input('?'))", "silent": False,
                                                        "store_history": True, "allow_stdin": True})["header"]["msg_id"]
        asked = until_message(self.sockets["stdin"], self.session, lambda m: m["msg_type"] == "input_request",
                              "the input_request")[-1]
        for message in frames:
            self.sockets["stdin"].send_multipart(message)
        answer = uuid.uuid4().hex
        self.sockets["stdin"].send_multipart(self.session.serialize(
            self.session.msg("input_reply", {"value": answer}, parent=asked["header"])))
        reply, outputs = self.collect(msg_id)
        assert reply["content"]["status"] == "ok"
        assert stream_text(outputs) == answer + "\n"
        assert {m["parent_header"].get("msg_id") for m in outputs} == {msg_id}, "another message got a bracket"
        assert not self.sockets["stdin"].poll(0), "something answered on stdin"

    def works(self) -> None:
        """A normal cell: it runs on the worker, no hostile message ran code before it, and klbr has
        nothing to tell about it (such as outputs published while it thought nobody subscribed)."""
        reply, outputs = self.cell("'ran' in globals()")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert results(outputs) == ["False"]
        assert "klbr:" not in stream_text(outputs), stream_text(outputs)

    def counts(self) -> tuple[int, int]:
        """(dropped, refused with an error) since the kernel started, from `%klbr status`."""
        self._seen, self._stale = self._counts(), False
        return self._seen

    def begin(self) -> tuple[int, int]:
        """The counts before an example: as the last one left them, looked up again if it failed
        before it looked (its hostile message may have been counted)."""
        if self._stale:
            self.counts()
        self._stale = True
        return self._seen

    def _counts(self) -> tuple[int, int]:
        _, outputs = self.cell("%klbr status", store_history=False)  # no cell of the log
        row = next(line for line in stream_text(outputs).splitlines() if line.startswith("dropped "))
        value = row.partition("  ")[2].strip()
        if value == "none":
            return 0, 0
        found = re.match(r"(\d+) messages from the frontend, (\d+) more answered with an error", value)
        assert found, value
        return int(found[1]), int(found[2])


def until_message(sock, session, last, what: str, timeout: float = 30) -> list[dict]:
    """Messages from a raw socket up to and including the first for which `last(msg)` is true."""
    got = []
    deadline = time.monotonic() + timeout
    while True:
        assert sock.poll(max(1, int((deadline - time.monotonic()) * 1000))), f"{what}: not within {timeout} s"
        msg = receive(sock, session, timeout=1)
        got.append(msg)
        if last(msg):
            return got


def _is_idle(msg: dict, msg_id: str) -> bool:
    return (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_id") == msg_id)


def log_lines(log: Path) -> int:
    return len(log.read_text(errors="replace").splitlines())


def rss(km) -> int:
    return psutil.Process(km.provisioner.process.pid).memory_info().rss


def signed(session: Session, parts: list[bytes]) -> list[bytes]:
    return [DELIM, session.sign(parts), *parts]


def packed(session: Session, msg_type: str, content: dict, **header) -> list[bytes]:
    """header, parent, metadata and content of a message, as bytes to sign (or to spoil)."""
    msg = session.msg(msg_type, content)
    msg["header"].update(header)
    return [session.pack(msg[k]) for k in ("header", "parent_header", "metadata", "content")]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One kernel for the module's examples, the test's own peer on it, and the kernel's log."""
    log = tmp_path_factory.mktemp("hostile") / "kernel.log"
    with start_kernel(log=log) as (km, kc), ExitStack() as stack:
        kc.stop_channels()  # the peer does it all; an iopub nobody reads would fill and hold the kernel back
        yield km, Peer(km, stack), log


# -- what hypothesis draws -----------------------------------------------------------------------------

_scalar = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=3), max_leaves=4)
_not_object = _json.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode())
# b"\x80" cannot begin UTF-8, nor (as json's encoding guess may read it) UTF-16 or UTF-32 JSON.
_not_utf8 = st.binary(max_size=40).map(lambda b: b"\x80" + b)


def _decodes(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


_not_json = st.one_of(_not_utf8, st.text(max_size=40).map(lambda t: ("{" + t).encode()).filter(lambda b: not _decodes(b)))
# Deeper than the door takes (100), and either well inside or well past what a parser reads here
# (about 990 levels less its stack), so the test's own reading of it agrees with the kernel's.
_depth = st.integers(101, 800) | st.integers(2_000, 20_000)


def _nested(depth: int, objects: bool = False) -> bytes:
    """Content a worker could run, but for one field nested `depth` levels deep."""
    deep = (b'{"a":' * depth + b"1" + b"}" * depth) if objects else (b"[" * depth + b"]" * depth)
    return b'{"code": "ran = True", "x-deep": ' + deep + b"}"



_extras = st.dictionaries(st.text(max_size=6).map(lambda k: "x-" + k), _scalar, max_size=2)

FRAME_DEFECTS = ["no delimiter", "missing frames", "empty HMAC", "wrong HMAC", "HMAC of another key"]
HEADER_DEFECTS = ["header not JSON", "header not an object", "header lacks msg_type", "10 KB msg_type",
                  "msg_type not a string", "parent not an object", "header nested deep", "msg_id not a string",
                  "version not 5"]
BODY_DEFECTS = ["content not UTF-8", "content not JSON", "content not an object", "content nested deep",
                "metadata not an object"]


@dataclass
class Case:
    """One hostile message: its defect, and what it is made of (the header as a dict, signed with a
    fresh msg_id and nonce so that no two are alike, or as bytes sent as they are)."""

    defect: str
    msg_type: str = "execute_request"
    header: dict | bytes = field(default_factory=dict)
    deep: int = 0  # for "header nested deep": the levels of a list in one of its fields
    parent: bytes = b"{}"
    metadata: bytes = b"{}"
    content: bytes = b'{"code": "ran = True"}'
    idents: list[bytes] = field(default_factory=list)
    buffers: list[bytes] = field(default_factory=list)
    missing: int = 0  # for "missing frames": how many are kept after the delimiter
    signature: bytes = b"0" * 64  # for "wrong HMAC"

    def frames(self, session: Session) -> tuple[list[bytes], str, object]:
        """The frames to send, what the kernel must do with them on shell or control (see
        `_answer`), and the msg_id its reply would carry."""
        header = self.header
        msg_id = None
        if isinstance(header, dict):
            msg_id = f"hostile-{uuid.uuid4()}"
            header = {"msg_id": msg_id, "msg_type": self.msg_type, "session": "hostile", "username": "test",
                      "date": datetime.now(UTC).isoformat(), "version": "5.3", "x-nonce": uuid.uuid4().hex,
                      **header}
            msg_id = header["msg_id"]
            header = json.dumps(header).encode()
            if self.deep:
                header = header[:-1] + b', "x-deep": ' + b"[" * self.deep + b"]" * self.deep + b"}"
        parts = [header, self.parent, self.metadata, self.content]
        sig = {"empty HMAC": b"", "wrong HMAC": self.signature,
               "HMAC of another key": Session(key=b"another key").sign(parts)}.get(self.defect, session.sign(parts))
        body = [sig, *parts, *self.buffers]
        if self.defect == "no delimiter":
            frames = [*self.idents, *body]
        elif self.defect == "missing frames":
            frames = [*self.idents, DELIM, *body[: self.missing]]
        else:
            frames = [*self.idents, DELIM, *body]
        return frames, self._answer(header), msg_id

    def _answer(self, header: bytes) -> str:
        """"drop" (nothing answers it), "bracket" (busy and idle but no reply: it is no request) or
        "reply" (an error reply inside its busy and idle). Every case has a defect: none is served."""
        if self.defect in FRAME_DEFECTS or not _decodes(header) or not _decodes(self.parent):
            return "drop"
        header, parent = json.loads(header), json.loads(self.parent)
        if not isinstance(header, dict) or not isinstance(parent, dict):
            return "drop"
        msg_type = header.get("msg_type")
        if not isinstance(msg_type, str) or not 0 < len(msg_type) <= 100:
            return "drop"
        return "reply" if msg_type.endswith("_request") else "bracket"


@st.composite
def cases(draw) -> Case:
    defect = draw(st.sampled_from(FRAME_DEFECTS + HEADER_DEFECTS + BODY_DEFECTS))
    case = Case(defect, msg_type=draw(st.sampled_from(TYPES) | st.text(min_size=1, max_size=100)),
                header=draw(_extras), idents=draw(st.lists(st.binary(min_size=1, max_size=8), max_size=2)),
                buffers=draw(st.lists(st.binary(max_size=16), max_size=2)))
    if defect == "missing frames":
        case.missing = draw(st.integers(0, 4))
    elif defect == "wrong HMAC":
        case.signature = draw(st.binary(min_size=1, max_size=80)
                              | st.text("0123456789abcdef", min_size=64, max_size=64).map(str.encode))
    elif defect == "header not JSON":
        case.header = draw(_not_json)
    elif defect == "header not an object":
        case.header = draw(_not_object)
    elif defect == "header lacks msg_type":
        case.header = json.dumps(draw(st.dictionaries(st.text(max_size=10).filter(lambda k: k != "msg_type"), _json,
                                                      max_size=4))).encode()
    elif defect == "10 KB msg_type":
        case.msg_type = draw(st.sampled_from(["x", "é", "😈", "execute_request"])) * 10_000
    elif defect == "msg_type not a string":
        case.header["msg_type"] = draw(st.none() | st.integers() | st.lists(st.text(max_size=5), max_size=2) | st.just(""))
    elif defect == "parent not an object":
        case.parent = draw(_not_json | _not_object)
    elif defect == "header nested deep":
        case.deep = draw(_depth)
    elif defect == "msg_id not a string":
        case.header["msg_id"] = draw(st.none() | st.integers() | st.lists(st.text(max_size=5), max_size=2) | st.just(""))
    elif defect == "version not 5":
        case.header["version"] = draw(st.none() | st.integers() | st.sampled_from(["4.1", "", "5.x", "banana"]))
    elif defect == "content not UTF-8":
        case.content = draw(_not_utf8)
    elif defect == "content not JSON":
        case.content = draw(_not_json)
    elif defect == "content not an object":
        case.content = draw(_not_object)
    elif defect == "content nested deep":
        case.content = _nested(draw(_depth), draw(st.booleans()))
    elif defect == "metadata not an object":
        case.metadata = draw(_not_json | _not_object)
    return case


# -- header and content variants, drawn -----------------------------------------------------------

# The hostile frames named up front, always among the examples (hypothesis runs these first).
LISTED = [Case("no delimiter"), Case("missing frames", missing=0), Case("missing frames", missing=3),
          Case("empty HMAC"), Case("wrong HMAC"), Case("HMAC of another key"),
          Case("header not JSON", header=b"{not json"), Case("header not JSON", header=b"\x80\xff"),
          Case("header not an object", header=b"[1, 2]"), Case("header not an object", header=b'"text"'),
          Case("header lacks msg_type", header=b'{"msg_id": "m"}'), Case("10 KB msg_type", msg_type="x" * 10_000),
          Case("content not UTF-8", content=b"\x80\xfe{}"), Case("content not an object", content=b"[]"),
          Case("content not an object", content=b"null"), Case("header nested deep", deep=900),
          Case("content nested deep", content=_nested(975)), Case("content nested deep", content=_nested(500, True))]


def listed(test):
    for case in LISTED:
        test = example(case=case)(test)
    return test


def _on_shell_or_control(hostile, channel: str, case: Case) -> None:
    """A request the door can name gets one error reply inside busy/idle, anything else nothing
    (a message that is no request: busy/idle only), each is counted, and a normal cell works."""
    km, peer, log = hostile
    before = peer.begin()
    frames, answer, msg_id = case.frames(peer.session)
    peer.sockets[channel].send_multipart(frames)
    back, published = peer.probe(channel)
    states = [(m["msg_type"], m["content"].get("execution_state"), m["parent_header"].get("msg_id")) for m in published]
    if answer == "drop":
        assert back == [] and published == [], (back, published)
    else:
        assert states == [("status", "busy", msg_id), ("status", "idle", msg_id)], states
        if answer == "bracket":
            assert back == [], back
        else:
            assert [m["parent_header"].get("msg_id") for m in back] == [msg_id], back
            assert back[0]["msg_type"].endswith("_reply") and back[0]["content"]["status"] == "error"
            assert back[0]["content"]["ename"] in ("InvalidMessage", "SubshellsNotSupported"), back[0]["content"]
    peer.works()
    dropped, refused = peer.counts()
    assert (dropped - before[0], refused - before[1]) == ((1, 0) if answer == "drop" else (0, 1))


def _on_stdin(hostile, case: Case) -> None:
    """Whatever comes on stdin while input() waits is dropped and counted, nothing answers it, and
    input() gets the real answer that follows it."""
    km, peer, log = hostile
    before = peer.begin()
    peer.ask([case.frames(peer.session)[0]])
    peer.works()
    dropped, refused = peer.counts()
    assert (dropped - before[0], refused - before[1]) == (1, 0)


@pytest.mark.parametrize("channel", ["shell", "control"])
@examples(80)
@given(case=cases())
@listed
def test_hostile_frames_on_shell_and_control_are_answered_or_dropped_and_counted(hostile, channel, case):
    _on_shell_or_control(hostile, channel, case)


@examples(50)
@given(case=cases())
@listed
def test_hostile_frames_on_stdin_are_dropped_and_input_still_works(hostile, case):
    _on_stdin(hostile, case)


@thorough
@pytest.mark.parametrize("channel", ["shell", "control"])
@examples(80, thorough=True)
@given(case=cases())
def test_many_more_hostile_frames_on_shell_and_control(hostile, channel, case):
    _on_shell_or_control(hostile, channel, case)


@thorough
@examples(50, thorough=True)
@given(case=cases())
def test_many_more_hostile_frames_on_stdin(hostile, case):
    _on_stdin(hostile, case)


# -- iopub: what a subscriber sends ---------------------------------------------------------------


class Subscriber:
    """A TCP connection to the kernel's iopub that speaks ZMTP 3.0 as a SUB socket does, so that a
    test sends whatever frames it likes. (A libzmq SUB keeps each subscription it sends in a trie of
    its own, a node per byte: a 64 MiB one would cost the test gigabytes and minutes.)"""

    def __init__(self, km):
        info = km.get_connection_info()
        assert info["transport"] == "tcp"
        self.sock = socket.create_connection((info["ip"], info["iopub_port"]), timeout=30)
        # Signature, version 3.0, the NULL mechanism, as-server 0, filler (ZMTP 3.0, RFC 23).
        self.sock.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32)
        self._exactly(64)
        self.sock.sendall(_zmtp_frame(b"\x05READY\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB", command=True))
        self.frame()  # the kernel's READY

    def send(self, frames: list[bytes]) -> None:
        """One message of `frames`; what libzmq's XPUB reads as subscriptions (a first byte of 1),
        unsubscriptions (0), or anything else."""
        self.sock.sendall(b"".join(_zmtp_frame(f, more=i < len(frames) - 1) for i, f in enumerate(frames)))

    def frame(self) -> tuple[int, bytes]:
        flags = self._exactly(1)[0]
        size = struct.unpack(">Q", self._exactly(8))[0] if flags & 0x02 else self._exactly(1)[0]
        return flags, self._exactly(size)

    def message(self) -> list[bytes]:
        parts = []
        while True:
            flags, body = self.frame()
            parts.append(body)
            if not flags & 0x01:
                return parts

    def welcome(self, topic: bytes) -> None:
        """Subscribe to `topic` and wait for the kernel's welcome to it: everything this subscriber
        sent before has been handled then."""
        self.send([b"\x01" + topic])
        while True:
            parts = self.message()
            if parts[0] == topic and b'"iopub_welcome"' in parts[3]:
                return

    def disconnected(self) -> bool:
        """Whether the kernel closes this connection (within the socket's timeout)."""
        try:
            while self.sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionResetError("the kernel closed the connection")
            data += chunk
        return data


def _zmtp_frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (0x04 if command else 0) | (0x01 if more else 0)
    if len(body) > 255:
        return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


@contextmanager
def subscriber(km):
    sub = Subscriber(km)
    try:
        yield sub
    finally:
        sub.close()


# (kind, bytes): a subscription (1), an unsubscription (0), or a frame that is neither ("").
_subscriber_frames = st.lists(st.tuples(st.sampled_from([b"\x01", b"\x00", b""]), st.binary(max_size=64)),
                              min_size=1, max_size=8)


def _on_iopub(hostile, frames: list[tuple[bytes, bytes]]) -> None:
    """Subscriptions to any bytes, unsubscriptions, and frames that are neither, as one message:
    what is no subscription, nor the end of a live one, is dropped and counted; a normal cell's
    output still reaches the subscribers, and nothing makes the kernel think nobody listens."""
    km, peer, log = hostile
    before = peer.begin()
    nonce = b"fuzz-" + uuid.uuid4().hex.encode()  # topics of this example only (another's may still be live)
    sent, live, dropped = [], Counter(), 0
    for kind, data in frames:
        if not kind:
            sent.append(b"j" + data if data[:1] in (b"\x00", b"\x01") else data)
            dropped += 1
            continue
        topic = nonce + data
        sent.append(kind + topic)
        if kind == b"\x01":
            live[topic] += 1
        elif live[topic]:
            live[topic] -= 1
        else:
            dropped += 1
    with subscriber(km) as sub:
        sub.send(sent)
        sub.welcome(nonce + b"-probe")
    peer.works()
    assert peer.counts() == (before[0] + dropped, before[1])


@examples(40)
@given(frames=_subscriber_frames)
@example(frames=[(b"", b"junk that is not a subscription")])
@example(frames=[(b"", b"")])
@example(frames=[(b"\x01", b"\xff\xfe")])  # a topic that is not text: no welcome
@example(frames=[(b"\x00", b"never subscribed"), (b"\x00", b"never subscribed")])
@example(frames=[(b"\x01", b"t"), (b"\x00", b"t"), (b"\x00", b"t")])
def test_hostile_frames_on_iopub_are_dropped_and_subscriptions_still_work(hostile, frames):
    _on_iopub(hostile, frames)


@thorough
@examples(40, thorough=True)
@given(frames=_subscriber_frames)
def test_many_more_hostile_frames_on_iopub(hostile, frames):
    _on_iopub(hostile, frames)


def test_a_64_MiB_frame_on_every_socket(hostile):
    """Served where it is legal (an execute's content: under the default cap on shell, control and
    stdin, `KlbrKernelApp.max_message_size`, 256 MiB), dropped where it is not; a 64 MiB
    subscription disconnects its sender (libzmq would keep it as a trie node per byte: gigabytes)."""
    km, peer, log = hostile
    before = peer.begin()
    reply, _ = peer.cell("'padded'", padding="a" * (64 * MiB))
    assert reply["content"]["status"] == "ok"
    peer.works()
    parts = packed(peer.session, "kernel_info_request", {})
    peer.sockets["control"].send_multipart([DELIM, b"0" * (64 * MiB), *parts])  # a 64 MiB HMAC
    assert peer.probe("control") == ([], [])
    peer.works()
    _on_stdin(hostile, Case("header not JSON", header=b"\x80" * (64 * MiB)))
    dropped, refused = peer.counts()
    assert (dropped - before[0], refused - before[1]) == (2, 0)
    before = rss(km)
    with subscriber(km) as sub:
        try:
            sub.send([b"\x01" + b"s" * (64 * MiB)])
        except (ConnectionResetError, BrokenPipeError):
            pass  # the kernel hung up while it was being sent
        assert sub.disconnected(), "a 64 MiB subscription was taken"
    assert rss(km) - before < 256 * MiB
    peer.works()


def _memory(pid: int, field: str) -> int:
    """VmRSS or VmHWM (the peak since it was last reset) of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _hung_up(sock: zmq.Socket, send: list[bytes]) -> None:
    """Send `send` on `sock` and wait until the kernel disconnects it (its libzmq reconnects)."""
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.send_multipart(send)
        assert monitor.poll(30_000), "the kernel took a frame over its cap (no disconnect within 30 s)"
    finally:
        sock.disable_monitor()
        monitor.close()


def test_a_frame_over_the_cap_disconnects_its_sender_and_costs_the_kernel_no_memory(tmp_path):
    """`KlbrKernelApp.max_message_size` (8 MiB here) on shell, control and stdin, and a few KiB on
    the heartbeat: libzmq refuses a longer frame from its size, before it is read, and hangs up on
    its sender, whose libzmq reconnects; its next normal request is served."""
    cap = 8 * MiB
    with start_kernel(extra_arguments=[f"--KlbrKernelApp.max_message_size={cap}"]) as (km, kc), ExitStack() as stack:
        kc.stop_channels()
        peer = Peer(km, stack)
        reply, _ = peer.cell("'padded'", padding="a" * (cap - MiB))  # under the cap: served
        assert reply["content"]["status"] == "ok"
        pid = km.provisioner.process.pid
        over = "a" * (cap + MiB)
        hostile = {
            "shell": packed(peer.session, "execute_request", {"code": "ran = True", "padding": over}),
            "control": packed(peer.session, "kernel_info_request", {"padding": over}),
            "stdin": [b"", b"", b"", over.encode()],
        }
        for channel, parts in hostile.items():
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")  # the peak starts again from what the kernel holds now
            before = _memory(pid, "VmRSS")
            _hung_up(peer.sockets[channel], signed(peer.session, parts))
            assert _memory(pid, "VmHWM") - before < MiB, f"{channel}: the kernel read the frame over its cap"
        peer.works()  # shell, reconnected: the execute over the cap never ran
        assert peer.probe("control") == ([], [])
        peer.ask()
        info = km.get_connection_info()
        hb = stack.enter_context(zmq.Context.instance().socket(zmq.DEALER))
        hb.linger = 0
        hb.connect(f"ipc://{info['ip']}-{info['hb_port']}" if info["transport"] == "ipc"
                   else f"tcp://{info['ip']}:{info['hb_port']}")
        _hung_up(hb, [b"p" * (64 << 10)])
        hb.send(b"ping")
        assert hb.poll(30_000) and hb.recv() == b"ping"
        assert peer.counts() == (0, 0)  # nothing over the cap reached the kernel to be counted


def test_a_cap_in_a_config_file_is_not_applied_and_says_so(tmp_path):
    """The sockets are bound before config files are read (see `standin.max_message_size`): a
    config file's cap is told in the log, and the one bound with stays."""
    (tmp_path / "jupyter_klbr_config.py").write_text(f"c.KlbrKernelApp.max_message_size = {8 * MiB}\n")
    log = tmp_path / "kernel.log"
    with start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}, log=log) as (km, kc):
        reply, _ = execute(kc, "'padded'", user_expressions={"padding": "'" + "a" * (9 * MiB) + "'"})
        assert reply["content"]["status"] == "ok"
    assert f"KlbrKernelApp.max_message_size = {8 * MiB} from a config file is not applied" in log.read_text()


def test_a_cap_the_early_front_read_otherwise_than_traitlets_is_reported(tmp_path):
    """The stand-in (the early front, as the log says) reads the cap from the command line before traitlets is imported; the app
    checks that reading against traitlets' own. After `--` traitlets reads nothing more (those are
    extra arguments), so a second cap there is where the two readings part: the log says so, with both."""
    log = tmp_path / "kernel.log"
    arguments = ["--KlbrKernelApp.max_message_size=2000000", "--", "--KlbrKernelApp.max_message_size=3000000"]
    with start_kernel(extra_arguments=arguments, log=log) as (km, kc):
        reply, _ = execute(kc, "'served'")
        assert reply["content"]["status"] == "ok"
    text = log.read_text()
    assert "the early front read KlbrKernelApp.max_message_size on the command line as 3000000, traitlets as 2000000" in text
    assert "from a config file" not in text


def test_1000_frames_in_one_message_on_every_socket(hostile):
    km, peer, log = hostile
    before = peer.begin()
    # shell: a signed execute and 994 buffers is a legal message, and runs.
    msg = peer.session.msg("execute_request", {"code": "buffered = 1000", "silent": False, "store_history": True})
    peer.sockets["shell"].send_multipart(peer.session.serialize(msg) + [b"b"] * 994)
    reply, _ = peer.collect(msg["header"]["msg_id"])
    assert reply["content"]["status"] == "ok"
    peer.works()
    # control: 994 routing frames before a signed kernel_info_request all come back with its reply.
    msg = peer.session.msg("kernel_info_request", {})
    peer.sockets["control"].send_multipart([b"hop%d" % i for i in range(994)] + peer.session.serialize(msg))
    assert peer.sockets["control"].poll(10_000)
    frames = peer.sockets["control"].recv_multipart()
    assert frames[:994] == [b"hop%d" % i for i in range(994)] and frames[994] == DELIM
    peer.probe("shell")  # its busy and idle went by on iopub
    peer.works()
    # control and stdin: 1000 frames that are no message, dropped once each.
    peer.sockets["control"].send_multipart([b"x"] * 1000)
    assert peer.probe("control") == ([], [])
    peer.ask([[b"x"] * 1000])
    peer.works()
    # iopub: 1000 frames of junk in one message, each dropped (libzmq hands them over one by one).
    with subscriber(km) as sub:
        sub.send([b"junk"] * 1000)
        sub.welcome(b"probe")
    peer.works()
    assert peer.counts() == (before[0] + 1002, before[1])


def test_dropped_traffic_is_counted_and_logged_at_a_bounded_rate(hostile):
    """1000 bad frames and 200 refused requests: all counted, a handful of log lines."""
    km, peer, log = hostile
    before, lines = peer.begin(), log_lines(log)
    sock = peer.sockets["shell"]
    for i in range(1000):
        parts = packed(peer.session, "execute_request", {"code": "ran = True"})
        sock.send_multipart([DELIM, b"%064d" % i, *parts])  # wrong HMAC
    for i in range(200):
        parts = packed(peer.session, "execute_request", {"code": 1})  # signed, but no code the worker can run
        sock.send_multipart(signed(peer.session, parts))
    back, published = peer.probe("shell")
    assert len(back) == 200 and {m["content"]["ename"] for m in back} == {"InvalidMessage"}
    assert len(published) == 400
    peer.works()
    dropped, refused = peer.counts()
    assert (dropped - before[0], refused - before[1]) == (1000, 200)
    assert log_lines(log) - lines < 10, log.read_text()[-3000:]


# -- a signed execute, sent again --------------------------------------------------------------------


def _once(ran: Path) -> dict:
    """An execute whose every run leaves a line in `ran`."""
    return {"code": f"open({str(ran)!r}, 'a').write('ran\\n')", "silent": False, "store_history": True,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}


def test_a_replayed_execute_is_answered_from_the_first_and_never_run_again(hostile, tmp_path):
    """Byte-identical copies on shell and control get the first one's reply; on stdin, nothing."""
    km, peer, log = hostile
    before = peer.begin()
    ran = tmp_path / "ran"
    msg = peer.session.msg("execute_request", _once(ran))
    frames = peer.session.serialize(msg)
    for channel in ("shell", "shell", "control", "stdin"):
        peer.sockets[channel].send_multipart(frames)
    first, _ = peer.collect(msg["header"]["msg_id"])
    again = until_message(peer.sockets["shell"], peer.session, lambda m: True, "the second reply")
    on_control = until_message(peer.sockets["control"], peer.session, lambda m: True, "the reply on control")
    assert [m["content"] for m in again + on_control] == [first["content"]] * 2
    peer.ask()  # the copy on stdin was handled before its answer
    assert ran.read_text() == "ran\n"
    peer.works()
    assert peer.counts() == (before[0] + 1, before[1])


def test_a_replayed_execute_is_not_run_again_by_the_next_kernel_on_the_same_file(tmp_path):
    """jupyter_client's restart: a new kernel process on the same connection file and database."""
    db, ran = tmp_path / "log.sqlite3", tmp_path / "ran"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        with raw_socket(km, "shell") as (sock, session):
            frames = session.serialize(session.msg("execute_request", _once(ran)))
            sock.send_multipart(frames)
            first = receive(sock, session)
            assert first["content"]["status"] == "ok"
            old = km.provisioner.process.pid
            km.restart_kernel()
            kc.wait_for_ready(timeout=60)
            assert km.provisioner.process.pid != old
            sock.send_multipart(frames)
            again = receive(sock, session, timeout=30)
        assert again["parent_header"]["msg_id"] == first["parent_header"]["msg_id"]
        assert again["content"] == first["content"]
        assert ran.read_text() == "ran\n"
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["status"] == "ok"



def test_a_replay_of_a_cell_whose_kernel_died_under_it_is_refused_not_run(tmp_path):
    """The kernel is SIGKILLed while the cell runs (its row is left `running`, then `unknown`): the
    same frames sent to the next kernel on the file get WorkerLost, and the cell runs no second time."""
    db, ran = tmp_path / "log.sqlite3", tmp_path / "ran"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        with raw_socket(km, "shell") as (sock, session):
            content = _once(ran)
            content["code"] += "\nimport time\ntime.sleep(600)"
            frames = session.serialize(session.msg("execute_request", content))
            sock.send_multipart(frames)
            until(lambda: ran.exists() and ran.read_text() == "ran\n", 60, "the cell runs")
            km.provisioner.process.kill()
            km.provisioner.process.wait()
            km.restart_kernel(now=True)
            kc.wait_for_ready(timeout=60)
            sock.send_multipart(frames)
            again = receive(sock, session, timeout=30)
        assert again["content"]["status"] == "error" and again["content"]["ename"] == "WorkerLost", again["content"]
        user, detail = said(again["content"]["evalue"])
        assert user.startswith("This cell is not run again: an earlier kernel of this session took it and ended "
                               "before it recorded how the cell ended"), user
        assert "Run it again yourself if that is safe." in user and "'unknown' in the cell log" in detail, detail
        assert ran.read_text() == "ran\n"
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["status"] == "ok"


def _bulk(session: Session, msg_type: str | None, content: bytes, n: int) -> list[list[bytes]]:
    """`n` signed messages, each with an id of its own (and no type when `msg_type` is None), built
    faster than `Session.msg` builds them."""
    typed = b'"msg_type": "%s", ' % msg_type.encode() if msg_type else b""
    head = b'{"session": "bulk", "username": "test", "date": "2026-01-01T00:00:00.000000Z", "version": "5.3", ' + typed
    return [signed(session, [head + b'"msg_id": "bulk-%d-%s"}' % (i, (msg_type or "untyped").encode()),
                             b"{}", b"{}", content]) for i in range(n)]


def _replayed_after(tmp_path, executes: int, others: int) -> None:
    """A recorded cell, then `executes` other executes (queued behind a cell that waits for input()
    and then fails, so they are aborted unrun) and `others` signed messages that name no type (they
    pass the signature check and fill its history, and the door drops them: the cheapest message
    that passes), then the cell's frames again: answered from the first run, never run again."""
    db, ran = tmp_path / "log.sqlite3", tmp_path / "ran"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        kc.stop_channels()  # its iopub would queue the bracket of every execute, read by no one
        with ExitStack() as stack:
            identity = b"bulk-peer"
            shell, session = stack.enter_context(raw_socket(km, "shell", identity))
            stdin, _ = stack.enter_context(raw_socket(km, "stdin", identity))
            target = session.serialize(session.msg("execute_request", _once(ran)))
            shell.send_multipart(target)
            first = receive(shell, session)
            head = session.msg("execute_request", {"code": "input()\n1 / 0", "silent": False, "store_history": True,
                                                   "allow_stdin": True, "stop_on_error": True})
            shell.send_multipart(session.serialize(head))
            asked = until_message(stdin, session, lambda m: m["msg_type"] == "input_request", "the input_request")[-1]
            content = b'{"code": "ran_again = True", "silent": true, "store_history": false}'
            for frames in _bulk(session, "execute_request", content, executes):
                shell.send_multipart(frames)
            # All of them queued: the proxy answers kernel_info at once, after what came before it.
            info = session.msg("kernel_info_request", {})
            shell.send_multipart(session.serialize(info))
            until_message(shell, session, lambda m: m["parent_header"].get("msg_id") == info["header"]["msg_id"],
                          "the kernel_info_reply", timeout=120)
            for frames in _bulk(session, None, b"{}", others):
                stdin.send_multipart(frames)
            stdin.send_multipart(session.serialize(session.msg("input_reply", {"value": ""}, parent=asked["header"])))
            # Only their content is read: deserializing 10 000 replies would cost the kernel its CPU.
            statuses = []
            for _ in range(executes + 1):
                assert shell.poll(60_000), f"{len(statuses)} of {executes + 1} replies came"
                statuses.append(json.loads(shell.recv_multipart()[-1])["status"])
            assert statuses == ["error"] + ["aborted"] * executes
            shell.send_multipart(target)
            again = receive(shell, session, timeout=30)
        assert again["parent_header"]["msg_id"] == first["parent_header"]["msg_id"]
        assert again["content"] == first["content"]
        assert ran.read_text() == "ran\n"
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply, outputs = execute(client, "'ran_again' in globals()")
            assert results(outputs) == ["False"]
        finally:
            client.stop_channels()


def test_a_replayed_execute_is_not_run_again_after_70000_other_messages(tmp_path):
    # Past both of the proxy's memories: 10 000 executes taken, 65 536 signatures seen.
    _replayed_after(tmp_path, executes=10_000, others=60_000)


@thorough
def test_a_replayed_execute_is_not_run_again_after_70000_other_executes(tmp_path):
    _replayed_after(tmp_path, executes=70_000, others=0)
