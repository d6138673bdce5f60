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
token and a key (and, for a TCP endpoint, the server's CurveZMQ key: the channel is encrypted);
every request is signed with the key (HMAC-SHA256 over the payload), carries the token, a call id and the msg_id of the cell it runs under, and every reply is signed the same way.
A call that gets no reply in time is sent again with the same call id: the supervisor answers a
repeated id from its record and carries out each call once. Calls are safe from several threads at
once (a socket per thread); work handed to another thread carries the cell it was handed over in
(see `handovers`), so a thread that outlives its cell is told `not_running`.

Wire format, both ways: [PROTOCOL, signature, payload]; payload is JSON. A request:
{"call", "token", "cell", "method", "args"}; a reply: {"call", "ok": true, "result"} or
{"call", "ok": false, "code", "message"}.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

import zmq
import zmq.utils.monitor

from .handovers import cell

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
        payload = json.dumps({"call": call_id, "token": self.token, "cell": cell(), "method": method,
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
