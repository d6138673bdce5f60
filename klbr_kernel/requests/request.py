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

What else a request carries is data, each field with one writer, named beside it: what the frontend
has had of it (`busy_sent`, `reply_sent`: checked before a send, so nothing goes out twice,
semantics 1), how many times it was sent (`tries`), and what waits for its end (`held`). What only
an execute carries is apart, in its `execute` (`execute.Execute`: its row, its count, its answer,
its outcome's commit, resent copies, followers), read through the properties below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.store import CellRecord

from .execute import Execute
from .states import ENDED_BY_BOUNDARY, TRANSITIONS, WITH_WORKER, IllegalMove, Phase

if TYPE_CHECKING:
    import zmq

    from klbr_supervisor.generation import Generation
    from klbr_supervisor.running import RunningCell

    from ..magics.parse import Magic

__all__ = ["CONTROL_REPLIES", "OWN", "QUEUED", "SUBSHELL", "TRANSITIONS", "WITH_WORKER", "Execute", "IllegalMove",
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


@dataclass(eq=False)
class Request:
    """One message from the frontend. Built by the `door`; moved only through `move`."""

    channel: str  # the door: every field of a request has one writer, named beside it
    wire: Wire  # the door
    content: dict[str, Any] = field(default_factory=dict)  # the door
    execute: Execute | None = None  # the door: an execute_request's own state (`execute.Execute`)
    phase: Phase = Phase.QUEUED  # itself: changed only by `move`
    tries: int = 0  # itself (`move`): times it was sent to a worker (2: retried after a loss, semantics 8)
    generation: Generation | None = None  # current: where it was sent
    grace_until: float = 0.0  # delivery: with its reply or its idle in, when the other is given up on
    busy_sent: bool = False  # brackets: the frontend has had busy for it (once, also across a retry)
    reply_sent: bool = False  # brackets: the frontend has had its reply
    idle_sent: bool = False  # brackets: the frontend has had its idle
    held: list[Callable[[], object]] = field(default_factory=list)  # itself: `hold`, `take_held`

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
        elif to is Phase.DONE and self.execute is not None:
            self.execute.end_followers()

    def hold(self, send: Callable[[], object]) -> None:
        """`send` waits until the request is released (a cell's reply and idle, until its outcome is
        committed: semantics 3)."""
        self.held.append(send)

    def take_held(self) -> list[Callable[[], object]]:
        """What waited for its release, in order, to be sent now; nothing is held after."""
        held, self.held = self.held, []
        return held

    # -- an execute's own state, read (written by its writers, through `execute`) -------------------

    @property
    def digest(self) -> str:
        return self.execute.digest if self.execute is not None else ""

    @property
    def magics(self) -> list[Magic] | None:
        return self.execute.magics if self.execute is not None else None

    @property
    def magic_error(self) -> str | None:
        return self.execute.magic_error if self.execute is not None else None

    @property
    def timeout(self) -> float | None:
        return self.execute.timeout if self.execute is not None else None

    @property
    def body(self) -> str | None:
        return self.execute.body if self.execute is not None else None

    @property
    def record(self) -> CellRecord | None:
        return self.execute.record if self.execute is not None else None

    @property
    def running(self) -> RunningCell | None:
        return self.execute.running if self.execute is not None else None

    @property
    def count(self) -> int | None:
        return self.execute.count if self.execute is not None else None

    @property
    def reply_content(self) -> dict[str, Any] | None:
        return self.execute.reply_content if self.execute is not None else None

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
