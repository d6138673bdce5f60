"""Cell code talks to its supervisor: `from klbr_kernel import host`.

    host.inspect()                       where and what this cell runs on, and its time left
    host.run(["ls", "-l"], cwd="data")   a command on the supervisor's machine, in its workspace
    host.put("step", 3); host.get("step"); host.keys()   values that survive crashes and restarts
    host.notify("done training")         a durable note, shown in the notebook
    host.restart("leaking memory"); host.relocate("local")   once this cell ends

A refused call raises `HostError`, whose `code` is one of `forbidden`, `invalid`, `budget_exhausted`,
`stale_generation`, `not_running`, `timeout`, `too_large`, `unavailable` (this placement has no host
channel, its link was lost, or a TCP endpoint was never reached: the message says which).

Standard library and pyzmq only, so that any interpreter a generation runs on can import it. The
supervisor gives each generation, in its environment (never its argv), the channel's endpoint, a
token and a key (and, for a TCP endpoint, the server's CurveZMQ key: the channel is encrypted); every request is signed with the key (HMAC-SHA256 over the payload), carries the
token, a call id and the msg_id of the cell it runs under, and every reply is signed the same way.
A call that gets no reply in time is sent again with the same call id: the supervisor answers a
repeated id from its record and carries out each call once. Calls are safe from several threads at
once (a socket per thread); work handed to another thread carries the cell it was handed over in
(see `_cell`), so a thread that outlives its cell is told `not_running`. Nothing user code calls is
replaced to know that: threading, `ThreadPoolExecutor` and their tracebacks are as under ipykernel.

Wire format, both ways: [PROTOCOL, signature, payload]; payload is JSON. A request:
{"call", "token", "cell", "method", "args"}; a reply: {"call", "ok": true, "result"} or
{"call", "ok": false, "code", "message"}.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextvars
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
import zmq.utils.monitor

PROTOCOL = b"klbr-host/1"
ENDPOINT, TOKEN, KEY = "KLBR_HOST_ENDPOINT", "KLBR_HOST_TOKEN", "KLBR_HOST_KEY"
UNAVAILABLE = "KLBR_HOST_UNAVAILABLE"  # why a worker klbr started has no host channel, instead of one
SERVER_KEY = "KLBR_HOST_SERVERKEY"  # a TCP endpoint's CurveZMQ public key: the channel is encrypted
# A provisioner of its own forwards to its kernel only the variables named KERNEL_* (gateway_provisioners'
# convention): each setting is read under either name.
FORWARDED = "KERNEL_"
CODES = ("forbidden", "invalid", "budget_exhausted", "stale_generation", "not_running", "timeout", "too_large",
         "unavailable")
CALL_TIMEOUT = 30.0  # seconds a call waits for its answer (a command: its own timeout, and this)
MAX_REQUEST = 2**20  # bytes a request may carry
_RESEND_EVERY = 5.0  # seconds between sends of one call that has no answer yet


class HostError(Exception):
    """A host call the supervisor refused, or that got no answer: `code` says which (see `CODES`)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def sign(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode()


# -- which cell is calling --------------------------------------------------------------------------

def _parent_msg_id() -> str | None:
    """The msg_id of the request ipykernel runs this code for (the running cell, in its own thread)."""
    header = getattr(sys.stdout, "parent_header", None)  # ipykernel's OutStream knows, per context
    if isinstance(header, dict):
        msg_id = header.get("header", header).get("msg_id")
        return msg_id if isinstance(msg_id, str) and msg_id else None
    return None


_handed: contextvars.ContextVar[str | None] = contextvars.ContextVar("klbr_cell", default=None)


def _cell() -> str | None:
    """The cell a call is made for: the cell during which the work making it was handed over.

    Work is handed over at two points, both stamped with the cell running then: a thread started
    (its whole run) and a callable submitted to a `ThreadPoolExecutor` (asyncio's default executor
    is one), for as long as that callable runs. The innermost stamp wins; with none (the main
    thread, a thread started before this module was imported), ipykernel's parent header.

    Why not the parent header alone: no ipykernel answers it right for both hand-overs. In
    ipykernel 7 it is a context variable set in the context the cell runs in, and a thread (before
    Python 3.14) starts in an empty context, where ipykernel falls back to its global parent: the
    latest request, whichever cell that is. Right for pooled work submitted during the running cell;
    wrong for a thread left over from an earlier cell, which must be told `not_running`. ipykernel
    6.29 (as a stamp on the thread alone would) gives a thread the cell it started in: right for the
    leftover thread, wrong for a pool's thread started in an earlier cell. Stamping each hand-over
    gets both right.
    """
    handed = _handed.get()
    if handed is not None:
        return handed
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        stamped = getattr(thread, "_klbr_cell", None)
        if isinstance(stamped, str):
            return stamped
    return _parent_msg_id()


# The hand-overs are seen where the standard library itself passes them on, below anything user
# code calls: user code sees `Thread.__init__`, `Thread.start`, `ThreadPoolExecutor.submit` and the
# tracebacks of pooled work exactly as under ipykernel. A `sys.addaudithook` on the thread start
# would replace nothing, but it cannot be removed and runs for every audited event of the process:
# a Python hook made `id()` 8x slower here (28 -> 230 ns), and it sees no pooled hand-over at all.

def _starting(function: Callable[..., object], *args: object, **kwargs: object) -> object:
    """`threading`'s own start of a thread's OS thread; its function is `Thread._bootstrap`, bound."""
    thread = getattr(function, "__self__", None)
    if isinstance(thread, threading.Thread):
        # an attribute, as ipykernel stamps threads: a subclass may be unhashable (an attribute of
        # our own, which typeshed's Thread does not declare)
        thread._klbr_cell = _cell()  # type: ignore[attr-defined]
    return _start(function, *args, **kwargs)


class _HandedWork(concurrent.futures.thread._WorkItem[Any]):
    """The work item `ThreadPoolExecutor.submit` makes (in the submitting thread) and a pool's
    thread runs: it carries the cell it was submitted in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._klbr_cell = _cell()

    def run(self, *args: Any, **kwargs: Any) -> None:
        token = _handed.set(self._klbr_cell)
        try:
            return super().run(*args, **kwargs)
        finally:
            _handed.reset(token)


# From now on, threads and pooled work know the cell they were handed over in. Python 3.11 and
# 3.12 start a thread through `threading._start_new_thread`, 3.13 on through `_start_joinable_thread`.
_START = "_start_joinable_thread" if hasattr(threading, "_start_joinable_thread") else "_start_new_thread"
_start = getattr(threading, _START)
setattr(threading, _START, _starting)
concurrent.futures.thread._WorkItem = _HandedWork  # type: ignore[misc]  # replacing the class is the point


# -- the channel ------------------------------------------------------------------------------------

def _setting(name: str) -> str | None:
    return os.environ.get(name) or os.environ.get(FORWARDED + name)


class _Connection:
    def __init__(self) -> None:
        endpoint, token, key = (_setting(name) for name in (ENDPOINT, TOKEN, KEY))
        unavailable = _setting(UNAVAILABLE)
        if not endpoint and unavailable:
            raise HostError(code="unavailable", message=unavailable)
        if not (endpoint and token and key):
            msg = "this interpreter was not started by a klbr supervisor (no host channel)"
            raise HostError(code="forbidden", message=msg)
        self.endpoint, self.token, self.key = endpoint, token, key.encode()
        self.server_key = _setting(SERVER_KEY)
        self._local = threading.local()

    def _socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] | None = getattr(self._local, "socket", None)
        if sock is None:
            context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            if self.server_key:  # over TCP: encrypted, to the server that holds this key only
                public, secret = zmq.curve_keypair()
                sock.curve_serverkey = self.server_key.encode()
                sock.curve_publickey, sock.curve_secretkey = public, secret
                # whether a route back exists at all: a handshake with the supervisor completed
                self._local.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(self.endpoint)
            self._local.socket = sock
        return sock

    def call(self, method: str, args: dict[str, Any], timeout: float) -> Any:
        call_id = uuid.uuid4().hex
        payload = json.dumps({"call": call_id, "token": self.token, "cell": _cell(), "method": method,
                              "args": args}).encode()
        if len(payload) > MAX_REQUEST:
            msg = f"a request may carry at most {MAX_REQUEST} bytes ({len(payload)} here)"
            raise HostError(code="too_large", message=msg)
        frames = [PROTOCOL, sign(self.key, payload), payload]
        sock = self._socket()
        deadline = time.monotonic() + timeout
        sends = 0
        while True:
            gone = self._gone(probe=sends > 0)
            sends += 1
            if gone:
                raise HostError(code="stale_generation", message=gone)
            sock.send_multipart(frames)  # again after a silence: the same call id, done at most once
            wait = min(_RESEND_EVERY, deadline - time.monotonic())
            while wait > 0 and sock.poll(int(wait * 1000)):
                reply = self._reply(sock.recv_multipart(), call_id)
                if reply is not None:
                    if reply.get("ok"):
                        return reply.get("result")
                    raise HostError(str(reply.get("code")), str(reply.get("message")))
                wait = min(_RESEND_EVERY, deadline - time.monotonic())
            if time.monotonic() >= deadline:
                if not self._reached():
                    msg = f"no route back to the supervisor: {self.endpoint} was not reached within {timeout:g} s"
                    raise HostError(code="unavailable", message=msg)
                msg = f"no answer to {method}() within {timeout:g} s"
                raise HostError(code="timeout", message=msg)

    def _gone(self, *, probe: bool) -> str | None:
        """Why the channel has gone with the generation that started this process, where an ipc
        socket is the generation's own and goes with it (the one ssh forwards to a remote kernel
        lives as long as its connection): no socket at the path, or nothing listening on it. None
        while it may answer. Asked before each send: a stat, and a connect only on a resend."""
        if not self.endpoint.startswith("ipc://"):
            return None
        path = self.endpoint.removeprefix("ipc://")
        why = f"the host channel {path} is gone: the generation that started this process has ended"
        if not os.path.exists(path):
            return why
        if probe:  # a socket file its listener left behind (a supervisor killed outright)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
                try:
                    unix.connect(path)
                except ConnectionRefusedError:
                    return why
                except OSError:
                    return None  # whatever else it is, the answer may yet come
        return None

    def _reached(self) -> bool:
        """Whether this thread's socket ever completed a handshake with the supervisor (watched over
        TCP only: an ipc path here, or one ssh forwards, is reached or gone with the kernel)."""
        monitor: zmq.Socket[bytes] | None = getattr(self._local, "monitor", None)
        if monitor is None:
            return True
        while monitor.poll(0):
            if zmq.utils.monitor.recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._local.reached = True
        return bool(getattr(self._local, "reached", False))

    def _reply(self, frames: list[bytes], call_id: str) -> dict[str, Any] | None:
        """The reply to `call_id`, or None for anything else (a late answer to an earlier send)."""
        if len(frames) != 3 or frames[0] != PROTOCOL or not hmac.compare_digest(frames[1], sign(self.key, frames[2])):
            return None
        try:
            reply = json.loads(frames[2])
        except ValueError:
            return None
        return reply if isinstance(reply, dict) and reply.get("call") == call_id else None


_connection: _Connection | None = None
_connection_lock = threading.Lock()


def _call(method: str, args: dict[str, Any] | None = None, wait: float = CALL_TIMEOUT) -> Any:
    """Call `method` with `args`; wait at most `wait` seconds for the answer: a JSON value, as the
    supervisor's reply holds it (each call below says what it is)."""
    global _connection
    with _connection_lock:
        if _connection is None:
            _connection = _Connection()
    return _connection.call(method, args or {}, wait)


# -- the calls --------------------------------------------------------------------------------------

def inspect() -> dict[str, Any]:
    """`session`, `generation`, `placement`, `identity` (platform, arch, hostname, interpreter and
    its version, pid, cwd), `cell` (the store's id of this cell), `time_left` (seconds, or None),
    `memory` (the worker's process tree: `rss` now and its `peak`, bytes, and its `limit`; None for a
    worker elsewhere) and `memory_limit` (bytes, or None)."""
    found: dict[str, Any] = _call("inspect")
    return found


def run(argv: list[str], cwd: str = ".", env: dict[str, str] | None = None, stdin: bytes | str | None = None,
        timeout: float = 60, max_output: int = 1_000_000) -> dict[str, Any]:
    """Run `argv` on the supervisor's machine, in `cwd` inside its workspace, in a process group of
    its own, for at most `timeout` seconds. Returns `exit_code`, `stdout`, `stderr`, `timed_out`,
    `stdout_truncated`, `stderr_truncated` (past `max_output` bytes each) and `duration`."""
    if isinstance(stdin, bytes):
        stdin = stdin.decode("utf-8", "surrogateescape")
    # cell code may pass anything as `timeout` (the supervisor answers a bad one `invalid`)
    wait = timeout + CALL_TIMEOUT if isinstance(timeout, (int, float)) and timeout > 0 else CALL_TIMEOUT  # type: ignore[redundant-expr]
    found: dict[str, Any] = _call("run", {"argv": argv, "cwd": cwd, "env": env, "stdin": stdin, "timeout": timeout,
                                          "max_output": max_output}, wait)
    return found


def put(key: str, value: object) -> None:
    """Keep `value` (anything JSON can hold) under `key`, for this notebook, in the cell log."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError) as e:
        msg = f"the value is not JSON: {e}"
        raise HostError(code="invalid", message=msg) from None
    _call("put", {"key": key, "value": text})


def get(key: str, default: Any = None) -> Any:
    """The value `put` kept under `key` for this notebook, or `default`."""
    found = _call("get", {"key": key})
    return json.loads(found) if isinstance(found, str) else default


def keys() -> list[str]:
    """The keys this notebook has values under."""
    found: list[str] = _call("keys")
    return found


def notify(text: str) -> None:
    """A durable note: an event in the cell log, and a display in this cell's output."""
    _call("notify", {"text": text})


def restart(reason: str) -> None:
    """A fresh generation once this cell ends (the cell itself finishes normally)."""
    _call("restart", {"reason": reason})


def relocate(spec: str) -> None:
    """A generation on placement `spec` (as `%klbr placement` takes it) once this cell ends."""
    _call("relocate", {"spec": spec})
