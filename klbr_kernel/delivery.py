"""From the worker to the frontend: replies and iopub relayed as the exact frames the worker sent, and
a recorded cell's reply and idle held until its outcome is committed (DESIGN.md semantics 3).

The worker signs with the frontend's key and the proxy's session id, so its messages go out untouched
(semantics 10). A request is finished when its reply (if it has one) and its idle are in: it becomes
ANSWERED, and DONE once what was held is released. A worker that goes idle for a request and never
replies to it (ipykernel drops what its handler raised on) is answered here after `NO_REPLY_GRACE`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from jupyter_client.session import Session

from klbr_supervisor.protocol import DELIM, Frames, as_bytes
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.wire import Wire

from .answers import Answers
from .boundary import Boundary
from .cell_log import OUTPUT_TYPES, CellLog
from .current import Current
from .frontend import Frontend
from .outcomes import no_reply_error, obeyed_interrupt, timeout_error, unrecorded_notice, worker_dropped_notice
from .queue import ShellQueue
from .replies import Replies
from .requests import Phase, Request
from .stdin import StdinRelay

log = logging.getLogger(__name__)

# Seconds a request's reply may trail its idle (they travel on different sockets) before the worker
# counts as having dropped it.
NO_REPLY_GRACE = 5.0
# How often the requests in their grace are looked at: a missing reply or idle is given up on
# NO_REPLY_GRACE to NO_REPLY_GRACE + GRACE_CHECK seconds after the other came. One timer for all,
# where a timer per request cost every request a handle and two heap operations of the loop's.
GRACE_CHECK = 1.0


class Delivery:
    def __init__(self, boundary: Boundary, *, current: Current, queue: ShellQueue, supervisor: Supervisor,
                 cell_log: CellLog, answers: Answers, replies: Replies, stdin: StdinRelay, frontend: Frontend,
                 session: Session):
        """`session`: the frontend's, which builds the worker's copy of an execute."""
        self._boundary = boundary
        self._current = current
        self._queue = queue
        self._supervisor = supervisor
        self._cell_log = cell_log
        self._answers = answers
        self._replies = replies
        self._stdin = stdin
        self._frontend = frontend
        self._session = session
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
            self._answers.notices(req, self.notice)
            self.notice = None
        self._supervisor.send_execute(self._as_worker_execute(req), msg_id=req.msg_id, code=req.worker_code,
                                      counts=req.counts, timeout=req.timeout,
                                      cell_id=req.record.id if req.record is not None else None)

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
        parts = [as_bytes(body[1]), as_bytes(body[2]), as_bytes(body[3]), content]
        return [DELIM, session.sign(parts), *parts, *body[5:]]

    # -- from the worker ---------------------------------------------------------------------------

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
                req.reply_content = wire.content if req.msg_type == "execute_request" else None
                self._hold(req, lambda: self._forward_reply(req, wire))
            if idle_first:
                self.finished(req)

    def _forward_reply(self, req: Request, wire: Wire) -> None:
        self._replies.replied(req)
        if not self._frontend.forward(req.channel, req.idents, wire.frames()):
            req.orphaned = True

    def _execute_reply(self, req: Request, wire: Wire) -> None:
        supervisor = self._supervisor
        count = wire.content.get("execution_count")
        if req.counts and isinstance(count, int) and wire.content.get("status") != "aborted":
            supervisor.worker_count(count)
        content = wire.content
        if supervisor.cells.timed_out(req.msg_id) and obeyed_interrupt(content):
            # The deadline's interrupt worked: the namespace is kept, but the cell's outcome is the
            # deadline, not a KeyboardInterrupt (or CancelledError) the user never pressed. (A cell
            # that caught it and went on to another end is answered with that end.)
            error = timeout_error(req.count, supervisor.policy.timeout_for(req.timeout), killed=False)
            content = {"status": "error", **error.content(), "execution_count": count}
            req.reply_content, req.outcome = content, error.status
            self._answers.output(req, "error", error.content())
            self._hold(req, lambda: self._replies.reply(req, content))
        else:
            req.reply_content = content
            self._hold(req, lambda: self._forward_reply(req, wire))
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
            if state == "busy" and not req.busy_sent:
                req.busy_sent = True
                frontend.publish(wire)
                if req.msg_type == "execute_request" and req is self._queue.inflight:
                    self._supervisor.cells.started(req.msg_id)
            elif state == "idle" and req.awaits_idle:
                self._worker_dropped(req, wire.msg_id)
                self._hold(req, lambda: self._forward_idle(req, wire))
                self._idle(req)
            return
        frontend.publish(wire)
        if msg_type in OUTPUT_TYPES:
            if req is not None:
                if req.record is not None:
                    self._cell_log.output(req, msg_type, wire.body[4])
                if not frontend.subscriptions:
                    req.unseen += 1
                for follower in req.followers:
                    follower.output(msg_type, wire.content)
        elif msg_type == "execute_input":
            count = wire.content.get("execution_count")
            if req is not None and isinstance(count, int):
                req.count = count
                if req.counts:
                    self._supervisor.worker_count(count)  # a replay answered meanwhile takes the next
        elif msg_type == "comm_open":
            self._current.open_comms.add(str(wire.content.get("comm_id", "")))
        elif msg_type == "comm_close":
            self._current.open_comms.discard(str(wire.content.get("comm_id", "")))

    def _worker_dropped(self, req: Request, idle: str | None) -> None:
        """Before a cell's idle (`idle`: its msg_id; None: it never came): if its worker dropped
        messages before klbr read them (one klbr does not start itself: see
        `klbr_supervisor.sequence`), the cell says how many, in its outputs and its log."""
        if req.msg_type != "execute_request" or req.generation is None or not req.generation.counts_drops:
            return
        # Replies still on their way (another socket than the idle's): this cell's own, and others'.
        awaited = sum(1 for other in self._current.waiting.values() if other.expects_reply
                      and other.phase in (Phase.SENT, Phase.AWAITING_REPLY))
        dropped = req.generation.dropped_before(idle, awaited)
        if dropped:
            log.warning("generation %d dropped %d messages before %s %s's idle", req.generation.number, dropped,
                        req.msg_type, req.msg_id)
            self._answers.output(req, "stream", {"name": "stderr", "text": worker_dropped_notice(dropped)})

    def _forward_idle(self, req: Request, wire: Wire) -> None:
        """The worker's idle for `req`, told first how many of its outputs were dropped, if any."""
        self._replies.dropped_notice(req)
        self._frontend.publish(wire)

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
            content["execution_count"] = req.count if req.count is not None else self._supervisor.counts.last
            self._answers.output(req, "error", error.content())
        req.reply_content, req.outcome = content, error.status
        self._hold(req, lambda: self._replies.reply(req, content))
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
        if req is self._queue.inflight and req.msg_type == "execute_request":
            self._supervisor.cells.finished(req.msg_id)
        if req.record is not None:
            self._settle(req)
        else:
            self._answers.release(req)

    def close_bracket(self, req: Request) -> None:
        """A request whose worker ended (or went quiet) after replying: its reply stands, only its
        idle is missing."""
        req.held.append(lambda: self._replies.idle(req))
        self.finished(req)

    def _hold(self, req: Request, send: Callable[[], object]) -> None:
        if req.record is not None:
            req.held.append(send)
        else:
            send()

    def _commit(self, req: Request) -> None:
        assert req.record is not None, "only a recorded cell's outcome is committed"
        req.commit.begin(req.record.output_bytes)
        if self._cell_log.finish(req, req.reply_content or {},
                                 self._boundary.guarded(req, lambda error: self._committed(req))):
            self._committed(req)

    def _committed(self, req: Request) -> None:
        req.commit.landed()
        self._settle(req)

    def _settle(self, req: Request) -> None:
        """Release a recorded cell's held reply and idle once both are in and its outcome, with every
        output before the idle, is committed (semantics 3). An output that came between the reply
        and the idle (they travel on different sockets) costs one more commit: counted in bytes, which
        every output adds to, also one past `Store.max_output_bytes` that is counted and not kept."""
        if req.commit.running or req.phase is not Phase.ANSWERED:
            return
        assert req.record is not None, "only a recorded cell is settled"
        if req.commit.covers(req.record.output_bytes):
            self._answers.release(req)
        else:
            self._commit(req)
