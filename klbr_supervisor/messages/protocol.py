"""The Jupyter wire protocol's frames: cut at the delimiter, and the signature checked, in one place.

Every side that receives frames uses `split` and `verify`: the frontend's sockets
(`klbr_kernel.frontend.sockets`, and before them the stand-in, which must judge a message as the
`Frontend` will once it takes over), a worker's messages (`wire.Wire.parse`) and a re-signed
worker's (`generation.resign`). The signatures are jupyter_client's `Session.sign` wherever
jupyter_client is imported; `Signer` makes the same ones for the stand-in, which answers before it is.

Standard library only: `klbr_kernel.frontend.standin` imports it before anything heavy
(jupyter_client alone costs 120-300 ms there; docs/ARCHITECTURE.md, "Early front").
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

# Separates a message's routing prefix from its signed body (jupyter_client's Session.DELIM).
DELIM = b"<IDS|MSG>"

Sign = Callable[[list[bytes]], bytes]
# Received frames: bytes, or `zmq.Frame` (not imported here: standard library only, see above).
Frames = list[Any]


class MalformedMessage(ValueError):  # noqa: N818 — public name caught across both packages and tests
    """Frames that are not a Jupyter message (no delimiter, missing parts, undecodable header)."""


class BadSignature(MalformedMessage):
    """A message that is not signed by the key it must be signed with."""


def as_bytes(frame: Any) -> bytes:
    """A received frame's bytes (a `zmq.Frame`, or bytes already)."""
    if type(frame) is bytes:  # received with copy=True: the common case, asked first
        return frame
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def split(frames: Frames) -> tuple[Frames, Frames]:
    """Received frames cut at the delimiter: (routing prefix, body), the body being
    ``[signature, header, parent_header, metadata, content, *buffers]`` as signed. No frame is
    copied (only one of the delimiter's length is read, to compare it). Raises `MalformedMessage`
    when there is no delimiter or fewer than five frames follow it."""
    try:
        i = frames.index(DELIM)  # frames received as bytes: one comparison each, in C
    except ValueError:  # none among the bytes; a small frame may still be a `zmq.Frame`
        found = [i for i, frame in enumerate(frames) if len(frame) == len(DELIM) and as_bytes(frame) == DELIM]
        if not found:
            msg = "no <IDS|MSG> delimiter"
            raise MalformedMessage(msg) from None
        i = found[0]
    body = frames[i + 1 :]
    if len(body) < 5:
        msg = f"{len(body)} frames after the delimiter, at least 5 expected"
        raise MalformedMessage(msg)
    return frames[:i], body


def verify(body: Frames, sign: Sign | None, *, views: bool = False) -> list[Any]:
    """The four signed parts of `body` (header, parent header, metadata, content) as bytes, once its
    signature is what `sign` makes of them; `sign` None: no key, nothing to check. Raises
    `BadSignature` (as jupyter_client's `Session.deserialize` refuses an unsigned or invalid one).
    `views`: metadata and content received as frames (64 KiB or more) are memoryviews of them,
    not copies (what is only signed again and forwarded: a 50 MiB output is not copied)."""
    parts: list[Any]
    if views:
        parts = [frame if type(frame) is bytes else as_bytes(frame) for frame in body[1:3]]
        parts += [frame if type(frame) is bytes else memoryview(frame) for frame in body[3:5]]
    else:
        parts = [frame if type(frame) is bytes else as_bytes(frame) for frame in body[1:5]]
    if sign is not None:
        signature = as_bytes(body[0])
        if not signature:
            msg = "unsigned message"
            raise BadSignature(msg)
        if not hmac.compare_digest(signature, sign(parts)):
            msg = "invalid signature"
            raise BadSignature(msg)
    return parts


class Signer:
    """`Session.sign` with the standard library only, for the stand-in: the HMAC of the
    connection file's key and scheme over a message's four signed parts."""

    def __init__(self, key: bytes, signature_scheme: str = "hmac-sha256"):
        self._auth = hmac.new(key, digestmod=signature_scheme.split("-", 1)[1]) if key else None

    @property
    def keyed(self) -> bool:
        """Whether there is a key (without one, messages are not signed, and not checked)."""
        return self._auth is not None

    def sign(self, parts: list[bytes]) -> bytes:
        if self._auth is None:
            return b""
        h = self._auth.copy()
        for part in parts:
            h.update(part)
        return h.hexdigest().encode()
