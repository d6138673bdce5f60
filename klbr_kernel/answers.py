"""What the proxy answers itself: `%klbr` cells, history from the cell log, refusals, aborted
requests, interrupt and shutdown requests, and the error of a request whose generation ended.

An execute answered here is a cell like any other: it gets an execution count and an `In[n]`
(semantics 4), its outputs are shown and recorded, and its reply and idle wait until its outcome is
committed (semantics 3).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .magics import replay_spec
from .outcomes import CellError, refusal_error, session_paused_error
from .requests import QUEUED, Phase, Request
from .status import magic_output

if TYPE_CHECKING:
    from .proxy import Proxy

log = logging.getLogger(__name__)


class Answers:
    def __init__(self, proxy: Proxy):
        self.proxy = proxy
        self._unseen: list[str] = []  # notices of cells whose outputs reached no one, for the next cell

    def begin(self, req: Request) -> None:
        """An execute the proxy answers starts as a worker's would: busy, its count and In[n], and
        the notices the next cell is to show. Once; calling it again changes nothing."""
        proxy = self.proxy
        proxy.replies.busy(req)
        if req.counts:
            announce = req.count is None  # the worker never said In[n] for it
            req.count = proxy.supervisor.counts.answered(req.code, req.count, req.msg_id)
            if announce:
                proxy.frontend.send_iopub("execute_input", {"code": req.code, "execution_count": req.count}, req.header)
                self.notices(req)

    def notices(self, req: Request, more: str | None = None) -> None:
        """Start a cell's output with what it must tell first (`more`, then outputs that reached no one)."""
        text = (more or "") + "".join(self._unseen)
        if text and not req.silent:
            self._unseen.clear()
            self.output(req, "stream", {"name": "stderr", "text": text})

    def unseen(self, req: Request) -> None:
        """`req` is done: if its outputs reached no frontend, the next cell says so, once."""
        record = req.record
        if record is None or record.id is None or not (req.unseen or req.orphaned):
            return
        count = f"cell [{req.count}]" if req.count is not None else "a cell"
        if req.orphaned:
            what = (f"klbr: {count} ended after the frontend that ran it disconnected, so its "
                    f"{record.seq} outputs reached no notebook")
        else:
            what = f"klbr: {req.unseen} outputs of {count} were published while no frontend was connected"
        self._unseen.append(f"{what}; `%klbr replay {record.id}` brings them back.\n")

    def here(self, req: Request, *, error: CellError | None = None, stdout: str = "") -> None:
        """Answer a queued request without (further) help from a worker: a `%klbr` cell, a refusal,
        or a request whose generation ended."""
        proxy = self.proxy
        req.move(Phase.ANSWERED)
        req.outcome = error.status if error is not None else "ok"
        if req.msg_type != "execute_request":
            content = {"status": "error", **error.content()} if error else {"status": "ok"}
            proxy.replies.own(req, content)
            req.reply_content = content
            proxy.delivery.release(req)
            return
        self.begin(req)
        count = req.count if req.count is not None else proxy.supervisor.counts.last
        if stdout and not req.silent:
            self.output(req, "stream", {"name": "stdout", "text": stdout})
        if error is not None:
            if not req.silent:
                self.output(req, "error", error.content())
            content = {"status": "error", **error.content(), "execution_count": count}
        else:
            content = {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
        req.reply_content = content
        req.held += [lambda: proxy.replies.reply(req, content), lambda: proxy.replies.idle(req)]
        if self._record(req, content, req.own_outputs):
            proxy.delivery.release(req)

    def _record(self, req: Request, content: dict, outputs: list[tuple[str, dict]] = ()) -> bool:
        """The outcome of a cell answered here, durable before its held reply goes out (semantics 3):
        True when it is already; otherwise the reply is released once the row is committed."""
        cell_log = self.proxy.cell_log
        then = self.proxy.guarded(req, lambda error: self._committed(req))
        if req.record is not None:  # its row says `running`: say how it ended
            return cell_log.finish(req, content, then)
        return cell_log.answered(req, content, then, outputs)

    def _committed(self, req: Request) -> None:
        if req.phase is Phase.ANSWERED:  # not released meanwhile by a shutdown
            self.proxy.delivery.release(req)

    def abort(self, req: Request) -> None:
        """Answer `req` aborted, unrun (queued behind an error, or at shutdown), and record it so:
        its reply goes out once its row is committed, at shutdown at once."""
        proxy = self.proxy
        if req.phase is Phase.DONE:
            return
        if req.phase is Phase.ANSWERED:
            # Answered already, its reply held for an outcome commit that has not landed (a locked
            # database): at shutdown that answer goes out now; the commit still lands, or the
            # store's close reports it (shutdown wins, semantics 13).
            proxy.delivery.release(req)
            return
        proxy.forget(req)
        req.move(Phase.ANSWERED)
        req.outcome = "aborted"
        content = {"status": "aborted"}
        req.held.append(lambda: proxy.replies.own(req, content if req.msg_type in QUEUED else None))
        # At shutdown the answer goes out now (semantics 13); the row still lands, or the store's
        # close reports it.
        if self._record(req, content) or proxy.stopping:
            proxy.delivery.release(req)

    def refuse_forwarded(self, req: Request, error: CellError) -> None:
        """comm or control traffic no worker will take (a crash loop): its bracket closes now, and
        a control request that expects a reply gets `error`."""
        proxy = self.proxy
        proxy.forget(req)
        req.move(Phase.ANSWERED)
        content = {"status": "error", **error.content()} if req.expects_reply else None
        proxy.replies.own(req, content)
        req.move(Phase.DONE)

    def output(self, req: Request, msg_type: str, content: dict) -> None:
        """An output the proxy itself gives a cell: shown, and recorded like the worker's."""
        proxy = self.proxy
        proxy.frontend.send_iopub(msg_type, content, req.header)
        if not proxy.frontend.subscriptions:
            req.unseen += 1
        if req.record is not None:
            proxy.cell_log.output(req, msg_type, proxy.session.pack(content))
        else:
            req.own_outputs.append((msg_type, content))  # recorded with the row, when it is written

    def refusal(self, req: Request) -> CellError | None:
        """Why `req` must not run now, if it must not (crash loop, poisoned code, no cell log)."""
        proxy = self.proxy
        cell_log = proxy.cell_log
        if cell_log.is_cell(req) and cell_log.unavailable is not None and cell_log.required:
            return session_paused_error(cell_log.unavailable)
        refusal = proxy.supervisor.refusal(req.worker_code if req.msg_type == "execute_request" else None)
        return refusal_error(refusal) if refusal is not None else None

    def history(self, req: Request) -> None:
        """From the cell log, so history survives workers and sessions (it is not the worker's own)."""
        proxy = self.proxy
        try:
            history = proxy.cell_log.history(req.content, proxy.supervisor.notebook)
            content = {"status": "ok", "history": history}
        except Exception as e:  # a bad pattern or a broken file: an error reply, never a hang
            log.warning("history from the cell log failed: %s", e)
            content = {"status": "error", "ename": type(e).__name__, "evalue": str(e), "traceback": [], "history": []}
        req.move(Phase.ANSWERED)
        proxy.replies.own(req, content)
        proxy.delivery.release(req)

    async def magics(self, req: Request) -> None:
        """A cell of `%klbr` lines, carried out by the supervisor (`status`) or the `replay`; what
        each line prints is shown as it is done."""
        error = None
        self.begin(req)
        if req.magic_error:
            error = CellError("UsageError", req.magic_error)
        else:
            try:
                for magic in req.magics:
                    if magic.command == "replay":
                        await self.proxy.replay.run(req, replay_spec(magic.args))
                        continue
                    text = await magic_output(magic, self.proxy.supervisor, self.proxy.cell_log,
                                              self.proxy.frontend)
                    if text and not req.silent:
                        self.output(req, "stream", {"name": "stdout", "text": text})
            except ValueError as e:  # MagicError, and a bad argument
                error = CellError("UsageError", str(e))
        if req.phase is Phase.PROXY:  # not answered meanwhile (a shutdown)
            self.here(req, error=error)

    async def interrupt(self, req: Request) -> None:
        proxy = self.proxy
        proxy.replies.busy(req)
        await proxy.interrupt()
        req.move(Phase.ANSWERED)
        proxy.replies.own(req, {"status": "ok"})
        req.move(Phase.DONE)

    async def shutdown(self, req: Request | None) -> None:
        """Shutdown wins (semantics 13): workers end at once, nothing respawns, then the reply.
        `req` is None for a SIGTERM. Whatever fails on the way, the kernel still stops."""
        proxy = self.proxy
        proxy.stopping = True
        try:
            if req is not None:
                proxy.replies.busy(req)
            await proxy.supervisor.shutdown()
        finally:
            try:
                pending = ([proxy.queue.inflight] if proxy.queue.inflight else []) + proxy.queue.clear() + proxy.held
                for r in pending:
                    proxy.guard(r, self.abort, r)  # one that fails costs itself, not the others
                if req is not None:
                    content = {"status": "ok", "restart": bool(req.content.get("restart", False))}
                    req.move(Phase.ANSWERED)
                    proxy.replies.own(req, content)
                    proxy.frontend.send_iopub("shutdown_reply", content, req.header)
                    req.move(Phase.DONE)
            finally:
                proxy.stopped()
