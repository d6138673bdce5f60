"""The wire protocol's frames as `klbr_supervisor.messages.protocol` cuts and signs them, against jupyter_client."""

from __future__ import annotations

import pytest
import zmq
from jupyter_client.session import Session

from klbr_supervisor.messages.protocol import DELIM, BadSignature, MalformedMessage, Signer, split, verify


@pytest.mark.parametrize("scheme", ["hmac-sha256", "hmac-sha512"])
@pytest.mark.parametrize("size", [0, 100, 65_535, 65_536, 3 * 2**20])
def test_signer_signs_as_the_session_signs(scheme, size):
    """The stand-in signs as the `Session` does, the parts as bytes or as views of received buffers."""
    session = Session(key=b"a key", signature_scheme=scheme)
    parts = [b'{"msg_id": "1"}', b"{}", b"{}", b"x" * size]
    sign = Signer(session.key, scheme).sign
    assert sign(parts) == session.sign(parts)
    assert sign([memoryview(part) for part in parts]) == session.sign(parts)


def test_a_signer_without_a_key_signs_nothing():
    assert Signer(b"").sign([b"{}", b"{}", b"{}", b"{}"]) == b"" == Session(key=b"").sign([b"{}"])


def test_split_and_verify_take_what_jupyter_client_sends_and_refuse_the_rest():
    session = Session(key=b"k")
    frames = [b"ident", *session.serialize(session.msg("status", {"execution_state": "idle"}))]
    prefix, body = split(frames)
    assert prefix == [b"ident"] and len(body) == 5
    header, parent, metadata, content = verify(body, Signer(b"k").sign)
    assert content == b'{"execution_state":"idle"}' or content == b'{"execution_state": "idle"}'
    with pytest.raises(BadSignature):
        verify(body, Signer(b"another key").sign)
    with pytest.raises(MalformedMessage):
        split([b"ident", *body])  # no delimiter
    with pytest.raises(MalformedMessage):
        split([DELIM, b"sig", b"{}"])  # too few parts


def test_received_frames_are_cut_and_verified_as_bytes_are_and_viewed_without_a_copy():
    """Frames as a non-copying receive hands them (`zmq.Frame`, the delimiter one too) are cut at
    the delimiter as bytes are; with `views`, a large content is a view of its frame, not a copy."""
    session = Session(key=b"k")
    content = {"text": "x" * 100_000}
    frames = [zmq.Frame(f) for f in [b"ident", *session.serialize(session.msg("stream", content))]]
    prefix, body = split(frames)
    assert [bytes(f) for f in prefix] == [b"ident"] and len(body) == 5
    header, _, _, viewed = verify(body, Signer(b"k").sign, views=True)
    assert isinstance(header, bytes) and isinstance(viewed, memoryview)
    assert bytes(viewed) == body[4].bytes and session.unpack(bytes(viewed)) == content
