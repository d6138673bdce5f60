"""What a `klbr` comm request may be (docs/comm-protocol.md): the protocol's version and ops, its
bounds, the named errors a request that is not what the protocol says gets, and the checks that
raise them. Nothing here sends or reads anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .restore import Json, chunk_limit

TARGET = "klbr"
PROTOCOL = 1
OPS = frozenset({"hello", "cells", "unfollow", "restart", "plan"})
MAX_COMMS = 64  # klbr comms open at once; opening one more closes the oldest (a page gone for good)
MAX_COMM_ID = 256  # characters of a comm id answered (longer ones are dropped: echoing them costs)
MAX_REQUEST_ID = 64
MAX_CELL_IDS = 100_000
_CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class CommError(Exception):
    """A comm request the proxy does not serve. Each kind is a subclass, whose name is what the
    frontend sees (stable: the protocol's error names); the text says what is wrong."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def message(self) -> str:
        return str(self)


class UnsupportedVersion(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """The request speaks another version of the protocol."""


class MalformedRequest(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """A field is missing, or of the wrong type or shape."""


class UnknownOp(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """No such op."""


class TooLarge(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """A field past its bound."""


class NotRecording(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """The cell log is not available in this session."""


def speaks(version: object) -> bool:
    """Whether `version` is this protocol's: the integer itself, not True, not 1.0."""
    return type(version) is int and version == PROTOCOL


def unsupported(version: object) -> CommError:
    shown = repr(version)[:40] if isinstance(version, (str, int, float)) or version is None else type(version).__name__
    return UnsupportedVersion(f"this kernel speaks klbr comm protocol {PROTOCOL}, not {shown}")


def op_of(data: Json) -> str:
    """The request's op, one of `OPS`."""
    op = data.get("op")
    if not isinstance(op, str) or op not in OPS:
        shown = op[:40] if isinstance(op, str) else type(op).__name__
        msg = f"no op {shown!r}: the ops are {', '.join(sorted(OPS))}"
        raise UnknownOp(msg)
    return op


def request_id(value: object) -> str | int:
    """The request's own id, echoed in every answer to it: a bounded string, or an integer that
    JavaScript holds exactly."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        msg = "a request needs 'id', a string or an integer of its own choosing"
        raise MalformedRequest(msg)
    if isinstance(value, str) and len(value) > MAX_REQUEST_ID:
        msg = f"a request id has at most {MAX_REQUEST_ID} characters"
        raise TooLarge(msg)
    if isinstance(value, int) and abs(value) >= 2**53:
        msg = "a request id is an integer JavaScript can hold exactly"
        raise TooLarge(msg)
    return value


def unfollow_target(data: Json) -> str:
    """The msg_id an `unfollow` names."""
    msg_id = data.get("msg_id")
    if not isinstance(msg_id, str):
        msg = "unfollow needs 'msg_id', a string"
        raise MalformedRequest(msg)
    return msg_id


@dataclass(frozen=True)
class CellsRequest:
    """A `cells` request, checked: which cells, from which sessions, followed or not, in chunks of
    at most how many bytes."""

    cell_ids: list[str]
    record_ids: list[int]
    previous_sessions: bool
    follow: bool
    max_chunk_bytes: int

    @classmethod
    def parse(cls, data: Json) -> CellsRequest:
        cell_ids, record_ids = data.get("cell_ids", []), data.get("record_ids", [])
        if not isinstance(cell_ids, list) or not isinstance(record_ids, list):
            msg = "'cell_ids' and 'record_ids' are lists"
            raise MalformedRequest(msg)
        if len(cell_ids) + len(record_ids) > MAX_CELL_IDS:
            msg = f"at most {MAX_CELL_IDS} cell ids in one request"
            raise TooLarge(msg)
        if not all(isinstance(c, str) and _CELL_ID.match(c) for c in cell_ids):
            msg = "a cell id is 1 to 64 characters of a-z, A-Z, 0-9, - and _"
            raise MalformedRequest(msg)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in record_ids):
            msg = "a record id is an integer (the store's cells.id)"
            raise MalformedRequest(msg)
        flags = {name: data.get(name, False) for name in ("previous_sessions", "follow")}
        if not all(isinstance(v, bool) for v in flags.values()):
            msg = "'previous_sessions' and 'follow' are true or false"
            raise MalformedRequest(msg)
        limit = data.get("max_chunk_bytes")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            msg = "'max_chunk_bytes' is an integer"
            raise MalformedRequest(msg)
        return cls(cell_ids, record_ids, flags["previous_sessions"], flags["follow"], chunk_limit(limit))
