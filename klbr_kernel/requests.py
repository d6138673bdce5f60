"""A frontend request as the proxy tracks it, from arrival to its last reply and idle.

Its life is a state machine, as a generation's is: every move goes through `Request.move`, which
refuses any move `TRANSITIONS` does not list. Such a refusal is a bug in klbr; the error boundary
answers the request with an InternalError and the kernel keeps serving.

- queued -> recording -> sent -> answered -> done: a cell, its row committed before the worker sees it;
- queued -> sent -> answered -> done: any other request the worker answers;
- queued -> proxy -> answered -> done: a `%klbr` cell, an interrupt or a shutdown request;
- queued -> answered -> done: refused, aborted, or history from the cell log;
- sent -> queued: retried once on the next generation (idempotent requests, semantics 8);
- recording -> queued: its generation ended while its row committed; it runs on the next one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from klbr_supervisor.store import CellRecord
from klbr_supervisor.wire import Wire

if TYPE_CHECKING:
    from klbr_supervisor.generation import Generation

    from .magics import Magic

# Shell requests the proxy queues and sends one at a time, as ipykernel serves them.
QUEUED = frozenset({"execute_request", "complete_request", "inspect_request", "is_complete_request",
                    "history_request", "comm_info_request"})
# Answered by the proxy itself, on whichever channel they arrive.
OWN = frozenset({"kernel_info_request", "shutdown_request", "interrupt_request"})
SUBSHELL = frozenset({"create_subshell_request", "list_subshell_request", "delete_subshell_request"})
# Forwarded control requests a worker answers with a reply (others get busy/idle only, as in ipykernel).
CONTROL_REPLIES = frozenset({"debug_request", "usage_request", "execute_request"})


class Phase(enum.Enum):
    QUEUED = "queued"  # in the shell queue, or held until a generation is ready
    RECORDING = "recording"  # a cell whose `running` row is committing before the worker sees it
    SENT = "sent"  # with the worker: its reply and idle are on their way
    PROXY = "proxy"  # being answered by the proxy itself (a `%klbr` cell is carried out)
    ANSWERED = "answered"  # its answer is complete, held until its outcome is committed (semantics 3)
    DONE = "done"  # the frontend has its reply and idle; nothing more happens to it


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.RECORDING, Phase.SENT, Phase.PROXY, Phase.ANSWERED}),
    Phase.RECORDING: frozenset({Phase.SENT, Phase.QUEUED, Phase.ANSWERED}),
    Phase.SENT: frozenset({Phase.QUEUED, Phase.ANSWERED}),
    Phase.PROXY: frozenset({Phase.ANSWERED}),
    Phase.ANSWERED: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


class IllegalMove(RuntimeError):
    """A request was moved where its state machine does not go: a bug in klbr."""


@dataclass(eq=False)
class Request:
    """One message from the frontend. Built by the `door`; moved only through `move`."""

    channel: str
    wire: Wire
    content: dict = field(default_factory=dict)
    digest: str = ""  # an execute's: what tells it from another with the same msg_id (`door.digest`)
    phase: Phase = Phase.QUEUED
    generation: Generation | None = None  # where it was sent
    reply: Wire | None = None  # the worker's reply
    idle: Wire | None = None  # the worker's idle
    busy_sent: bool = False  # the frontend has had busy for it (once, also across a retry)
    reply_sent: bool = False  # the frontend has had its reply
    reply_content: dict | None = None  # the reply the frontend gets (kept for the store and resends)
    outcome: str | None = None  # the store status of an answer the proxy wrote itself (`cell_status`)
    interrupted: bool = False  # klbr interrupted its worker while it ran (interrupt_request, SIGINT)
    held: list = field(default_factory=list)  # sends held until the outcome is committed
    retried: bool = False  # sent again after its generation was lost
    count: int | None = None  # execution count, from the worker's execute_input or the proxy
    # An execute's:
    magics: list[Magic] | None = None  # a cell of `%klbr` lines, answered by the proxy
    magic_error: str | None = None
    timeout: float | None = None  # `%%klbr timeout=SECONDS`
    body: str | None = None  # the code after a `%%klbr` first line
    record: CellRecord | None = None  # its row in the store, once it is a recorded cell
    committing: bool = False  # an outcome commit is in flight
    committed_bytes: int | None = None  # output bytes the last outcome commit included
    own_outputs: list = field(default_factory=list)  # outputs the proxy gave a cell it answered itself
    duplicates: list = field(default_factory=list)  # resent copies waiting for its reply
    followers: list = field(default_factory=list)  # `%klbr replay --follow` cells relaying its outputs
    unseen: int = 0  # its outputs published while no frontend was subscribed to iopub
    orphaned: bool = False  # its reply found the frontend that sent it gone

    def move(self, to: Phase) -> None:
        if to not in TRANSITIONS[self.phase]:
            raise IllegalMove(f"{self.msg_type} {self.msg_id}: {self.phase.value} -> {to.value}")
        self.phase = to
        if to is Phase.DONE:
            self.end_followers()

    def end_followers(self) -> None:
        """It is answered: the replays following it end with it."""
        followers, self.followers = self.followers, []
        for follower in followers:
            follower.end()

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
    def expects_reply(self) -> bool:
        """Whether the worker answers it with a reply (besides busy and idle)."""
        return self.msg_type in (QUEUED if self.channel == "shell" else CONTROL_REPLIES)

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
