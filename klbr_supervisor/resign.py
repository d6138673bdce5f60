"""Between a worker with a key of its own and the proxy, which speaks with the frontend's key.

A worker that does not run on this machine under this user (a `kernelspec:` placement, any
provisioner) never learns the frontend's key: it gets a fresh one per generation. Its messages are
verified with that key, given the proxy's session id in their header, and signed with the frontend's
key; what goes to it is signed with its key. Everything past the generation sees messages exactly as
a shared-key worker sends them (DESIGN.md, placement: keys). Content and buffers are never decoded.
"""

from __future__ import annotations

import json
from hmac import compare_digest

from jupyter_client.session import Session

from .protocol import DELIM


def _bytes(frame) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


class BadSignature(ValueError):
    """A worker message whose signature its generation's key does not match."""


class Resigner:
    def __init__(self, worker: Session, frontend: Session):
        """`worker` holds the generation's key (after the launch: a provisioner may have set it)."""
        self.worker = worker
        self.frontend = frontend
        # A worker started with the proxy's session id (ssh://: `--Session.session`) writes it in
        # every header as jupyter_client packs JSON: such a header goes on as it is, unparsed.
        self._ours = f'"session": "{frontend.session}"'.encode()

    def from_worker(self, frames: list) -> list:
        """Frames as the worker sent them -> frames as a shared-key worker would have sent them.
        Raises `BadSignature`, or ValueError for frames that are no message."""
        for i, frame in enumerate(frames):
            if len(frame) == len(DELIM) and _bytes(frame) == DELIM:
                break
        else:
            raise ValueError("no <IDS|MSG> delimiter")
        body = [_bytes(f) for f in frames[i + 1 : i + 6]]
        if len(body) < 5:
            raise ValueError(f"{len(body)} frames after the delimiter, at least 5 expected")
        if not compare_digest(body[0], self.worker.sign(body[1:5])):
            raise BadSignature("signature does not match the generation's key")
        header = body[1]
        if not (self._ours in header and header.count(b'"session"') == 1):
            parsed = json.loads(header)
            parsed["session"] = self.frontend.session
            header = json.dumps(parsed).encode()
        signed = [header, body[2], body[3], body[4]]
        return [*frames[:i], DELIM, self.frontend.sign(signed), *signed, *frames[i + 6 :]]

    def to_worker(self, frames: list) -> list:
        """``[DELIM, hmac, header, parent, metadata, content, *buffers]`` signed with the frontend's
        key (or by the proxy) -> the same message signed with the generation's key."""
        signed = [_bytes(f) for f in frames[2:6]]
        return [DELIM, self.worker.sign(signed), *signed, *frames[6:]]


def take_key(session, info: dict) -> None:
    """The key and scheme a worker signs with, as its launch reports them, into its `session`: a
    provisioner's launcher may choose its own (gateway_provisioners' do)."""
    key = info.get("key")
    if isinstance(key, str):
        key = key.encode("ascii")
    if isinstance(key, bytes) and key and key != session.key:
        session.key = key
    scheme = info.get("signature_scheme")
    if isinstance(scheme, str) and scheme.startswith("hmac-") and scheme != session.signature_scheme:
        session.signature_scheme = scheme
