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
OPS = frozenset({"hello", "cells", "unfollow", "restart", "plan", "notebook", "restored", "generations"})
MAX_COMMS = 64  # klbr comms open at once; opening one more closes the oldest (a page gone for good)
MAX_COMM_ID = 256  # characters of a comm id answered (longer ones are dropped: echoing them costs)
MAX_REQUEST_ID = 64
MAX_CELL_IDS = 100_000
MAX_PATH = 4096  # characters of a notebook path (PATH_MAX)
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


def _cell_ids(value: object, name: str = "cell_ids") -> list[str]:
    """A list of nbformat 4.5 cell ids."""
    if not isinstance(value, list):
        msg = f"'{name}' is a list"
        raise MalformedRequest(msg)
    if len(value) > MAX_CELL_IDS:
        msg = f"at most {MAX_CELL_IDS} cell ids in one request"
        raise TooLarge(msg)
    if not all(isinstance(c, str) and _CELL_ID.match(c) for c in value):
        msg = "a cell id is 1 to 64 characters of a-z, A-Z, 0-9, - and _"
        raise MalformedRequest(msg)
    return value


def _record_ids(value: object) -> list[int]:
    """A list of the store's cell ids."""
    if not isinstance(value, list):
        msg = "'record_ids' is a list"
        raise MalformedRequest(msg)
    if len(value) > MAX_CELL_IDS:
        msg = f"at most {MAX_CELL_IDS} cell ids in one request"
        raise TooLarge(msg)
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        msg = "a record id is an integer (the store's cells.id)"
        raise MalformedRequest(msg)
    return value


def _path(value: object, name: str) -> str:
    """A path: a string of 1 to `MAX_PATH` characters, no NUL."""
    if not isinstance(value, str) or not value.strip("/") or "\0" in value:
        msg = f"'{name}' is a path: a string, not empty, with no NUL"
        raise MalformedRequest(msg)
    if len(value) > MAX_PATH:
        msg = f"'{name}' has at most {MAX_PATH} characters"
        raise TooLarge(msg)
    return value


@dataclass(frozen=True)
class NotebookRequest:
    """A `notebook` request, checked: where the notebook is now (its path as the server's API
    names it, and the server's root if the page knows it), and the ids of the cells it holds."""

    path: str
    cell_ids: list[str]
    server_root: str | None

    @classmethod
    def parse(cls, data: Json) -> NotebookRequest:
        root = data.get("server_root")
        return cls(_path(data.get("path"), "path"), _cell_ids(data.get("cell_ids", [])),
                   _path(root, "server_root") if root not in (None, "") else None)


def restored_ids(data: Json) -> list[int]:
    """The record ids a `restored` request names."""
    return _record_ids(data.get("record_ids", []))


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
        cell_ids, record_ids = _cell_ids(data.get("cell_ids", [])), _record_ids(data.get("record_ids", []))
        if len(cell_ids) + len(record_ids) > MAX_CELL_IDS:
            msg = f"at most {MAX_CELL_IDS} cell ids in one request"
            raise TooLarge(msg)
        flags = {name: data.get(name, False) for name in ("previous_sessions", "follow")}
        if not all(isinstance(v, bool) for v in flags.values()):
            msg = "'previous_sessions' and 'follow' are true or false"
            raise MalformedRequest(msg)
        limit = data.get("max_chunk_bytes")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            msg = "'max_chunk_bytes' is an integer"
            raise MalformedRequest(msg)
        return cls(cell_ids, record_ids, flags["previous_sessions"], flags["follow"], chunk_limit(limit))
