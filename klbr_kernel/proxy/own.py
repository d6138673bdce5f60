"""What the proxy answers itself: history from the cell log, refusals, aborted requests, the error of
a request whose generation ended, the end of a `%klbr` cell; and how every answered request ends:
released once its outcome is durable, then the queue goes on.

An execute answered here is a cell like any other: it gets an execution count and an `In[n]`
(semantics 4), its outputs are shown and recorded, and its reply and idle wait until its outcome is
committed (semantics 3).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from jupyter_client.session import Session

from klbr_supervisor.store import StoreError
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.notices import Notices
from ..cell_log.recording import CellLog
from ..frontend.sockets import Frontend
from ..requests.counts import ExecutionCounts
from ..requests.current import Current
from ..requests.outcomes import CellError, refusal_error, session_paused_error
from ..requests.queue import ShellQueue
from ..requests.request import QUEUED, Phase, Request
from ..requests.states import Machine, ProxyState
from .boundary import Boundary
from .brackets import Brackets

log = logging.getLogger(__name__)


class OwnAnswers:
    def __init__(self, boundary: Boundary, *, life: Machine[ProxyState], queue: ShellQueue, current: Current,
                 frontend: Frontend, brackets: Brackets, cell_log: CellLog, supervisor: Supervisor, session: Session,
                 counts: ExecutionCounts, notices: Notices, state_changed: Callable[[], None]):
        """`life`: the proxy's state (what waits is answered at once once it stops); `supervisor`:
        for refusals (a poisoned cell) and the notebook's name; `counts`: where a cell answered here
        takes its count; `notices`: of outputs that reached no one, given by the next cell;
        `state_changed`: called as each request is released (the store may have paused or resumed
        with it: the klbr comm says so)."""
        self._boundary = boundary
        self._life = life
        self._queue = queue
        self._current = current
        self._frontend = frontend
        self._brackets = brackets
        self._cell_log = cell_log
        self._supervisor = supervisor
        self._session = session
        self._counts = counts
        self._notices = notices
        self._state_changed = state_changed

    def begin(self, req: Request) -> None:
        """An execute the proxy answers starts as a worker's would: busy, its count and In[n], and
        the notices the next cell is to show. Once; calling it again changes nothing."""
        self._brackets.busy(req)
        if req.counts:
            announce = req.count is None  # the worker never said In[n] for it
            self._counts.number_answered(req)
            if announce:
                self._frontend.send_iopub("execute_input", {"code": req.code, "execution_count": req.count},
                                          req.header)
                self.notices(req)

    def notices(self, req: Request, more: str | None = None) -> None:
        """Start a cell's output with what it must tell first (`more`, then outputs that reached no one)."""
        if req.silent:
            return
        if more:
            self.output(req, "stream", {"name": "stderr", "text": more})
        self._notices.show(req)

    def here(self, req: Request, *, error: CellError | None = None, stdout: str = "") -> None:
        """Answer a queued request without (further) help from a worker: a `%klbr` cell, a refusal,
        or a request whose generation ended."""
        req.move(Phase.ANSWERED)
        outcome = error.status if error is not None else "ok"
        if req.execute is None:
            content = {"status": "error", **error.content()} if error else {"status": "ok"}
            self._brackets.own(req, content)
            self.release(req)
            return
        self.begin(req)
        count = req.count if req.count is not None else self._counts.last
        if stdout and not req.silent:
            self.output(req, "stream", {"name": "stdout", "text": stdout})
        if error is not None:
            if not req.silent:
                self.output(req, "error", error.content())
            content = {"status": "error", **error.content(), "execution_count": count}
        else:
            content = {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
        self._brackets.decided(req, content, outcome)
        req.hold(lambda: self._brackets.reply(req, content))
        req.hold(lambda: self._brackets.idle(req))
        if self._record(req, content, req.execute.own_outputs):
            self.release(req)

    def _record(self, req: Request, content: dict[str, Any], outputs: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        """The outcome of a cell answered here, durable before its held reply goes out (semantics 3):
        True when it is already; otherwise the reply is released once the row is committed."""
        then = partial(self._committed_late, req)
        if req.record is not None:  # its row says `running`: say how it ended
            return self._cell_log.finish(req, content, then)
        return self._cell_log.answered(req, content, then, outputs)

    def _committed_late(self, req: Request, error: StoreError | None) -> None:
        """The store's callback, once a row that had to wait for its writer is in (or failed: the
        answer goes out all the same, and the store pauses the session)."""
        try:
            if req.phase is Phase.ANSWERED:  # not released meanwhile by a shutdown
                self.release(req)
        except Exception as e:
            self._boundary.fail(req, e)

    def abort(self, req: Request) -> None:
        """Answer `req` aborted, unrun (queued behind an error, or at shutdown), and record it so:
        its reply goes out once its row is committed, at shutdown at once."""
        if req.phase is Phase.DONE:
            return
        if req.phase is Phase.ANSWERED:
            # Answered already, its reply held for an outcome commit that has not landed (a locked
            # database): at shutdown that answer goes out now; the commit still lands, or the
            # store's close reports it (shutdown wins, semantics 13).
            self.release(req)
            return
        self.forget(req)
        req.move(Phase.ANSWERED)
        content = {"status": "aborted"}
        self._brackets.decided(req, content, "aborted")
        req.hold(lambda: self._brackets.own(req, content if req.msg_type in QUEUED else None))
        # At shutdown the answer goes out now (semantics 13); the row still lands, or the store's
        # close reports it.
        if self._record(req, content) or self._life.state is not ProxyState.SERVING:
            self.release(req)

    def refuse_forwarded(self, req: Request, error: CellError) -> None:
        """comm or control traffic no worker will take (a crash loop): its bracket closes now, and
        a control request that expects a reply gets `error`."""
        self.forget(req)
        req.move(Phase.ANSWERED)
        content = {"status": "error", **error.content()} if req.expects_reply else None
        self._brackets.own(req, content)
        req.move(Phase.DONE)

    def output(self, req: Request, msg_type: str, content: dict[str, Any]) -> None:
        """An output the proxy itself gives a cell: shown, and recorded like the worker's."""
        self._frontend.send_iopub(msg_type, content, req.header)
        execute = req.execute
        if execute is None:
            return
        if not self._frontend.subscriptions:
            execute.published_unseen()
        if execute.record is not None:
            self._cell_log.output(req, msg_type, self._session.pack(content))
        else:
            execute.own_outputs.append((msg_type, content))  # recorded with the row, when it is written

    def cell_note(self, msg_id: str, text: str) -> None:
        """The running cell `msg_id` left a note with `host.notify` (the supervisor says so): shown
        in its output, and recorded with it."""
        req = self._current.waiting.get(msg_id)
        if req is None:
            return
        note = {"data": {"text/plain": f"klbr note: {text}", "text/markdown": f"**klbr note:** {text}"},
                "metadata": {}, "transient": {}}
        try:
            self.output(req, "display_data", note)
        except Exception as e:
            self._boundary.fail(req, e)

    def refusal(self, req: Request) -> CellError | None:
        """Why `req` must not run now, if it must not (crash loop, poisoned code, no cell log)."""
        cell_log = self._cell_log
        if cell_log.is_cell(req) and cell_log.unavailable is not None and cell_log.required:
            return session_paused_error(cell_log.unavailable)
        refusal = self._supervisor.refusal(req.worker_code if req.msg_type == "execute_request" else None)
        return refusal_error(refusal) if refusal is not None else None

    def history(self, req: Request) -> None:
        """From the cell log, so history survives workers and sessions (it is not the worker's own)."""
        try:
            history = self._cell_log.history(req.content, self._supervisor.notebook)
            content = {"status": "ok", "history": history}
        except Exception as e:  # a bad pattern or a broken file: an error reply, never a hang
            log.warning("history from the cell log failed: %s", e)
            content = {"status": "error", "ename": type(e).__name__, "evalue": str(e), "traceback": [], "history": []}
        req.move(Phase.ANSWERED)
        self._brackets.own(req, content)
        self.release(req)

    # -- the end of every answered request ---------------------------------------------------------

    def release(self, req: Request) -> None:
        """The outcome is committed (or there is none to commit): now the frontend may see the reply
        and idle that were held, and the queue goes on."""
        req.move(Phase.DONE)
        for send in req.take_held():
            send()
        self._notices.unseen(req)
        if req is self._queue.inflight:
            # An error aborts the executes queued behind it, as ipykernel does.
            status = (req.reply_content or {}).get("status", "ok")
            for aborted in self._queue.finish(req, status):
                self.abort(aborted)
        self._state_changed()
        if self._queue.waiting:  # whatever is queued later starts the pump itself (`Dispatch`)
            asyncio.get_running_loop().call_soon(self._boundary.pump)

    def forget(self, req: Request) -> None:
        """`req` leaves every place that holds it (it is answered outside its usual path)."""
        self._current.forget(req)
        self._queue.drop(req)
