"""Jupyter messages as frames: the header and parent header decoded, the content left as bytes.

Forwarding needs only the message type, its id and its parent's id; decoding the content (which may
be megabytes of output) and signing it again is what the relay avoids. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from .protocol import DELIM, Frames, MalformedMessage, as_bytes, split

__all__ = ["MalformedMessage", "Wire", "loads"]


# A run of digits as long as 2**63's: an integer orjson may not hold (past 64 bits it gives a float).
# Found with one pass in C: every digit becomes b"0", everything else b"x", and the run is searched
# for as a substring (a regular expression's search tried a match at every digit: 5x the parse).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x78 for i in range(256))
_LONG_RUN = b"0" * 19


def loads(data: bytes) -> Any:
    """`json.loads(data)`, the same value and the same errors, faster: orjson's parse, and where it
    refuses (not JSON, or JSON it does not take: NaN, a lone surrogate, nesting past 1024), the
    standard library's, whose verdict stands. Integers past 64 bits orjson turns into floats
    without a word, so text with 19 digits in a row (a string's too) goes to the standard library
    at once."""
    if _LONG_RUN in data.translate(_DIGITS_AS_ZEROS):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)

# A status's content as jupyter_client spells it (json.dumps; orjson, where installed, drops the
# spaces): matched as bytes, so the busy and idle around every request need no JSON decode.
_STATES = {b'{"execution_state": "busy"}': "busy", b'{"execution_state": "idle"}': "idle",
           b'{"execution_state":"busy"}': "busy", b'{"execution_state":"idle"}': "idle"}


@dataclass(slots=True)
class Wire:
    """One message: routing prefix, the signed body frames, and its decoded headers.

    `body` is ``[hmac, header, parent_header, metadata, content, *buffers]``, exactly as signed.
    """

    prefix: Frames
    body: Frames
    header: dict[str, Any]
    parent: dict[str, Any]
    _content: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, frames: Frames) -> Wire:
        """Received frames cut at the delimiter (`protocol.split`) with their headers decoded; raise
        `MalformedMessage` if they are not a message. The signature is not checked here: a shared-key
        worker's is the frontend's to check, a re-signed worker's was checked by `resign`."""
        prefix, body = split(frames)
        header, parent = body[1], body[2]
        try:
            # Received as bytes on every path a cell takes: checked inline, as `as_bytes` would.
            header = loads(header if type(header) is bytes else as_bytes(header))
            parent = loads(parent if type(parent) is bytes else as_bytes(parent))
        except (ValueError, UnicodeDecodeError) as e:
            msg = f"undecodable header: {e}"
            raise MalformedMessage(msg) from None
        if not isinstance(header, dict) or not isinstance(parent, dict):
            msg = "header is not an object"
            raise MalformedMessage(msg)
        return cls(prefix, body, header, parent)

    @property
    def msg_type(self) -> str:
        # A peer's JSON: a str by the protocol, taken as such, as jupyter_client does.
        value: str = self.header.get("msg_type", "")
        return value

    @property
    def msg_id(self) -> str:
        value: str = self.header.get("msg_id", "")
        return value

    @property
    def parent_id(self) -> str:
        value: str = self.parent.get("msg_id", "")
        return value

    @property
    def content(self) -> dict[str, Any]:
        """The decoded content, on demand (replies whose status matters, stdin requests)."""
        if self._content is None:
            content = self.body[4]
            self._content = loads(content if type(content) is bytes else as_bytes(content))
        return self._content

    @property
    def execution_state(self) -> Any:
        """A status message's `execution_state`: read from its content's bytes when they are
        spelled as above, else decoded (whatever JSON the worker sent)."""
        content = self.body[4]
        state = _STATES.get(content if type(content) is bytes else as_bytes(content))
        return state if state is not None else self.content.get("execution_state")

    def frames(self) -> Frames:
        """Frames to send on a DEALER toward a worker, or after a frontend identity."""
        return [DELIM, *self.body]
