"""The door: every message from the frontend is checked once, here, as the proxy and ipykernel will
read it, before anything acts on it: a request ipykernel drops unread is never answered (semantics 1),
and holds every shell request queued behind it.

The `Frontend` has verified the signature and decoded the headers. The door checks the rest:

- the header: `msg_id` and `msg_type` non-empty strings, `session` and `username` strings when
  present, `version` a "5.x" string (ipykernel reads a missing one as protocol 4, and its adapter
  then drops the message), no `subshell_id` (klbr offers no subshells);
- every date-like string in the header and parent header parses as ipykernel parses them with
  jupyter_client's `extract_dates` (one that does not makes it drop the message);
- metadata and content are JSON objects (ipykernel calls `metadata.get`), and no part is nested
  deeper than `MAX_NESTING` (ipykernel's parser and its date walk give up near 1000 levels, less
  its own stack, and drop the message without a reply; a header nested 900 deep hung the queue);
- the content fields each request type needs, with their types and ranges (a `cursor_pos` past the
  code makes ipykernel's completer raise, and it never replies).

A message that fails is `Refused`: a request gets an error reply, anything else is dropped and logged.
Nothing the worker could not read is forwarded, because a request the worker silently drops would
leave its reply, and every shell request queued behind it, waiting forever.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dateutil.parser import isoparse
from jupyter_client.jsonutil import ISO8601_PAT

from klbr_supervisor.messages.wire import loads

from ..requests.execute import Execute
from ..requests.request import Request

if TYPE_CHECKING:
    from klbr_supervisor.messages.wire import Wire

# Longest msg_type taken (the longest in the protocol is 24 characters).
_MAX_MSG_TYPE = 100
# Deepest JSON nesting taken in any part (headers are flat; widget states nest a dozen levels).
MAX_NESTING = 100
_VERSION = re.compile(r"^[5-9](\.\d+)*$")

# Content fields the worker reads, with their types, for the requests the proxy queues.
_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "execute_request": {"code": str, "silent": bool, "store_history": bool, "user_expressions": dict,
                        "allow_stdin": bool, "stop_on_error": bool},
    "complete_request": {"code": str, "cursor_pos": int},
    "inspect_request": {"code": str, "cursor_pos": int, "detail_level": int},
    "is_complete_request": {"code": str},
    "history_request": {"output": bool, "raw": bool, "hist_access_type": str, "n": int,
                        "pattern": str, "unique": bool, "session": int, "start": int, "stop": int},
    "comm_info_request": {"target_name": str},
    "input_reply": {"value": str},
    "comm_open": {"comm_id": str, "target_name": str, "data": dict},
    "comm_msg": {"comm_id": str, "data": dict},
    "comm_close": {"comm_id": str, "data": dict},
}
_REQUIRED = {"execute_request": ("code",), "complete_request": ("code", "cursor_pos"),
             "inspect_request": ("code", "cursor_pos"), "is_complete_request": ("code",),
             "input_reply": ("value",), "comm_open": ("comm_id", "target_name"), "comm_msg": ("comm_id",),
             "comm_close": ("comm_id",)}
# ipykernel iterates these when present: null would end in an exception and no reply.
_NOT_NULL = frozenset({"user_expressions"})
_HISTORY_ACCESS = frozenset({"tail", "range", "search"})


class Refused(Exception):  # noqa: N818 — the door's verdict on a message, which dispatch answers; no fault
    """A message the door does not let in; `ename` names the error a request is answered with.
    `answerable` is False when not even its type is usable: it is dropped, and only logged."""

    def __init__(self, why: str, ename: str = "InvalidMessage", answerable: bool = True):
        super().__init__(why)
        self.why = why
        self.ename = ename
        self.answerable = answerable


def admit(channel: str, wire: Wire, *, signed: bool) -> Request:
    """The `Request` for a verified message from the frontend, or `Refused`; `signed`: the
    `Frontend` checked its signature with a key (see `digest`)."""
    header = wire.header
    msg_type = header.get("msg_type")
    if not isinstance(msg_type, str) or not msg_type or len(msg_type) > _MAX_MSG_TYPE:
        msg = "the header's msg_type is not a short non-empty string"
        raise Refused(msg, answerable=False)
    msg_id = header.get("msg_id")
    if not isinstance(msg_id, str) or not msg_id:
        msg = "the header's msg_id is not a non-empty string"
        raise Refused(msg)
    for name in ("session", "username"):
        if not isinstance(header.get(name, ""), str):
            msg = f"the header's {name} is not a string"
            raise Refused(msg)
    version = header.get("version")
    if not isinstance(version, str) or not _VERSION.match(version):
        msg = f"the header's version is {version!r}; klbr speaks protocol 5"
        raise Refused(msg)
    if header.get("subshell_id") is not None:
        msg = "klbr does not offer kernel subshells"
        raise Refused(msg, "SubshellsNotSupported")
    if (_nests(bytes(wire.body[1])) and _too_deep(header)) or (_nests(bytes(wire.body[2])) and _too_deep(wire.parent)):
        msg = f"the header is nested deeper than {MAX_NESTING} levels"
        raise Refused(msg)
    try:
        _check_dates(header)
        _check_dates(wire.parent)
    except (ValueError, OverflowError) as e:
        msg = f"a date in the header does not parse: {e}"
        raise Refused(msg) from None
    body = wire.body
    raw_metadata, raw_content = bytes(body[3]), bytes(body[4])
    try:
        metadata = loads(raw_metadata)
        content = loads(raw_content)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, or nested past the parser's depth
        msg = f"metadata or content is not JSON: {e}"
        raise Refused(msg) from None
    if (_nests(raw_metadata) and _too_deep(metadata)) or (_nests(raw_content) and _too_deep(content)):
        msg = f"metadata or content is nested deeper than {MAX_NESTING} levels"
        raise Refused(msg)
    if not isinstance(metadata, dict):
        msg = "metadata is not a JSON object"
        raise Refused(msg)
    if not isinstance(content, dict):
        msg = "content is not a JSON object"
        raise Refused(msg)
    problem = content_problem(msg_type, content)
    if problem is not None:
        raise Refused(problem)
    execute = Execute(digest=digest(wire, signed)) if msg_type == "execute_request" else None
    return Request(channel, wire, content, execute=execute)


def digest(wire: Wire, signed: bool) -> str:
    """What makes an execute this message and no other (semantics 9): its msg_id alone does not,
    since jupyter_client's `Session.clone()` starts every new client's message counter again.

    Signed, its signature as received: an HMAC over its header, parent, metadata and content, which
    the `Frontend` verified with the key. With no key its signature frame is whatever the client
    put there (often empty), so a sha256 of its header and content as received stands in."""
    if signed:
        return bytes(wire.body[0]).decode("ascii")  # verified equal to a hex digest
    header = bytes(wire.body[1])
    summed = hashlib.sha256(len(header).to_bytes(8, "big"))
    summed.update(header)
    summed.update(bytes(wire.body[4]))
    return "sha256:" + summed.hexdigest()


def _nests(raw: bytes) -> bool:
    """Whether JSON text may nest deeper than `MAX_NESTING`: it has more brackets than that. Two
    counts in C, so a 64 MiB content is not walked for the one check it almost never fails."""
    return raw.count(b"[") + raw.count(b"{") > MAX_NESTING


def _too_deep(value: object) -> bool:
    """Whether decoded JSON nests deeper than `MAX_NESTING`; walked without recursion."""
    level = [value]  # after k rounds: what sits inside k containers
    for _ in range(MAX_NESTING):
        level = [item for v in level if isinstance(v, (dict, list))
                 for item in (v.values() if isinstance(v, dict) else v)]
        if not level:
            return False
    return any(isinstance(v, (dict, list)) for v in level)


def _check_dates(value: object) -> None:
    """Raise ValueError for a string that jupyter_client's `extract_dates` takes for a date (the
    ISO 8601 pattern) and cannot parse; ipykernel runs it on both headers of every message.

    `datetime.fromisoformat` reads every valid string of that pattern (in a few hundred ns);
    what it refuses, dateutil's `isoparse`, which `extract_dates` uses, judges (it also takes 24:00)."""
    if isinstance(value, str):
        if ISO8601_PAT.match(value):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                isoparse(value)
    elif isinstance(value, dict):
        for item in value.values():
            _check_dates(item)
    elif isinstance(value, list):
        for item in value:
            _check_dates(item)


def content_problem(msg_type: str, content: dict[str, Any]) -> str | None:
    """Why a request's content cannot be served, or None when it can."""
    required = _REQUIRED.get(msg_type, ())
    for name in required:
        if name not in content:
            return f"{msg_type} needs '{name}'"
    for name, kind in _FIELDS.get(msg_type, {}).items():
        value = content.get(name)
        if name not in content or (value is None and name not in required and name not in _NOT_NULL):
            continue  # absent (or null where ipykernel treats null as absent): the default applies
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            return f"{msg_type}: '{name}' has the wrong type ({type(value).__name__})"
    if msg_type in ("complete_request", "inspect_request") and not 0 <= content["cursor_pos"] <= len(content["code"]):
        return f"{msg_type}: cursor_pos {content['cursor_pos']} is outside the code (0 to {len(content['code'])})"
    if msg_type == "history_request" and (content.get("hist_access_type") or "tail") not in _HISTORY_ACCESS:
        return f"history_request: hist_access_type must be one of {', '.join(sorted(_HISTORY_ACCESS))}"
    return None
