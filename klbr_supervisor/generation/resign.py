"""Between a worker with a key of its own and the proxy, which speaks with the frontend's key.

A worker that does not run on this machine under this user (a `kernelspec:` placement, any
provisioner) never learns the frontend's key: it gets a fresh one per generation. Its messages are
verified with that key, given the proxy's session id in their header, and signed with the frontend's
key; what goes to it is signed with its key. Everything past the generation sees messages exactly as
a shared-key worker sends them (docs/placement.md, keys). Content and buffers are never decoded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_client.session import Session

from ..messages.protocol import DELIM, BadSignature, Frames, as_bytes, split, verify

__all__ = ["BadSignature", "Resigner", "take_key"]

# A session id that JSON writes as it is (jupyter_client's are uuids).
_PLAIN = re.compile(r"[\w.-]+", re.ASCII)


class Resigner:
    def __init__(self, worker: Session, frontend: Session):
        """`worker` holds the generation's key (after the launch: a provisioner may have set it)."""
        self.worker = worker
        self.frontend = frontend
        # A worker started with the proxy's session id (ssh://: `--Session.session`) writes it in
        # every header as jupyter_client packs JSON (with the standard library's spaces, or none
        # where orjson is installed): such a header goes on as it is, unparsed.
        self._ours = (f'"session": "{frontend.session}"'.encode(), f'"session":"{frontend.session}"'.encode())
        # A worker with a session id of its own (a kernelspec's) writes that one in every header: once
        # it is known, as the worker spells it, it is replaced in the bytes (a header decoded and
        # encoded again cost each message more than its two signatures).
        self._theirs: tuple[bytes, bytes] | None = None

    def from_worker(self, frames: Frames) -> Frames:
        """Frames as the worker sent them -> frames as a shared-key worker would have sent them.
        Raises `BadSignature` (not its generation's key), or another `MalformedMessage` for frames
        that are no message."""
        prefix, body = split(frames)
        header, parent, metadata, content = verify(body, self.worker.sign if self.worker.auth is not None else None,
                                                   views=True)
        if not ((self._ours[0] in header or self._ours[1] in header) and header.count(b'"session"') == 1):
            theirs = self._theirs
            if theirs is not None and theirs[0] in header and header.count(b'"session"') == 1:
                header = header.replace(theirs[0], theirs[1])
            else:
                header = self._with_our_session(header)
        signed = [header, parent, metadata, content]
        return [*prefix, DELIM, self.frontend.sign(signed), *signed, *body[5:]]

    def _with_our_session(self, header: bytes) -> bytes:
        """The header with the proxy's session id, decoded and encoded again; and the worker's own
        id, as it spells it, learnt for the next header (both plain ids, nothing JSON escapes)."""
        parsed = json.loads(header)
        theirs = parsed.get("session")
        ours = self.frontend.session
        if isinstance(theirs, str) and _PLAIN.fullmatch(theirs) and _PLAIN.fullmatch(ours):
            for spelling in ('"session": "{}"', '"session":"{}"'):
                if spelling.format(theirs).encode() in header:
                    self._theirs = (spelling.format(theirs).encode(), spelling.format(ours).encode())
        parsed["session"] = ours
        return json.dumps(parsed).encode()

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
