"""A frontend request as the proxy tracks it, and how each message type is routed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from klbr_supervisor.store import CellRecord
from klbr_supervisor.wire import Wire

if TYPE_CHECKING:
    from klbr_supervisor.generation import Generation

    from .magics import Magic

# Shell requests the proxy queues and forwards one at a time, as ipykernel serves them.
QUEUED = frozenset(
    {
        "execute_request",
        "complete_request",
        "inspect_request",
        "is_complete_request",
        "history_request",
        "comm_info_request",
    }
)
# Sent on at once, never held behind a running execute (ipykernel serves comms during async cells).
# Unknown types go this way too: the worker answers them with busy/idle only, as ipykernel does.
COMM = frozenset({"comm_open", "comm_msg", "comm_close"})
# Answered by the proxy itself, on whichever channel they arrive.
OWN = frozenset({"kernel_info_request", "shutdown_request", "interrupt_request"})
SUBSHELL = frozenset({"create_subshell_request", "list_subshell_request", "delete_subshell_request"})


# Content fields the worker needs, with their types, for the requests the proxy queues. A request the
# worker would choke on (ipykernel logs the exception and never replies) is answered InvalidMessage.
_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "execute_request": {"code": str, "silent": bool, "store_history": bool, "user_expressions": dict,
                        "allow_stdin": bool, "stop_on_error": bool},
    "complete_request": {"code": str, "cursor_pos": int},
    "inspect_request": {"code": str, "cursor_pos": int, "detail_level": int},
    "is_complete_request": {"code": str},
    "history_request": {"output": bool, "raw": bool, "hist_access_type": str, "n": int,
                        "pattern": str, "unique": bool, "session": int, "start": int, "stop": int},
    "comm_info_request": {"target_name": str},
}
# ipykernel iterates these when present: null would end in an exception and no reply.
_NOT_NULL = frozenset({"user_expressions"})
_REQUIRED = {"execute_request": ("code",), "complete_request": ("code", "cursor_pos"),
             "inspect_request": ("code", "cursor_pos"), "is_complete_request": ("code",)}


def content_problem(msg_type: str, content: dict) -> str | None:
    """Why a queued request's content cannot be served, or None when it can."""
    for name in _REQUIRED.get(msg_type, ()):
        if name not in content:
            return f"{msg_type} needs '{name}'"
    required = _REQUIRED.get(msg_type, ())
    for name, kind in _FIELDS.get(msg_type, {}).items():
        value = content.get(name)
        if name not in content or (value is None and name not in required and name not in _NOT_NULL):
            continue  # absent (or null where ipykernel treats null as absent): the default applies
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            return f"{msg_type}: '{name}' has the wrong type ({type(value).__name__})"
    return None


@dataclass(eq=False)
class Request:
    """One message from the frontend, from arrival to its last reply and idle."""

    channel: str
    wire: Wire
    content: dict = field(default_factory=dict)
    reply: Wire | None = None
    idle: Wire | None = None
    busy_seen: bool = False  # the worker published busy for it (relayed once, also across a retry)
    count: int | None = None  # execution count, from the worker's execute_input
    retried: bool = False  # sent again after its generation was lost (idempotent types only)
    generation: Generation | None = None  # where it was sent
    reply_status: str | None = None  # the status of the reply the frontend got
    magics: list[Magic] | None = None  # a cell of `%klbr` lines, answered by the proxy
    magic_error: str | None = None
    timeout: float | None = None  # `%%klbr timeout=SECONDS`
    body: str | None = None  # the code after a `%%klbr` first line
    record: CellRecord | None = None  # its row in the store, once it is a recorded cell
    reply_content: dict | None = None  # the reply content the frontend gets (kept for the store)
    held: list = field(default_factory=list)  # sends waiting until the outcome is committed
    committing: bool = False  # its outcome is being committed
    committed_outputs: int | None = None  # outputs included in the last outcome commit
    idle_in: bool = False  # its idle came (or the proxy closes the bracket itself)
    released: bool = False  # the held reply and idle went out
    own_outputs: list = field(default_factory=list)  # outputs the proxy gave a cell it answered itself
    answered: bool = False  # its reply went out
    duplicates: list = field(default_factory=list)  # resent copies waiting for its reply

    @classmethod
    def decode(cls, channel: str, wire: Wire) -> Request:
        """Raises ValueError when the content is not a JSON object."""
        content = json.loads(bytes(wire.body[4]))
        if not isinstance(content, dict):
            raise ValueError("content is not an object")
        return cls(channel, wire, content)

    @property
    def msg_type(self) -> str:
        return self.wire.msg_type

    @property
    def msg_id(self) -> str:
        return self.wire.msg_id

    @property
    def header(self) -> dict:
        return self.wire.header

    @property
    def idents(self) -> list:
        return self.wire.prefix

    @property
    def done(self) -> bool:
        return self.reply is not None and self.idle is not None

    @property
    def code(self) -> str:
        code = self.content.get("code", "")
        return code if isinstance(code, str) else ""

    @property
    def worker_code(self) -> str:
        """The code the worker runs (a `%%klbr` cell's body)."""
        return self.body if self.body is not None else self.code

    @property
    def counts(self) -> bool:
        """Whether this execute takes an execution count (as ipykernel: stored and not silent)."""
        return not self.silent and bool(self.content.get("store_history", True))

    @property
    def silent(self) -> bool:
        return bool(self.content.get("silent", False))

    @property
    def stop_on_error(self) -> bool:
        return bool(self.content.get("stop_on_error", True))
