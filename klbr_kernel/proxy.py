"""The proxy kernel: speaks Jupyter to the frontend and routes everything through the supervisor.

It answers kernel_info, interrupt, shutdown and `%klbr` cells itself; queues shell requests and sends
them to the current generation one at a time; forwards comm, stdin and control traffic; and relays
the worker's replies and iopub untouched (the worker signs with the frontend's key and the proxy's
session id, so every message the frontend sees carries one session). When a generation ends, every
request that was waiting on it is answered here (DESIGN.md semantics 1, 2, 8, 10, 11).
"""

from __future__ import annotations

import asyncio
import logging

from jupyter_client.session import Session

from klbr_supervisor.generation import Generation
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.wire import Wire

from .cell_log import OUTPUT_TYPES, CellLog
from .frontend import Frontend
from .kernel_info import kernel_info_content
from .magics import MagicError, cell_timeout, line_magics
from .outcomes import (CellError, crash_loop_error, ending_error, poisoned_error, session_paused_error,
                       timeout_error, unrecorded_notice)
from .queue import ShellQueue
from .replies import Replies
from .requests import OWN, QUEUED, SUBSHELL, Request, content_problem
from .status import magic_output
from .stdin import StdinRelay

log = logging.getLogger(__name__)

# Control requests a worker answers with a reply (others get busy/idle only, as in ipykernel).
_CONTROL_REPLIES = frozenset({"debug_request", "usage_request"})


class Proxy:
    """Created by the app with the frontend's connection info; `run` serves until shutdown."""

    def __init__(self, info: dict, session: Session, parent=None, notebook: str | None = None):
        self.session = session
        self.frontend = Frontend(info, session, self._frontend_message)
        self.supervisor = Supervisor(self, session=session, parent=parent, notebook=notebook,
                                     kernel_name=info.get("kernel_name") or None)
        self.cell_log = CellLog(self.supervisor.store)
        self.replies = Replies(self.frontend, session, self.supervisor.store)
        self.queue = ShellQueue()
        self.stdin = StdinRelay(self.frontend, self.supervisor, session,
                                lambda req, text: self._publish_output(req, "stream", {"name": "stderr", "text": text}))
        self._told_unrecorded = False
        self.generation: Generation | None = None
        # Requests sent to the current generation and not yet finished (reply and idle), by msg_id.
        self._waiting: dict[str, Request] = {}
        # Forwarded-at-once requests that arrived while no generation was ready.
        self._held: list[Request] = []
        self._last_execute: Request | None = None
        self._open_comms: set[str] = set()
        self._debugging = False
        self._notice: str | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self.supervisor.run())
            self.frontend.bind()
            await self._stopped.wait()
        self.frontend.close()

    def request_shutdown(self) -> None:
        """SIGTERM: shut down as for a shutdown_request, with no one to reply to."""
        if not self._stopping:
            self._tg.create_task(self._shutdown(None))

    def request_interrupt(self) -> None:
        """SIGINT, from clients that interrupt by signal: the same ladder as interrupt_request."""
        self._tg.create_task(self.supervisor.interrupt())

    # -- from the frontend -------------------------------------------------------------------------

    def _frontend_message(self, channel: str, wire: Wire) -> None:
        if channel == "stdin":
            self.stdin.to_worker(wire.frames())
            return
        try:
            req = Request.decode(channel, wire)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("%s: %s with undecodable content: %s", channel, wire.msg_type, e)
            self.replies.invalid(Request(channel, wire), f"content is not a JSON object: {e}")
            return
        msg_type = req.msg_type
        if self._stopping:
            self.replies.own(req, {"status": "aborted"} if msg_type.endswith("_request") else None)
        elif msg_type in OWN:
            self._own(req)
        elif msg_type in SUBSHELL:
            error = CellError("SubshellsNotSupported", "klbr does not offer kernel subshells")
            self.replies.own(req, {"status": "error", **error.content()})
        elif channel == "shell" and msg_type in QUEUED:
            problem = content_problem(msg_type, req.content)
            if problem is not None:
                log.warning("shell: %s", problem)
                self.replies.invalid(req, problem)
                return
            if msg_type == "execute_request":
                if self.replies.duplicate(req):
                    return
                self._read_magics(req)
            self.queue.push(req)
            self._pump()
        else:
            self._forward_now(req)

    def _read_magics(self, req: Request) -> None:
        code = req.code
        if "%klbr" not in code:
            return  # the common case, without splitting the cell into lines
        try:
            req.magics = line_magics(code)
            if req.magics is None:
                timed = cell_timeout(code)
                if timed is not None:
                    req.timeout, req.body = timed
        except MagicError as e:
            req.magic_error = str(e)

    def _own(self, req: Request) -> None:
        if req.msg_type == "kernel_info_request":
            gen = self.generation
            info = gen.kernel_info if gen else None
            self.replies.own(req, kernel_info_content(info, gen.number if gen else None, self.supervisor.placement))
        elif req.msg_type == "interrupt_request":
            self._tg.create_task(self._interrupt(req))
        elif req.msg_type == "shutdown_request":
            self._tg.create_task(self._shutdown(req))

    async def _interrupt(self, req: Request) -> None:
        self.frontend.status("busy", req.header)
        await self.supervisor.interrupt()
        self.frontend.reply(req.channel, req.idents, "interrupt_reply", {"status": "ok"}, req.header)
        self.frontend.status("idle", req.header)

    async def _shutdown(self, req: Request | None) -> None:
        """Shutdown wins (semantics 13): workers end at once, nothing respawns, then the reply."""
        self._stopping = True
        if req is not None:
            self.frontend.status("busy", req.header)
        await self.supervisor.shutdown()
        pending = ([self.queue.inflight] if self.queue.inflight else []) + self.queue.clear() + self._held
        self.queue.inflight = None
        for r in pending:
            self._abort(r, busy=not r.busy_seen)
        self._held.clear()
        if req is not None:
            content = {"status": "ok", "restart": bool(req.content.get("restart", False))}
            self.frontend.reply(req.channel, req.idents, "shutdown_reply", content, req.header)
            self.frontend.send_iopub("shutdown_reply", content, req.header)
            self.frontend.status("idle", req.header)
        self._stopped.set()

    def _forward_now(self, req: Request) -> None:
        """comm messages, control requests for the worker, unknown types: not queued."""
        gen = self.generation
        if gen is None:
            self._held.append(req)
            self.supervisor.ensure_started()
            return
        req.generation = gen
        self._waiting[req.msg_id] = req
        if req.msg_type == "comm_open":
            self._open_comms.add(req.content.get("comm_id", ""))
        elif req.msg_type == "comm_close":
            self._open_comms.discard(req.content.get("comm_id", ""))
        elif req.msg_type == "debug_request":
            self._debugging = True
        self.supervisor.send(req.channel, req.wire.frames())

    # -- the queue ---------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start the next queued request: answered here, refused, or sent to the current generation."""
        while self.queue.inflight is None and self.queue.waiting and not self._stopping:
            req = self.queue.waiting[0]
            if req.msg_type == "execute_request" and (req.magics is not None or req.magic_error):
                self.queue.take()
                self._tg.create_task(self._run_magics(req))
                return
            if req.msg_type == "history_request" and self.cell_log.recording:
                self.queue.take()
                self._history(req)
                continue
            refusal = self._refusal(req)
            if refusal is not None:
                self.queue.take()
                self._answer_here(req, error=refusal)
                continue
            if self.generation is None:
                self.supervisor.ensure_started()
                return
            req = self.queue.take()
            if self.cell_log.is_cell(req) and self.cell_log.recording and req.record is None:
                # Durable before visible (semantics 3): the row commits before the worker sees it.
                self.cell_log.start(req, self.generation.number, lambda error, r=req: self._recorded(r, error))
            else:
                self._send_to_worker(req)
            return

    def _recorded(self, req: Request, error) -> None:
        """The cell's `running` row is committed (or could not be): now it may run."""
        if req is not self.queue.inflight:
            return  # answered meanwhile (shutdown)
        if error is not None:
            req.record = None
            self._answer_here(req, error=session_paused_error(error))
        elif self.generation is None:
            self.queue.inflight = None  # its generation ended meanwhile: it runs on the next one
            self.queue.push_front(req)
            self.supervisor.ensure_started()
        else:
            self._send_to_worker(req)

    def _history(self, req: Request) -> None:
        """From the cell log, so history survives workers and sessions (it is not the worker's own)."""
        try:
            history = self.supervisor.store.history(req.content, self.supervisor.notebook)
            content = {"status": "ok", "history": history}
        except Exception as e:  # a bad pattern or a broken file: an error reply, never a hang
            log.warning("history from the cell log failed: %s", e)
            content = {"status": "error", "ename": type(e).__name__, "evalue": str(e), "traceback": [], "history": []}
        req.reply_content = content
        self.replies.own(req, content)
        self._complete(req)

    def _refusal(self, req: Request) -> CellError | None:
        """Why `req` must not run now, if it must not (crash loop, poisoned code)."""
        if self.generation is None and self.supervisor.crash_loop is not None:
            return crash_loop_error(self.supervisor.crash_loop, self.supervisor.restart_window)
        store = self.supervisor.store
        if self.cell_log.is_cell(req) and store.unavailable is not None and store.required:
            return session_paused_error(store.unavailable)
        if req.msg_type == "execute_request":
            code = req.worker_code
            if self.supervisor.policy.is_poisoned(code):
                return poisoned_error(self.supervisor.policy.poison_count())
        return None

    def _send_to_worker(self, req: Request) -> None:
        req.generation = self.generation
        self._waiting[req.msg_id] = req
        if req.msg_type != "execute_request":
            self.supervisor.send("shell", req.wire.frames())
            return
        self._last_execute = req
        store = self.supervisor.store
        if store.unavailable is not None and not self._told_unrecorded and not req.silent:
            self._told_unrecorded = True
            self._notice = unrecorded_notice(store.unavailable) + (self._notice or "")
        if self._notice and not req.silent:
            self._publish_output(req, "stream", {"name": "stderr", "text": self._notice})
            self._notice = None
        self.supervisor.send_execute(self._as_worker_execute(req), msg_id=req.msg_id, code=req.worker_code,
                                     counts=req.counts, timeout=req.timeout)

    def _as_worker_execute(self, req: Request) -> list:
        """The execute as the worker gets it: stop_on_error off (the proxy applies it), and the
        body of a `%%klbr timeout=` cell without its first line.

        ipykernel aborts what reaches it right after an error; with one request in flight that would
        abort the next cell the proxy sends, not the ones the frontend had queued.
        """
        if not req.content.get("stop_on_error", True) and req.body is None:
            return req.wire.frames()
        content = dict(req.content, stop_on_error=False, code=req.worker_code)
        body = req.wire.body
        packed = [bytes(body[1]), bytes(body[2]), bytes(body[3]), self.session.pack(content)]
        return [req.wire.frames()[0], self.session.sign(packed), *packed, *body[5:]]

    def _complete(self, req: Request) -> None:
        """`req` is answered: abort the executes queued behind an error (as ipykernel does), go on."""
        if req is self.queue.inflight:
            status = (req.reply_content or {}).get("status", "ok")
            for aborted in self.queue.finish(req, status):
                self._abort(aborted)
        asyncio.get_running_loop().call_soon(self._pump)

    def _abort(self, req: Request, *, busy: bool = True) -> None:
        """Answer `req` aborted, unrun (queued behind an error, or at shutdown), and record it so."""
        if req.record is None:
            self.cell_log.answered(req, {"status": "aborted"})
        self.replies.own(req, {"status": "aborted"} if req.msg_type in QUEUED else None, busy=busy)

    def _release(self, req: Request) -> None:
        """The outcome is committed: now the frontend may see the reply and idle that were held."""
        held, req.held = req.held, []
        for send in held:
            send()
        self._complete(req)

    def _publish_output(self, req: Request, msg_type: str, content: dict) -> None:
        """An output the proxy itself gives a cell: shown, and recorded like the worker's."""
        self.frontend.send_iopub(msg_type, content, req.header)
        if req.record is not None:
            self.cell_log.output(req, msg_type, self.session.pack(content))
        else:
            req.own_outputs.append((msg_type, content))  # recorded with the row, when it is written

    # -- %klbr cells -------------------------------------------------------------------------------

    async def _run_magics(self, req: Request) -> None:
        error, text = None, ""
        if req.magic_error:
            error = CellError("UsageError", req.magic_error)
        else:
            try:
                for magic in req.magics:
                    text += await magic_output(magic, self.supervisor)
            except MagicError as e:
                error = CellError("UsageError", str(e))
            except Exception as e:  # a bug here must cost this cell, not the kernel
                log.exception("%klbr cell failed")
                error = CellError("UsageError", f"%klbr failed: {type(e).__name__}: {e}")
        self._answer_here(req, error=error, stdout=text)

    # -- from the supervisor (WorkerListener) ------------------------------------------------------

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        if channel == "iopub":
            self._worker_iopub(wire)
            return
        req = self._waiting.get(wire.parent_id)
        if channel == "stdin":
            req = req or self._last_execute
            if req is not None:
                self.stdin.to_frontend(req, wire)
            return
        if req is None:
            log.debug("reply to an unknown request dropped: %s", wire.msg_type)
            return
        req.reply = wire
        if wire.msg_type == "execute_reply":
            self._execute_reply(req, wire)
        else:
            self.frontend.forward(req.channel, req.idents, wire.frames())
        self._check_done(req)

    def _execute_reply(self, req: Request, wire: Wire) -> None:
        count = wire.content.get("execution_count")
        if req.counts and isinstance(count, int) and wire.content.get("status") != "aborted":
            self.supervisor.note_execution_count(count, from_worker=True)
        if self.supervisor.cell_timed_out(req.msg_id):
            # The deadline's interrupt worked: the namespace is kept, but the cell's outcome is the
            # deadline, not a KeyboardInterrupt the user never pressed.
            error = timeout_error(req.count, self.supervisor.policy.timeout_for(req.timeout), killed=False)
            content = {"status": "error", **error.content(), "execution_count": count}
            req.reply_content = content
            self._publish_output(req, "error", error.content())
            self._send_or_hold(req, lambda: self.replies.reply(req, content))
        else:
            req.reply_content = wire.content

            def forward() -> None:
                self.replies.replied(req)
                self.frontend.forward(req.channel, req.idents, wire.frames())

            self._send_or_hold(req, forward)
        if req.record is not None and req is self.queue.inflight:
            # The outcome commits now, while the worker's idle is still on its way: usually it is
            # durable before the idle arrives, and nothing waits for it.
            self._commit_outcome(req)

    def _send_or_hold(self, req: Request, send) -> None:
        if req.record is not None:
            req.held.append(send)
        else:
            send()

    def _worker_iopub(self, wire: Wire) -> None:
        msg_type = wire.msg_type
        if msg_type == "status":
            req = self._waiting.get(wire.parent_id)
            state = wire.content.get("execution_state")
            if req is not None and state == "busy":
                if req.busy_seen:
                    return  # a retried request: the frontend already saw its busy
                req.busy_seen = True
                if req.msg_type == "execute_request" and req is self.queue.inflight:
                    self.supervisor.cell_started(req.msg_id)
            if req is not None and state == "idle":
                req.idle = wire
                self._send_or_hold(req, lambda: self.frontend.forward("iopub", wire.prefix, wire.frames()))
                self._check_done(req)
            else:
                self.frontend.forward("iopub", wire.prefix, wire.frames())
            return
        self.frontend.forward("iopub", wire.prefix, wire.frames())
        if msg_type in OUTPUT_TYPES:
            req = self._waiting.get(wire.parent_id)
            if req is not None and req.record is not None:
                self.cell_log.output(req, msg_type, wire.body[4])
        elif msg_type == "execute_input":
            count = wire.content.get("execution_count")
            req = self._waiting.get(wire.parent_id)
            if req is not None and isinstance(count, int):
                req.count = count
        elif msg_type == "comm_open":
            self._open_comms.add(wire.content.get("comm_id", ""))
        elif msg_type == "comm_close":
            self._open_comms.discard(wire.content.get("comm_id", ""))

    def _check_done(self, req: Request) -> None:
        expects_reply = req.msg_type in QUEUED or req.msg_type in _CONTROL_REPLIES
        if req.idle is None or (expects_reply and req.reply is None):
            return
        self._waiting.pop(req.msg_id, None)
        if req is self.queue.inflight:
            if req.msg_type == "execute_request":
                self.supervisor.cell_finished(req.msg_id)
            self._idle_in(req)

    def _idle_in(self, req: Request) -> None:
        """The in-flight request's idle came (or the proxy supplies it): release what was held, once
        a recorded cell's outcome is committed."""
        req.idle_in = True
        if req.record is not None:
            self._settle(req)
        else:
            self._release(req)

    def _commit_outcome(self, req: Request) -> None:
        req.committing = True
        req.committed_outputs = req.record.seq
        self.cell_log.finish(req, req.reply_content or {}, lambda error, r=req: self._outcome_committed(r))

    def _outcome_committed(self, req: Request) -> None:
        req.committing = False
        self._settle(req)

    def _settle(self, req: Request) -> None:
        """Release a recorded cell's held reply and idle once both are in and its outcome, with every
        output before the idle, is committed (semantics 3). An output that came between the reply
        and the idle (they travel on different sockets) costs one more commit."""
        if req.committing or not req.idle_in or req.released:
            return
        if req.committed_outputs == req.record.seq:
            req.released = True
            self._release(req)
        else:
            self._commit_outcome(req)

    def generation_ready(self, generation: Generation) -> None:
        self.generation = generation
        held, self._held = self._held, []
        for req in held:
            self._forward_now(req)
        self._pump()

    def generation_ended(self, generation: Generation, ending: Ending) -> None:
        """Answer everything that waited on `generation`; retry what is safe to retry (semantics 8)."""
        was_ready = self.generation is generation
        self.generation = None
        waiting, self._waiting = self._waiting, {}
        inflight = self.queue.inflight
        if ending.reason is EndReason.SHUTDOWN:
            for req in waiting.values():
                if req.record is not None:  # ended by the shutdown: say so in the log, not 'running'
                    self.cell_log.finish(req, {"status": "aborted"}, lambda error: None)
                self.replies.own(req, {"status": "aborted"} if req.msg_type in QUEUED else None, busy=not req.busy_seen)
            if inflight is not None and inflight.generation is generation:
                self.queue.inflight = None
            return
        parent = self._last_execute.header if self._last_execute else {}
        for req in waiting.values():
            if req is inflight:
                continue
            # comm and control traffic the worker never finished: close its bracket.
            content = None
            if req.msg_type in _CONTROL_REPLIES:
                content = {"status": "error", **self._ending_error(ending, generation, req).content()}
            self.replies.own(req, content, busy=not req.busy_seen)
        for comm_id in sorted(self._open_comms):
            # Its widgets lived in the dead worker: tell the frontend they are gone.
            self.frontend.send_iopub("comm_close", {"comm_id": comm_id, "data": {}}, parent)
        self._open_comms.clear()
        if self._debugging:
            self.frontend.send_iopub("debug_event", {"type": "event", "seq": 0, "event": "terminated", "body": {}}, parent)
            self._debugging = False
        if inflight is not None and inflight.generation is generation:
            if inflight.idle_in:
                pass  # it finished; the commit of its outcome releases it
            elif inflight.reply is not None and inflight.msg_type == "execute_request":
                self._idle_for(inflight)  # it had its reply: its outcome stands, only its idle is missing
            else:
                self._answer_lost(inflight, ending, generation)
        elif was_ready and ending.reason is EndReason.LOST:
            self._notice = (
                f"klbr: the worker of generation {generation.number} (pid {generation.pid}) "
                f"{ending.how} while idle; its namespace is gone. This cell runs in a new generation.\n"
            )
        if ending.reason is EndReason.START_FAILED:
            # No worker to wait for: everything queued gets the same answer now, never a hang.
            for req in self.queue.clear() + self._held:
                self._answer_here(req, error=self._ending_error(ending, generation, req))
            self._held.clear()
        elif self.supervisor.crash_loop is not None:
            self._pump()  # everything queued is refused with the crash-loop error

    def _idle_for(self, req: Request) -> None:
        """Close the busy/idle bracket of an execute whose worker ended after replying."""
        req.held.append(lambda: self.frontend.status("idle", req.header))
        self._idle_in(req)

    def _answer_lost(self, req: Request, ending: Ending, generation: Generation) -> None:
        if req.msg_type != "execute_request" and not req.retried and ending.reason is not EndReason.START_FAILED:
            req.retried = True  # idempotent: once more on the next generation
            req.reply = req.idle = None
            self.queue.inflight = None
            self.queue.push_front(req)
            return
        self._answer_here(req, error=self._ending_error(ending, generation, req), busy=not req.busy_seen)

    def _ending_error(self, ending: Ending, generation: Generation, req: Request) -> CellError:
        if ending.reason is EndReason.DEADLINE and req.msg_type == "execute_request":
            return timeout_error(req.count or self.supervisor.last_count + 1,
                                 self.supervisor.policy.timeout_for(req.timeout), killed=True,
                                 generation=generation.number, pid=generation.pid, how=ending.how)
        count = req.count if req.count is not None else self.supervisor.last_count + 1
        cell = f"cell [{count}]" if req.msg_type == "execute_request" and req.counts else "this request"
        return ending_error(ending, generation=generation.number, pid=generation.pid, cell=cell)

    # -- the proxy's own answers -------------------------------------------------------------------

    def _answer_here(self, req: Request, *, error: CellError | None = None, stdout: str = "",
                     busy: bool = True) -> None:
        """Answer a queued request without (further) help from a worker: a `%klbr` cell, a refusal,
        or a request whose generation ended. Executes get a count and an In[n], as any cell; a
        recorded cell's reply and idle wait for its outcome to commit."""
        if req.msg_type != "execute_request":
            content = {"status": "error", **error.content()} if error else {"status": "ok"}
            req.reply_content = content
            self.replies.own(req, content, busy=busy)
            self._complete(req)
            return
        if busy:
            self.frontend.status("busy", req.header)
        if req.counts:
            announce = req.count is None  # the worker never said In[n] for it
            if announce:
                req.count = self.supervisor.last_count + 1
            self.supervisor.note_execution_count(req.count, code=req.code, from_worker=False)
            if announce:
                self.frontend.send_iopub("execute_input", {"code": req.code, "execution_count": req.count}, req.header)
        count = req.count if req.count is not None else self.supervisor.last_count
        if stdout and not req.silent:
            self._publish_output(req, "stream", {"name": "stdout", "text": stdout})
        if error is not None:
            if not req.silent:
                self._publish_output(req, "error", error.content())
            content = {"status": "error", **error.content(), "execution_count": count}
        else:
            content = {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
        req.reply_content = content
        req.held += [lambda: self.replies.reply(req, content), lambda: self.frontend.status("idle", req.header)]
        if req.record is not None:
            self.cell_log.finish(req, content, lambda error, r=req: self._release(r))
        else:
            self.cell_log.answered(req, content, req.own_outputs)
            self._release(req)
