"""The proxy kernel: speaks Jupyter to the frontend and routes everything through the supervisor.

It answers kernel_info, interrupt and shutdown itself; queues shell requests and sends them to the
current generation one at a time; forwards comm, stdin and control traffic; and relays the worker's
replies and iopub untouched (the worker signs with the frontend's key and the proxy's session id, so
every message the frontend sees carries one session). When a generation ends, every request that was
waiting on it is answered here (DESIGN.md semantics 1, 2, 10, 11).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone

from jupyter_client.session import Session

from klbr_supervisor.generation import Generation
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.wire import Wire

from .frontend import Frontend
from .kernel_info import kernel_info_content
from .outcomes import CellError, ending_error
from .queue import ShellQueue
from .requests import COMM, OWN, QUEUED, SUBSHELL, Request

log = logging.getLogger(__name__)

# Control requests a worker answers with a reply (others get busy/idle only, as in ipykernel).
_CONTROL_REPLIES = frozenset({"debug_request", "usage_request"})


class Proxy:
    """Created by the app with the frontend's connection info; `run` serves until shutdown."""

    def __init__(self, info: dict, session: Session, parent=None):
        self.session = session
        self.frontend = Frontend(info, session, self._frontend_message)
        self.supervisor = Supervisor(self, session=session, parent=parent)
        self.queue = ShellQueue()
        self.generation: Generation | None = None
        # Forwarded requests still waiting for a reply or an idle, by msg_id.
        self._waiting: dict[str, Request] = {}
        # Forwarded-at-once requests that arrived while no generation was ready.
        self._held: list[Request] = []
        self._last_execute: Request | None = None
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
        """SIGINT (clients that interrupt by signal)."""
        self._tg.create_task(self.supervisor.interrupt())

    # -- from the frontend -------------------------------------------------------------------------

    def _frontend_message(self, channel: str, wire: Wire) -> None:
        if channel == "stdin":
            # input_reply: to the worker that asked. Never recorded (getpass answers stay secret).
            self.supervisor.send("stdin", wire.frames())
            return
        try:
            req = Request.decode(channel, wire)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("%s: %s with undecodable content: %s", channel, wire.msg_type, e)
            self._answer_invalid(Request(channel, wire), f"content is not a JSON object: {e}")
            return
        if self._stopping:
            self._own_reply(req, {"status": "aborted"} if req.msg_type.endswith("_request") else None)
            return
        msg_type = req.msg_type
        if msg_type in OWN:
            self._own(req)
        elif msg_type in SUBSHELL:
            self._own_reply(req, CellError("SubshellsNotSupported", "klbr does not offer kernel subshells").content() | {"status": "error"})
        elif channel == "shell" and msg_type in QUEUED:
            self.queue.push(req)
            self._pump()
        else:
            self._forward_now(req)

    def _own(self, req: Request) -> None:
        if req.msg_type == "kernel_info_request":
            gen = self.generation
            info = gen.kernel_info if gen else None
            self._own_reply(req, kernel_info_content(info, gen.number if gen else None, self.supervisor.placement))
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
        for pending in self.queue.clear() + self._held:
            self._own_reply(pending, {"status": "aborted"} if pending.msg_type in QUEUED else None)
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
        self._waiting[req.msg_id] = req
        self.supervisor.send(req.channel, req.wire.frames())

    def _pump(self) -> None:
        """Send the next queued request if the current generation is free."""
        while self.generation is not None:
            req = self.queue.take()
            if req is None:
                return
            self._waiting[req.msg_id] = req
            if req.msg_type == "execute_request":
                self._last_execute = req
                if self._notice:
                    self.frontend.send_iopub("stream", {"name": "stderr", "text": self._notice}, req.header)
                    self._notice = None
                frames = self._as_worker_execute(req)
            else:
                frames = req.wire.frames()
            self.supervisor.send("shell", frames)
            return
        if self.queue.waiting:
            self.supervisor.ensure_started()

    def _as_worker_execute(self, req: Request) -> list:
        """The execute as the worker gets it: stop_on_error off, since the proxy applies it.

        ipykernel aborts what reaches it right after an error; with one request in flight that would
        abort the next cell the proxy sends, not the ones the frontend had queued.
        """
        if not req.content.get("stop_on_error", True):
            return req.wire.frames()
        content = dict(req.content, stop_on_error=False)
        body = req.wire.body
        packed = [bytes(body[1]), bytes(body[2]), bytes(body[3]), self.session.pack(content)]
        return [req.wire.frames()[0], self.session.sign(packed), *packed, *body[5:]]

    # -- from the supervisor (WorkerListener) ------------------------------------------------------

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        if channel == "iopub":
            self._worker_iopub(wire)
            return
        req = self._waiting.get(wire.parent_id)
        if channel == "stdin":
            req = req or self._last_execute
            if req is not None:
                self.frontend.forward("stdin", req.idents, wire.frames())
            return
        if req is None:
            log.debug("reply to an unknown request dropped: %s", wire.msg_type)
            return
        req.reply = wire
        if wire.msg_type == "execute_reply":
            count = wire.content.get("execution_count")
            if isinstance(count, int):
                self.supervisor.note_execution_count(count)
        self.frontend.forward(req.channel, req.idents, wire.frames())
        self._check_done(req)

    def _worker_iopub(self, wire: Wire) -> None:
        if wire.msg_type == "status":
            req = self._waiting.get(wire.parent_id)
            state = wire.content.get("execution_state")
            if req is not None and state == "busy":
                if req.busy_seen:
                    return  # a retried request: the frontend already saw its busy
                req.busy_seen = True
            self.frontend.forward("iopub", wire.prefix, wire.frames())
            if req is not None and state == "idle":
                req.idle = wire
                self._check_done(req)
            return
        self.frontend.forward("iopub", wire.prefix, wire.frames())
        if wire.msg_type == "execute_input":
            count = wire.content.get("execution_count")
            req = self._waiting.get(wire.parent_id)
            if req is not None and isinstance(count, int):
                req.count = count

    def _check_done(self, req: Request) -> None:
        expects_reply = req.msg_type in QUEUED or req.msg_type in _CONTROL_REPLIES
        if req.idle is None or (expects_reply and req.reply is None):
            return
        self._waiting.pop(req.msg_id, None)
        if req is self.queue.inflight:
            status = req.reply.content.get("status", "ok") if req.reply is not None else "ok"
            for aborted in self.queue.finish(req, status):
                self._own_reply(aborted, {"status": "aborted"})
            self._pump()

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
        if ending.reason is EndReason.SHUTDOWN:
            for req in list(self._waiting.values()):
                self._own_reply(req, {"status": "aborted"} if req.msg_type in QUEUED else None, busy=not req.busy_seen)
            self._waiting.clear()
            self.queue.inflight = None
            return
        inflight = self.queue.inflight
        for req in list(self._waiting.values()):
            if req is inflight:
                continue
            # comm and control traffic the worker never finished: close its bracket.
            content = self._error_content(ending, generation, req) if req.msg_type in _CONTROL_REPLIES else None
            self._own_reply(req, content, busy=not req.busy_seen)
        self._waiting.clear()
        if inflight is not None:
            self._answer_inflight(inflight, ending, generation)
        elif was_ready and ending.reason is EndReason.LOST:
            self._notice = (
                f"klbr: the worker of generation {generation.number} (pid {generation.pid}) "
                f"{ending.how} while idle; its namespace is gone. This cell runs in a new generation.\n"
            )
        if ending.reason is EndReason.START_FAILED:
            # No worker to wait for: everything queued gets the same answer now, never a hang.
            for req in self.queue.clear() + self._held:
                self._answer_error(req, ending, generation, busy=True)
            self._held.clear()

    def _answer_inflight(self, req: Request, ending: Ending, generation: Generation) -> None:
        self.queue.inflight = None
        if req.msg_type != "execute_request":
            if not req.retried and ending.reason is not EndReason.START_FAILED:
                req.retried = True  # idempotent: once more on the next generation
                req.reply = req.idle = None
                self.queue.push_front(req)
                return
            self._answer_error(req, ending, generation, busy=not req.busy_seen)
            return
        self._answer_error(req, ending, generation, busy=not req.busy_seen)
        for aborted in self.queue.finish(req, "error"):
            self._own_reply(aborted, {"status": "aborted"})

    def _answer_error(self, req: Request, ending: Ending, generation: Generation, *, busy: bool) -> None:
        seen_input = req.count is not None
        content = self._error_content(ending, generation, req)
        if busy:
            self.frontend.status("busy", req.header)
        if req.msg_type == "execute_request" and not seen_input and not req.silent:
            # The worker died before announcing the cell: announce it, so the notebook shows In[n].
            code = req.content.get("code", "")
            self.frontend.send_iopub("execute_input", {"code": code, "execution_count": content["execution_count"]}, req.header)
        if req.msg_type == "execute_request" and not req.silent:
            self.frontend.send_iopub("error", {k: content[k] for k in ("ename", "evalue", "traceback")}, req.header)
        self._own_reply(req, content, busy=False)

    def _error_content(self, ending: Ending, generation: Generation, req: Request) -> dict:
        count = req.count
        if req.msg_type == "execute_request" and count is None and req.content.get("store_history", True) and not req.silent:
            count = self.supervisor.last_count + 1
        if count is not None:
            self.supervisor.note_execution_count(count)
        cell = f"cell [{count}]" if count is not None else "this request"
        error = ending_error(ending, generation=generation.number, pid=generation.pid, cell=cell)
        content = {"status": "error", **error.content()}
        if req.msg_type == "execute_request":
            content["execution_count"] = count
            content.setdefault("user_expressions", {})
            content.setdefault("payload", [])
        return content

    # -- the proxy's own answers -------------------------------------------------------------------

    def _own_reply(self, req: Request, content: dict | None, *, busy: bool = True) -> None:
        """Answer `req` here: busy (unless the worker already said it), reply if any, idle."""
        if busy:
            self.frontend.status("busy", req.header)
        if content is not None:
            reply_type = req.msg_type.rsplit("_", 1)[0] + "_reply"
            metadata = {
                "started": datetime.now(timezone.utc).isoformat(),
                "dependencies_met": True,
                "engine": self.session.session,
                "status": content.get("status"),
            }
            self.frontend.reply(req.channel, req.idents, reply_type, content, req.header, metadata)
        self.frontend.status("idle", req.header)

    def _answer_invalid(self, req: Request, why: str) -> None:
        content = None
        if req.msg_type.endswith("_request"):
            content = {"status": "error", "ename": "InvalidMessage", "evalue": why, "traceback": []}
        self._own_reply(req, content)
