"""The supervisor's end of the host channel: one ROUTER socket, a token and a key per generation.

Each generation's worker gets, in its environment, the endpoint, its own token and its own key
(`credentials`). A request is [PROTOCOL, signature, payload] (see `klbr_kernel.host`, whose wire
format this speaks: the client imports only the standard library and pyzmq, so it cannot import
these constants). What fails the frame, size or signature checks is dropped and counted, never
answered: an unsigned answer would teach a forger nothing, and a signed one needs the key.
A token of an ended generation keeps its key, so its late callers are told `stale_generation`.

One socket for every generation (on an ipc path in the kernel's 0700 runtime directory), so a
placement on another host forwards one path; a token and a key per generation keep generations apart.
For kernels of provisioners of their own, which may run wherever their sockets reach, a second
socket on TCP (`listen_tcp`, bound on first use), CurveZMQ on: encrypted, and the server known to
the client by its public key; the requests on it are checked and answered exactly as on the first.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import zmq

from ..messages.sockets import LoopSocket

PROTOCOL = b"klbr-host/1"
MAX_REQUEST = 2**20  # bytes of payload a request may have (the client says `too_large` past it)
_RETIRED = 64  # ended generations whose tokens are still recognised (and told `stale_generation`)


class Result(TypedDict):
    """The answer to a call carried out: `result` is what the call returns to the cell (JSON)."""

    call: str
    ok: Literal[True]
    result: object


class Refusal(TypedDict):
    """The answer to a call refused (or that failed), with its wire code; `call` is None when the
    request had no call id."""

    call: str | None
    ok: Literal[False]
    code: str
    message: str


Reply = Result | Refusal
# A request as it came (parsed JSON, its token checked): its fields are checked where they are used.
Request = dict[str, Any]


@dataclass(frozen=True)
class Credentials:
    """What a generation's worker gets in its environment to call its supervisor."""

    endpoint: str
    token: str
    key: str

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> Credentials:
        return cls(environ["KLBR_HOST_ENDPOINT"], environ["KLBR_HOST_TOKEN"], environ["KLBR_HOST_KEY"])

    def environ(self) -> dict[str, str]:
        return {"KLBR_HOST_ENDPOINT": self.endpoint, "KLBR_HOST_TOKEN": self.token, "KLBR_HOST_KEY": self.key}


@dataclass(frozen=True)
class TcpListener:
    """The host channel's TCP socket: where it listens, and its CurveZMQ public key (Z85)."""

    endpoint: str
    server_key: str


def sign(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode()


@dataclass(frozen=True)
class Answer:
    """`answer(reply)` signs and sends `reply` to the caller; two answers to one caller (the same
    ROUTER identity: a client sending its call again) are equal, so a call is answered once each."""

    send: Callable[[bytes, bytes, Reply], None]
    identity: bytes
    key: bytes

    def __call__(self, reply: Reply) -> None:
        self.send(self.identity, self.key, reply)


class HostChannel:
    """Created by the `HostService` on the loop; `handle(token, request, answer)` gets each request
    whose token is known and whose signature holds, with its `Answer`."""

    def __init__(self, endpoint: str, context: zmq.Context[zmq.Socket[bytes]],
                 handle: Callable[[str, Request, Answer], None], log: logging.Logger):
        self.endpoint = endpoint
        self._keys: dict[str, bytes] = {}  # token -> key, of live and recently ended generations
        self._retired: list[str] = []
        self._handle = handle
        self._log = log
        self.dropped = 0
        self._context = context
        self._channels: dict[str, LoopSocket] = {}
        # One sender per socket, made once: a caller's answers stay equal (`Answer`).
        self._senders: dict[str, Callable[[bytes, bytes, Reply], None]] = {}
        self.tcp: TcpListener | None = None
        self._listen("host", self._router(), endpoint)

    def _router(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        sock.linger = 0
        sock.router_mandatory = 1  # a caller gone is a reply dropped, and said so
        return sock

    def _listen(self, name: str, sock: zmq.Socket[bytes], endpoint: str) -> str:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close()
            raise
        self._channels[name] = LoopSocket(name, sock, functools.partial(self._received, name))
        self._senders[name] = functools.partial(self._send, name)
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))

    def listen_tcp(self, ip: str) -> TcpListener:
        """The TCP socket, bound on `ip` (a port of the system's choosing) the first time it is
        asked for; raises `zmq.ZMQError` when it cannot be bound."""
        if self.tcp is None:
            public, secret = zmq.curve_keypair()
            sock = self._router()
            sock.curve_server = True
            sock.curve_secretkey = secret
            endpoint = self._listen("host-tcp", sock, f"tcp://{ip}:0")
            self.tcp = TcpListener(endpoint, public.decode("ascii"))
        return self.tcp

    def admit(self, credentials: Credentials) -> None:
        self._keys[credentials.token] = credentials.key.encode()

    def retire(self, token: str) -> None:
        """Its generation ended: calls with its token are answered `stale_generation` for a while."""
        self._retired.append(token)
        while len(self._retired) > _RETIRED:
            self._keys.pop(self._retired.pop(0), None)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def _received(self, name: str, frames: list[zmq.Frame]) -> None:
        if len(frames) != 4 or frames[1].bytes != PROTOCOL:
            return self._drop("not a host request")
        identity, signature, payload = frames[0].bytes, frames[2].bytes, frames[3].bytes
        if len(payload) > MAX_REQUEST:  # the client refuses to send one (too_large): this is no client
            return self._drop(f"payload over {MAX_REQUEST} bytes")
        try:
            request = json.loads(payload)
        except ValueError:
            return self._drop("payload is not JSON")
        if not isinstance(request, dict) or not isinstance(request.get("token"), str):
            return self._drop("payload is not a request")
        key = self._keys.get(request["token"])
        if key is None or not hmac.compare_digest(signature, sign(key, payload)):
            return self._drop("unknown token or bad signature")
        self._handle(request["token"], request, Answer(self._senders[name], identity, key))

    def _send(self, name: str, identity: bytes, key: bytes, reply: Reply) -> None:
        """Answer on the socket the request came in on."""
        payload = json.dumps(reply).encode()
        if not self._channels[name].send([identity, PROTOCOL, sign(key, payload), payload], copy=True):
            self._log.info("host: the caller of %s is gone; its answer is dropped", reply.get("call"))

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # the 1st, 2nd, 4th, 8th...: rate-limited
            self._log.warning("host channel: dropped a request (%s); %d dropped so far", why, self.dropped)
