"""Jupyter messages as frames: the header and parent header decoded, the content left as bytes.

Forwarding needs only the message type, its id and its parent's id; decoding the content (which may
be megabytes of output) and signing it again is what the relay avoids. See DESIGN.md, data flow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .protocol import DELIM


class MalformedMessage(ValueError):
    """Frames that are not a Jupyter message (no delimiter, missing parts, undecodable header)."""


def _bytes(frame) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


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
        """Split received frames at the delimiter; raise `MalformedMessage` if they are not a message."""
        for i, frame in enumerate(frames):
            if len(frame) == len(DELIM) and _bytes(frame) == DELIM:
                break
        else:
            raise MalformedMessage("no <IDS|MSG> delimiter")
        body = frames[i + 1 :]
        if len(body) < 5:
            raise MalformedMessage(f"{len(body)} frames after the delimiter, at least 5 expected")
        try:
            header = json.loads(_bytes(body[1]))
            parent = json.loads(_bytes(body[2]))
        except (ValueError, UnicodeDecodeError) as e:
            raise MalformedMessage(f"undecodable header: {e}") from None
        if not isinstance(header, dict) or not isinstance(parent, dict):
            raise MalformedMessage("header is not an object")
        return cls(frames[:i], body, header, parent)

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
            self._content = json.loads(_bytes(self.body[4]))
        return self._content

    def frames(self) -> list:
        """Frames to send on a DEALER toward a worker, or after a frontend identity."""
        return [DELIM, *self.body]
