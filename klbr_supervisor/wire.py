"""Jupyter messages as frames: the header and parent header decoded, the content left as bytes.

Forwarding needs only the message type, its id and its parent's id; decoding the content (which may
be megabytes of output) and signing it again is what the relay avoids. See DESIGN.md, data flow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .protocol import DELIM, MalformedMessage, as_bytes, split

__all__ = ["MalformedMessage", "Wire"]


@dataclass(slots=True)
class Wire:
    """One message: routing prefix, the signed body frames, and its decoded headers.

    `body` is ``[hmac, header, parent_header, metadata, content, *buffers]``, exactly as signed.
    """

    prefix: list
    body: list
    header: dict
    parent: dict
    _content: dict | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, frames: list) -> Wire:
        """Received frames cut at the delimiter (`protocol.split`) with their headers decoded; raise
        `MalformedMessage` if they are not a message. The signature is not checked here: a shared-key
        worker's is the frontend's to check, a re-signed worker's was checked by `resign`."""
        prefix, body = split(frames)
        try:
            header = json.loads(as_bytes(body[1]))
            parent = json.loads(as_bytes(body[2]))
        except (ValueError, UnicodeDecodeError) as e:
            raise MalformedMessage(f"undecodable header: {e}") from None
        if not isinstance(header, dict) or not isinstance(parent, dict):
            raise MalformedMessage("header is not an object")
        return cls(prefix, body, header, parent)

    @property
    def msg_type(self) -> str:
        return self.header.get("msg_type", "")

    @property
    def msg_id(self) -> str:
        return self.header.get("msg_id", "")

    @property
    def parent_id(self) -> str:
        return self.parent.get("msg_id", "")

    @property
    def content(self) -> dict:
        """The decoded content, on demand (replies whose status matters, stdin requests)."""
        if self._content is None:
            self._content = json.loads(as_bytes(self.body[4]))
        return self._content

    def frames(self) -> list:
        """Frames to send on a DEALER toward a worker, or after a frontend identity."""
        return [DELIM, *self.body]
