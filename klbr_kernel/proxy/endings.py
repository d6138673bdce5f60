"""When a generation starts serving or ends: what waited on it goes on, or is answered here.

An ended generation has delivered everything it sent (the supervisor drains it first, semantics 7);
then, for each request that was waiting on it, by its phase:

- finished (ANSWERED): nothing; its outcome's commit releases it;
- a request that had its reply: it stands, the proxy closes the bracket with its idle;
- an idempotent request with no reply yet, not retried yet: sent once more to the next generation
  (semantics 8);
- anything else in flight: answered with the error that names how the worker ended (semantics 2:
  nothing is re-run), and the executes queued behind it are aborted as after any error;
- forwarded comm and control traffic: its bracket is closed (control requests get an error reply).

Its widgets get `comm_close` and a debug session on it ends. A shutdown overrides all of this: what
waited is aborted and nothing is retried (semantics 13).

Both are the supervisor's listener (`generation_ready`, `generation_ended`). An end is told while
the supervisor hands over (its state decided, what follows not started yet), with everything the
answers need: how the generation ended, what requests are refused with from now on, and each
request's own facts (its count, its deadline); nothing here calls back into the supervisor then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from klbr_supervisor.generation import Generation
from klbr_supervisor.policy import Refusal, may_retry
from klbr_supervisor.states import Ending, EndReason

from ..frontend.sockets import Frontend
from ..requests.counts import ExecutionCounts
from ..requests.current import Current
from ..requests.outcomes import (
    CellError,
    ending_error,
    idle_loss_notice,
    refusal_error,
    timeout_error,
    with_rebuild_line,
)
from ..requests.queue import ShellQueue
from ..requests.request import CONTROL_REPLIES, QUEUED, Phase, Request
from ..requests.states import LinkState
from .boundary import Boundary
from .brackets import Brackets
from .delivery import Delivery
from .own import OwnAnswers
from .rebuilt import RebuiltCells


class Endings:
    def __init__(self, boundary: Boundary, *, current: Current, queue: ShellQueue, own: OwnAnswers,
                 delivery: Delivery, forward: Callable[[Request], None], pump: Callable[[Refusal | None], None],
                 brackets: Brackets, frontend: Frontend, counts: ExecutionCounts, state_changed: Callable[[], None],
                 rebuilt: RebuiltCells, interrupt_grace: float | None = None):
        """`forward(req)`: send on what waited for a generation (`Dispatch.forward`); `pump(refusal)`:
        start what is queued (`Dispatch.pump`), refused with `refusal` if one is given;
        `state_changed`: the klbr comm's push of the generation's state, once the handover is over;
        `rebuilt`: the cell `%klbr rebuild` runs again, which ends with its generation;
        `interrupt_grace`: the seconds an interrupt has before its worker is killed (the setting,
        named in the error of a cell that ignored one)."""
        self._interrupt_grace = interrupt_grace
        self._refusal: Refusal | None = None  # what the end being answered is followed by
        self._boundary = boundary
        self._current = current
        self._queue = queue
        self._pump = pump
        self._counts = counts
        self._state_changed = state_changed
        self._own = own
        self._delivery = delivery
        self._forward = forward
        self._brackets = brackets
        self._frontend = frontend
        self._rebuilt = rebuilt

    def ready(self, generation: Generation) -> None:
        """`generation` takes requests (the supervisor says so): what waited for one goes to it."""
        guard = self._boundary.guard
        try:
            for req in self._current.ready(generation):
                guard(req, self._forward, req)
            self._pump(None)
        except Exception as e:
            self._boundary.fail(None, e)
        guard(None, self._state_changed)

    def ended(self, generation: Generation, ending: Ending, refusal: Refusal | None) -> None:
        """The current `generation` ended (the supervisor says so, handing over): everything that
        waited on it is answered; what is safe to retry is retried; from now on requests are
        refused with `refusal`, if there is one."""
        abandoned = self._queue.abandoned
        if abandoned is not None and abandoned[1] is generation:
            self._queue.worker_free(f"the generation of {abandoned[0]} ended")
        try:
            self._ended(generation, ending, refusal)
        except Exception as e:
            self._boundary.fail(None, e)
        # The comm's state reads the supervisor's, which is not to be called while it hands over.
        asyncio.get_running_loop().call_soon(self._boundary.guard, None, self._state_changed)

    def _ended(self, generation: Generation, ending: Ending, refusal: Refusal | None) -> None:
        current, guard = self._current, self._boundary.guard
        self._refusal = refusal
        was_current = current.generation is generation
        debugging = current.state is LinkState.DEBUGGING
        waiting = current.ended(f"generation {generation.number} ended: {ending.reason.value}")
        inflight = self._queue.inflight
        rebuilding = self._rebuilt.ended(generation, ending, refusal)  # a cell `%klbr rebuild` ran again on it
        if ending.reason is EndReason.SHUTDOWN:
            for req in waiting.values():
                guard(req, self._own.abort, req)
            return
        for req in waiting.values():
            if req is not inflight:
                guard(req, self._close_forwarded, req, ending, generation)
        self._close_worker_state(debugging)
        if inflight is not None and inflight.generation is generation and inflight.with_worker:
            guard(inflight, self._inflight_ended, inflight, ending, generation)
        elif was_current and ending.reason is EndReason.LOST and not rebuilding:
            self._delivery.notice = idle_loss_notice(generation.number, generation.pid, ending.how)
        if ending.reason is EndReason.START_FAILED:
            # No worker to wait for: everything queued gets the same answer now, never a hang.
            for req in self._queue.clear() + current.take_held():
                guard(req, self._answer_failed_start, req, ending, generation)
        elif refusal is not None:  # a crash loop, a lost link
            for req in current.take_held():  # comm and control traffic that waited for a generation
                guard(req, self._own.refuse_forwarded, req, refusal_error(refusal))
            self._pump(refusal)  # everything queued is refused with its error

    def _close_forwarded(self, req: Request, ending: Ending, generation: Generation) -> None:
        """comm and control traffic the worker never finished: close its bracket."""
        req.move(Phase.ANSWERED)
        content = None
        if req.channel == "control" and req.msg_type in CONTROL_REPLIES:
            content = {"status": "error", **self.error(ending, generation, req).content()}
        self._brackets.own(req, content)
        req.move(Phase.DONE)

    def _close_worker_state(self, debugging: bool) -> None:
        """Its widgets lived in the dead worker, and so did its debug session: the frontend is told."""
        current = self._current
        parent = current.last_execute.header if current.last_execute else {}
        for comm_id in sorted(current.open_comms):
            self._frontend.send_iopub("comm_close", {"comm_id": comm_id, "data": {}}, parent)
        current.open_comms.clear()
        if debugging:
            self._frontend.send_iopub("debug_event", {"type": "event", "seq": 0, "event": "terminated", "body": {}},
                                      parent)

    def _inflight_ended(self, req: Request, ending: Ending, generation: Generation) -> None:
        if req.phase is Phase.AWAITING_IDLE:
            # Its reply is in (a cell's held until its outcome is committed, any other's sent on):
            # it stands as the only one, and only the idle is the proxy's. Sending it again would
            # answer it twice (semantics 1).
            self._delivery.close_bracket(req)
        elif ending.reason is not EndReason.START_FAILED and may_retry(req.msg_type, req.tries > 1):
            req.move(Phase.QUEUED)  # idempotent: once more on the next generation
            self._queue.put_back(req)
        else:
            self._own.here(req, error=self.error(ending, generation, req))

    def _answer_failed_start(self, req: Request, ending: Ending, generation: Generation) -> None:
        if req.channel == "shell" and req.msg_type in QUEUED:
            self._own.here(req, error=self.error(ending, generation, req))
        else:
            self._close_forwarded(req, ending, generation)

    def error(self, ending: Ending, generation: Generation, req: Request) -> CellError:
        """The error that tells `req` how its generation ended; when its namespace is gone, the line
        that shows how to rebuild it follows the user's words."""
        last = self._counts.last
        if ending.reason is EndReason.DEADLINE and req.msg_type == "execute_request":
            deadline = req.running.deadline if req.running is not None else None
            return with_rebuild_line(timeout_error(
                req.count or last + 1, deadline.seconds if deadline is not None else None, killed=True,
                generation=generation.number, pid=generation.pid, how=ending.how,
                refusal=self._refusal), self._refusal)
        count = req.count if req.count is not None else last + 1
        cell = f"cell [{count}]" if req.msg_type == "execute_request" and req.counts else "this request"
        return with_rebuild_line(ending_error(ending, generation=generation.number, pid=generation.pid, cell=cell,
                                              grace=self._interrupt_grace, refusal=self._refusal), self._refusal)
