"""Between a worker with a key of its own and the proxy, which speaks with the frontend's key.

A worker that does not run on this machine under this user (a `kernelspec:` placement, any
provisioner) never learns the frontend's key: it gets a fresh one per generation. Its messages are
verified with that key, given the proxy's session id in their header, and signed with the frontend's
key; what goes to it is signed with its key. Everything past the generation sees messages exactly as
a shared-key worker sends them (DESIGN.md, placement: keys). Content and buffers are never decoded.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.session import Session

from .protocol import DELIM, BadSignature, Frames, as_bytes, split, verify

__all__ = ["BadSignature", "Resigner", "take_key"]


class Resigner:
    def __init__(self, worker: Session, frontend: Session):
        """`worker` holds the generation's key (after the launch: a provisioner may have set it)."""
        self.worker = worker
        self.frontend = frontend
        # A worker started with the proxy's session id (ssh://: `--Session.session`) writes it in
        # every header as jupyter_client packs JSON (with the standard library's spaces, or none
        # where orjson is installed): such a header goes on as it is, unparsed.
        self._ours = (f'"session": "{frontend.session}"'.encode(), f'"session":"{frontend.session}"'.encode())

    def from_worker(self, frames: Frames) -> Frames:
        """Frames as the worker sent them -> frames as a shared-key worker would have sent them.
        Raises `BadSignature` (not its generation's key), or another `MalformedMessage` for frames
        that are no message."""
        prefix, body = split(frames)
        header, parent, metadata, content = verify(body, self.worker.sign if self.worker.auth is not None else None)
        if not ((self._ours[0] in header or self._ours[1] in header) and header.count(b'"session"') == 1):
            parsed = json.loads(header)
            parsed["session"] = self.frontend.session
            header = json.dumps(parsed).encode()
        signed = [header, parent, metadata, content]
        return [*prefix, DELIM, self.frontend.sign(signed), *signed, *body[5:]]

    def to_worker(self, frames: Frames) -> Frames:
        """``[DELIM, hmac, header, parent, metadata, content, *buffers]`` signed with the frontend's
        key (or by the proxy) -> the same message signed with the generation's key."""
        signed = [as_bytes(f) for f in frames[2:6]]
        return [DELIM, self.worker.sign(signed), *signed, *frames[6:]]


def take_key(session: Session, info: dict[str, Any]) -> None:
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
