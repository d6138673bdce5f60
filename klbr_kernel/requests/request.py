"""A frontend request as the proxy tracks it, from arrival to its last reply and idle.

Its life is a state machine (`states.Phase`), as a generation's is: every move goes through
`Request.move`, which refuses any move `TRANSITIONS` does not list. Such a refusal is a bug in klbr;
the error boundary answers the request with an InternalError and the kernel keeps serving.

- queued -> recording -> sent -> awaiting_idle -> answered -> done: a cell, its row committed
  before the worker sees it, its reply in before its idle (or its idle first: awaiting_reply);
- queued -> sent -> ... -> answered -> done: any other request the worker answers (comm messages
  and control requests without a reply: sent -> answered once their idle is in);
- queued -> proxy -> answered -> done: a `%klbr` cell, an interrupt or a shutdown request;
- queued -> answered -> done: refused, aborted, or history from the cell log;
- sent (or awaiting either) -> queued: retried once on the next generation (idempotent requests,
  semantics 8); -> answered: its generation ended, or the worker never replied or never went idle;
- recording -> queued: its generation ended while its row committed; it runs on the next one;
- any phase but done -> done: the error boundary answered it (`Proxy.internal_error`).

What else a request carries is data: what the frontend has had of it (`busy_sent`, `reply_sent`:
checked before a send, so nothing goes out twice, semantics 1), how many times it was sent (`tries`),
its outcome's commit (`Commit`), and what waits for its end (held sends, resent copies, followers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.store import CellRecord

from .states import ENDED_BY_BOUNDARY, TRANSITIONS, WITH_WORKER, IllegalMove, Phase

if TYPE_CHECKING:
    import zmq

    from klbr_supervisor.generation import Generation
    from klbr_supervisor.running import RunningCell

    from ..cell_log.replay import Follower
    from ..magics.parse import Magic

__all__ = ["CONTROL_REPLIES", "OWN", "QUEUED", "SUBSHELL", "TRANSITIONS", "WITH_WORKER", "Commit", "IllegalMove",
           "Phase", "Request"]

log = logging.getLogger(__name__)

# Shell requests the proxy queues and sends one at a time, as ipykernel serves them.
QUEUED = frozenset({"execute_request", "complete_request", "inspect_request", "is_complete_request",
                    "history_request", "comm_info_request"})
# Answered by the proxy itself, on whichever channel they arrive.
OWN = frozenset({"kernel_info_request", "shutdown_request", "interrupt_request"})
SUBSHELL = frozenset({"create_subshell_request", "list_subshell_request", "delete_subshell_request"})
# Forwarded control requests a worker answers with a reply (others get busy/idle only, as in ipykernel).
CONTROL_REPLIES = frozenset({"debug_request", "usage_request", "execute_request"})


@dataclass(slots=True)
class Commit:
    """A recorded cell's outcome on its way to the store (semantics 3): a commit is in flight or
    not, and the last one covers the outputs counted when it began. The cell is released once a
    commit that has landed covers every output (`Delivery._settle`)."""

    running: bool = False
    covered: int | None = None  # output bytes the last commit began with

    def begin(self, output_bytes: int) -> None:
        if self.running:
            msg = "an outcome commit began while another was in flight"
            raise IllegalMove(msg)
        self.running, self.covered = True, output_bytes

    def landed(self) -> None:
        if not self.running:
            msg = "an outcome commit landed that never began"
            raise IllegalMove(msg)
        self.running = False

    def covers(self, output_bytes: int) -> bool:
        """Whether the last commit has landed and includes `output_bytes` of outputs."""
        return not self.running and self.covered == output_bytes


@dataclass(eq=False)
class Request:
    """One message from the frontend. Built by the `door`; moved only through `move`."""

    channel: str
    wire: Wire
    content: dict[str, Any] = field(default_factory=dict)
    digest: str = ""  # an execute's: what tells it from another with the same msg_id (`door.digest`)
    phase: Phase = Phase.QUEUED  # changed only by `move`
    generation: Generation | None = None  # where it was sent
    tries: int = 0  # times it was sent to a worker (2: retried after a loss, semantics 8)
    grace_until: float = 0.0  # with its reply or its idle in: when the other is given up on (loop time)
    busy_sent: bool = False  # the frontend has had busy for it (once, also across a retry)
    reply_sent: bool = False  # the frontend has had its reply
    reply_content: dict[str, Any] | None = None  # the reply the frontend gets (kept for the store and resends)
    outcome: str | None = None  # the store status of an answer the proxy wrote itself (`cell_status`)
    interrupted: bool = False  # klbr interrupted its worker while it ran (interrupt_request, SIGINT)
    held: list[Callable[[], object]] = field(default_factory=list)  # sends held until it is released
    count: int | None = None  # execution count, from the worker's execute_input or the proxy
    # An execute's:
    magics: list[Magic] | None = None  # a cell of `%klbr` lines, answered by the proxy
    magic_error: str | None = None
    timeout: float | None = None  # `%%klbr timeout=SECONDS`
    body: str | None = None  # the code after a `%%klbr` first line
    record: CellRecord | None = None  # its row in the store, once it is a recorded cell
    running: RunningCell | None = None  # as the supervisor watches it, once sent (its deadline)
    commit: Commit = field(default_factory=Commit)  # its outcome's, once it is a recorded cell
    own_outputs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # outputs the proxy gave a cell it answered itself
    duplicates: list[Request] = field(default_factory=list)  # resent copies waiting for its reply
    followers: list[Follower] = field(default_factory=list)  # `%klbr replay --follow` cells relaying its outputs
    unseen: int = 0  # its outputs published while no frontend was subscribed to iopub
    orphaned: bool = False  # its reply found the frontend that sent it gone

    def move(self, to: Phase, *, by_boundary: bool = False) -> None:
        """The one door of its phase. `by_boundary`: the error boundary ends it (`to` DONE) from
        whatever phase it is in but DONE (`ENDED_BY_BOUNDARY`)."""
        if by_boundary:
            legal = to is Phase.DONE and self.phase in ENDED_BY_BOUNDARY
        else:
            legal = to in TRANSITIONS[self.phase]
        if not legal:
            msg = f"{self.msg_type} {self.msg_id}: {self.phase.value} -> {to.value}"
            raise IllegalMove(msg)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s %s: %s -> %s%s", self.msg_type, self.msg_id, self.phase.value, to.value,
                      " (the error boundary)" if by_boundary else "")
        self.phase = to
        if to is Phase.SENT:
            self.tries += 1
        elif to is Phase.DONE:
            self.end_followers()

    def end_followers(self) -> None:
        """It is answered: the replays following it end with it."""
        followers, self.followers = self.followers, []
        for follower in followers:
            follower.end()

    @property
    def with_worker(self) -> bool:
        """Sent to a worker, and not finished."""
        return self.phase in WITH_WORKER

    @property
    def awaits_reply(self) -> bool:
        """With a worker that has not replied to it (it may still run it)."""
        return self.phase is Phase.SENT or self.phase is Phase.AWAITING_REPLY

    @property
    def awaits_idle(self) -> bool:
        """With a worker that has not gone idle for it."""
        return self.phase is Phase.SENT or self.phase is Phase.AWAITING_IDLE

    @property
    def msg_type(self) -> str:
        return self.wire.msg_type

    @property
    def msg_id(self) -> str:
        return self.wire.msg_id

    @property
    def header(self) -> dict[str, Any]:
        return self.wire.header

    @property
    def idents(self) -> list[zmq.Frame | bytes]:
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
