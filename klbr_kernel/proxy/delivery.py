"""To the worker and back: a started request sent to the current generation, and what the worker
says relayed to the frontend as the exact frames it sent, a recorded cell's reply and idle held
until its outcome is committed (semantics 3). It is the supervisor's listener for worker messages
(`worker_message`), so a message goes from the generation to here, and on to the frontend.

The worker signs with the frontend's key and the proxy's session id, so its messages go out untouched
(semantics 10). A request is finished when its reply (if it has one) and its idle are in: it becomes
ANSWERED, and DONE once what was held is released. A worker that goes idle for a request and never
replies to it (ipykernel drops what its handler raised on) is answered here after `NO_REPLY_GRACE`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from jupyter_client.session import Session

from klbr_supervisor.generation import Generation
from klbr_supervisor.messages.protocol import DELIM, Frames, as_bytes
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.store import StoreError
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.system import heap

from ..cell_log.recording import OUTPUT_TYPES, CellLog
from ..frontend.sockets import Frontend
from ..requests.counts import ExecutionCounts
from ..requests.current import Current
from ..requests.outcomes import (
    no_reply_error,
    obeyed_interrupt,
    timeout_error,
    unrecorded_notice,
    worker_dropped_notice,
)
from ..requests.queue import ShellQueue
from ..requests.request import Phase, Request
from .boundary import Boundary
from .brackets import Brackets
from .own import OwnAnswers
from .stdin import StdinRelay

if TYPE_CHECKING:
    from .rebuilt import RebuiltCells  # which imports this module's NO_REPLY_GRACE

log = logging.getLogger(__name__)

# Seconds a request's reply may trail its idle (they travel on different sockets) before the worker
# counts as having dropped it.
NO_REPLY_GRACE = 5.0
# How often the requests in their grace are looked at: a missing reply or idle is given up on
# NO_REPLY_GRACE to NO_REPLY_GRACE + GRACE_CHECK seconds after the other came. One timer for all,
# where a timer per request cost every request a handle and two heap operations of the loop's.
GRACE_CHECK = 1.0
# Bytes of output a cell relayed from which, once it is settled, the proxy's free heap goes back to
# the system (`heap.give_back`, a fraction of a millisecond): a flood's messages leave it in glibc's
# hands otherwise.
GIVE_BACK_AFTER = 1 << 20


class Delivery:
    def __init__(self, boundary: Boundary, *, current: Current, queue: ShellQueue, supervisor: Supervisor,
                 cell_log: CellLog, own: OwnAnswers, brackets: Brackets, stdin: StdinRelay, frontend: Frontend,
                 session: Session, counts: ExecutionCounts, rebuilt: RebuiltCells):
        """`session`: the frontend's, which builds the worker's copy of an execute; `counts`: what
        the frontend was shown, which the worker's counts move on; `rebuilt`: the cell `%klbr
        rebuild` runs again, whose messages go there, not to the frontend."""
        self._boundary = boundary
        self._current = current
        self._queue = queue
        self._supervisor = supervisor
        self._cell_log = cell_log
        self._own = own
        self._brackets = brackets
        self._stdin = stdin
        self._frontend = frontend
        self._session = session
        self._counts = counts
        self._rebuilt = rebuilt
        self.notice: str | None = None  # stderr text the next cell starts with
        self._told_unrecorded = False
        self._grace_timer: asyncio.TimerHandle | None = None  # armed while a request is in its grace

    # -- to the worker -----------------------------------------------------------------------------

    def send(self, req: Request) -> None:
        """Send the request in flight (QUEUED or RECORDING) to the current generation."""
        self._current.send(req)
        if req.msg_type != "execute_request":
            self._supervisor.send("shell", req.wire.frames())
            return
        self._current.last_execute = req
        unavailable = self._cell_log.unavailable
        if unavailable is not None and not self._told_unrecorded and not req.silent:
            self._told_unrecorded = True
            self.notice = unrecorded_notice(unavailable) + (self.notice or "")
        if not req.silent:
            self._own.notices(req, self.notice)
            self.notice = None
        sync = None
        if req.counts:
            counts, generation = self._counts, req.generation
            if generation is not None and generation.next_count != counts.last + 1:
                sync = (counts.last, counts.catch_up())  # a new worker, or cells answered meanwhile
            counts.reserve(req.msg_id)
        execute = req.execute
        assert execute is not None, "an execute_request is made with its own state"
        execute.running = self._supervisor.send_execute(
            self._as_worker_execute(req), msg_id=req.msg_id, code=req.worker_code, counts=req.counts,
            timeout=execute.timeout, cell_id=execute.record.id if execute.record is not None else None, sync=sync,
            silent=req.silent)

    def _as_worker_execute(self, req: Request) -> Frames:
        """The execute as the worker gets it: stop_on_error off (the proxy applies it), and the
        body of a `%%klbr timeout=` cell without its first line.

        ipykernel aborts what reaches it right after an error; with one request in flight that would
        abort the next cell the proxy sends, not the ones the frontend had queued.

        Only the content is packed again (by the `Session`, as it packs any message) and the four
        parts signed again: the header, parent header and metadata go on as the frontend sent them.
        """
        if not req.content.get("stop_on_error", True) and req.body is None:
            return req.wire.frames()
        body = req.wire.body
        session = self._session
        content = session.pack(dict(req.content, stop_on_error=False, code=req.worker_code))
        parts = [part if type(part) is bytes else as_bytes(part) for part in body[1:4]] + [content]
        return [DELIM, session.sign(parts), *parts, *body[5:]]

    # -- from the worker ---------------------------------------------------------------------------

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        """A message from the current generation (the supervisor's `WorkerListener`): about the
        request it answers, if one waits for it. What a worker still says of a request the error
        boundary answered goes nowhere, and its idle frees the queue."""
        rebuilt = self._rebuilt.cell
        if rebuilt is not None and wire.parent_id == rebuilt.msg_id:  # a cell `%klbr rebuild` runs again
            self.notice = None  # the loss was answered: the user rebuilds what it took
            self._boundary.guard(None, self._rebuilt.message, channel, wire)
            return
        abandoned = self._queue.abandoned
        if abandoned is not None and wire.parent_id == abandoned[0]:
            if channel == "iopub" and wire.msg_type == "status" and wire.execution_state == "idle":
                self._queue.worker_free(f"the worker of {abandoned[0]} went idle")
                self._boundary.pump()
            return
        req = self._current.waiting.get(wire.parent_id)
        try:
            self.message(channel, wire, req)
        except Exception as e:
            self._boundary.fail(req, e)

    def message(self, channel: str, wire: Wire, req: Request | None) -> None:
        """A message from the current generation; `req` is the request it answers, if tracked."""
        if channel == "iopub":
            self._iopub(wire, req)
        elif channel == "stdin":
            req = req or self._current.last_execute
            if req is not None:
                self._stdin.to_frontend(req, wire)
        elif req is not None and req.awaits_reply:
            idle_first = req.phase is Phase.AWAITING_REPLY
            if not idle_first:
                req.move(Phase.AWAITING_IDLE)
                # The idle follows at once; a worker that loses it must not wedge the queue.
                self._grace(req)
            if wire.msg_type == "execute_reply":
                self._execute_reply(req, wire)
            else:
                if req.execute is not None:
                    self._brackets.decided(req, wire.content)
                self._hold(req, lambda: self._brackets.relay_reply(req, wire))
            if idle_first:
                self.finished(req)

    def _execute_reply(self, req: Request, wire: Wire) -> None:
        content = wire.content
        count = content.get("execution_count")
        if req.counts and isinstance(count, int) and content.get("status") != "aborted":
            self._counts.from_worker(count)
        running = req.running
        if running is not None and running.timed_out and obeyed_interrupt(content):
            # The deadline's interrupt worked: the namespace is kept, but the cell's outcome is the
            # deadline, not a KeyboardInterrupt (or CancelledError) the user never pressed. (A cell
            # that caught it and went on to another end is answered with that end.)
            error = timeout_error(req.count, running.deadline.seconds if running.deadline else None, killed=False)
            content = {"status": "error", **error.content(), "execution_count": count}
            self._brackets.decided(req, content, error.status)
            self._own.output(req, "error", error.content())
            self._hold(req, lambda: self._brackets.reply(req, content))
        else:
            self._brackets.decided(req, content)
            self._hold(req, lambda: self._brackets.relay_reply(req, wire))
        if req.record is not None and req is self._queue.inflight:
            # The outcome commits now, while the worker's idle is still on its way: usually it is
            # durable before the idle arrives, and nothing waits for it.
            self._commit(req)

    def _iopub(self, wire: Wire, req: Request | None) -> None:
        frontend = self._frontend
        msg_type = wire.msg_type
        if msg_type == "status":
            # Brackets are the proxy's to give (semantics 1): busy once per request (also when it
            # is retried), idle when it is finished; status about anything else is not forwarded.
            if req is None or not req.with_worker:
                return
            state = wire.execution_state
            if state == "busy":
                self._brackets.relay_busy(req, wire)
            elif state == "idle" and req.awaits_idle:
                self._worker_dropped(req, wire.msg_id)
                self._hold(req, lambda: self._brackets.relay_idle(req, wire))
                self._idle(req)
            return
        frontend.publish(wire)
        if msg_type in OUTPUT_TYPES:
            execute = req.execute if req is not None else None
            if req is not None and execute is not None:
                if execute.record is not None:
                    self._cell_log.output(req, msg_type, wire.body[4])
                if not frontend.subscriptions:
                    execute.published_unseen()
                for follower in execute.followers:
                    follower.output(msg_type, wire.content)
        elif msg_type == "execute_input":
            count = wire.content.get("execution_count")
            if req is not None and isinstance(count, int):
                self._counts.numbered(req, count)
        elif msg_type == "comm_open":
            self._current.open_comms.add(str(wire.content.get("comm_id", "")))
        elif msg_type == "comm_close":
            self._current.open_comms.discard(str(wire.content.get("comm_id", "")))

    def _worker_dropped(self, req: Request, idle: str | None) -> None:
        """Before a cell's idle (`idle`: its msg_id; None: it never came): if its worker dropped
        messages before klbr read them (one klbr does not start itself: see
        `klbr_supervisor.generation.sequence`), the cell says how many, in its outputs and its log."""
        if req.msg_type != "execute_request" or req.generation is None or not req.generation.counts_drops:
            return
        # Replies still on their way (another socket than the idle's): this cell's own, and others'.
        awaited = sum(1 for other in self._current.waiting.values() if other.expects_reply
                      and other.phase in (Phase.SENT, Phase.AWAITING_REPLY))
        dropped = req.generation.dropped_before(idle, awaited, req.msg_id)
        if dropped:
            log.warning("generation %d dropped %d messages before %s %s's idle", req.generation.number, dropped,
                        req.msg_type, req.msg_id)
            self._own.output(req, "stream", {"name": "stderr", "text": worker_dropped_notice(dropped)})

    def _idle(self, req: Request) -> None:
        """The worker's idle for `req` is in: finished, unless it is to reply and has not yet."""
        if req.phase is Phase.SENT and req.expects_reply:
            req.move(Phase.AWAITING_REPLY)
            self._grace(req)
            return
        self.finished(req)

    def _grace(self, req: Request) -> None:
        """`req` has its reply or its idle, and the other is on its way: give up on it after
        NO_REPLY_GRACE (`_graces_due`)."""
        loop = asyncio.get_running_loop()
        req.grace_until = loop.time() + NO_REPLY_GRACE
        if self._grace_timer is None:
            self._grace_timer = loop.call_later(GRACE_CHECK, self._boundary.guard, None, self._graces_due)

    def _graces_due(self) -> None:
        """The grace timer: the requests with the current generation whose grace is over are answered
        as the worker left them; it runs again while any is still in its grace. A request that moved
        on (answered, or sent again after a loss) is in another phase, or in a grace of its own."""
        self._grace_timer = None
        loop = asyncio.get_running_loop()
        now, pending = loop.time(), False
        for req in list(self._current.waiting.values()):
            if req.phase is Phase.AWAITING_REPLY or req.phase is Phase.AWAITING_IDLE:
                if req.grace_until > now:
                    pending = True
                elif req.phase is Phase.AWAITING_REPLY:
                    self._boundary.guard(req, self._no_reply, req)
                else:
                    self._boundary.guard(req, self._no_idle, req)
        if pending:
            self._grace_timer = loop.call_later(GRACE_CHECK, self._boundary.guard, None, self._graces_due)

    def _no_reply(self, req: Request) -> None:
        """The worker went idle for `req` long ago and never replied: the proxy replies instead."""
        error = no_reply_error(req.msg_type, NO_REPLY_GRACE)
        content = {"status": "error", **error.content()}
        if req.msg_type == "execute_request":
            content["execution_count"] = req.count if req.count is not None else self._counts.last
            self._own.output(req, "error", error.content())
        self._brackets.decided(req, content, error.status)
        self._hold(req, lambda: self._brackets.reply(req, content))
        if req.record is not None and req is self._queue.inflight:
            self._commit(req)
        self.finished(req)

    def _no_idle(self, req: Request) -> None:
        """The worker replied to `req` long ago and its idle never came (a worker whose iopub
        dropped it): the proxy closes the bracket, as it does when a worker ends after its reply."""
        log.warning("%s %s: no idle %.0f s after its reply; the proxy sends it", req.msg_type, req.msg_id,
                    NO_REPLY_GRACE)
        self._worker_dropped(req, None)
        self.close_bracket(req)

    def finished(self, req: Request) -> None:
        """The worker has finished `req`, or the proxy closed its bracket: release it once its
        outcome is durable."""
        req.move(Phase.ANSWERED)
        current = self._current
        if current.waiting.get(req.msg_id) is req:
            del current.waiting[req.msg_id]
        if req.record is not None:
            self._settle(req)
        else:
            self._own.release(req)

    def close_bracket(self, req: Request) -> None:
        """A request whose worker ended (or went quiet) after replying: its reply stands, only its
        idle is missing."""
        req.hold(lambda: self._brackets.idle(req))
        self.finished(req)

    def _hold(self, req: Request, send: Callable[[], object]) -> None:
        if req.record is not None:
            req.hold(send)
        else:
            send()

    def _commit(self, req: Request) -> None:
        execute = req.execute
        assert execute is not None and execute.record is not None, "only a recorded cell's outcome is committed"
        execute.commit.begin(execute.record.output_bytes)
        if self._cell_log.finish(req, execute.reply_content or {}, partial(self._committed_late, req)):
            self._committed(req)

    def _committed_late(self, req: Request, error: StoreError | None) -> None:
        """The store's callback, once an outcome that had to wait for its writer is in."""
        try:
            self._committed(req)
        except Exception as e:
            self._boundary.fail(req, e)

    def _committed(self, req: Request) -> None:
        assert req.execute is not None, "only a recorded cell's outcome is committed"
        req.execute.commit.landed()
        self._settle(req)

    def _settle(self, req: Request) -> None:
        """Release a recorded cell's held reply and idle once both are in and its outcome, with every
        output before the idle, is committed (semantics 3). An output that came between the reply
        and the idle (they travel on different sockets) costs one more commit: counted in bytes, which
        every output adds to, also one past `Store.max_output_bytes` that is counted and not kept."""
        execute = req.execute
        assert execute is not None and execute.record is not None, "only a recorded cell is settled"
        if execute.commit.in_flight or req.phase is not Phase.ANSWERED:
            return
        if execute.commit.covers(execute.record.output_bytes):
            self._own.release(req)
            if execute.record.output_bytes >= GIVE_BACK_AFTER:
                heap.give_back()
        else:
            self._commit(req)
