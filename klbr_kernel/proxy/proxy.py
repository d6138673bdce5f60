"""The proxy kernel: speaks Jupyter to the frontend and routes everything through the supervisor.

The `Proxy` builds its parts, hands each the collaborators it uses, and keeps what needs all of them:
the error boundary and the queue's pump (`boundary.Boundary`, the one thing its parts call back).
The state they share is each in an object of its own, with its own door (`states`): the shell queue
(`queue`), the current generation as the proxy sees it (`current`), the proxy's own life
(`lifecycle`). The parts:

- `dispatch`: what comes from the frontend, admitted by the `door`, goes where it belongs;
- `delivery`: what the worker sends goes to the frontend, and a cell's reply and idle are held
  until its outcome is committed (semantics 3);
- `own`: what the proxy answers itself (history, refusals, aborts), and how every answered
  request ends; `brackets`: the proxy's replies and busy/idle, and (`resends`) an execute sent
  again; `magics.status.MagicCells`: `%klbr` cells; `lifecycle`: interrupt and shutdown;
- `endings`: when a generation ends, everything that waited on it is answered (semantics 1, 2, 8).

The error boundary is `guard`: wherever a message or a callback enters, what its handling raises is
answered as an InternalError for the request it concerned, and the kernel keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from jupyter_client.session import Session
from traitlets.config import Configurable

from klbr_supervisor.generation import Generation
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.states import Ending
from klbr_supervisor.store import StoreError
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.tasks import Tasks

from .. import client_package
from ..cell_log.recording import CellLog
from ..comm.comms import KlbrComms
from ..frontend.sockets import Frontend
from ..frontend.standin import MAX_MESSAGE_SIZE
from ..magics.replay import Replay
from ..requests.current import Current
from ..requests.outcomes import internal_error, session_paused_error
from ..requests.queue import ShellQueue
from ..requests.request import Phase, Request
from ..requests.states import PROXY_TRANSITIONS, Machine, ProxyState
from .brackets import Brackets
from .delivery import Delivery
from .dispatch import Dispatch
from .endings import Endings
from .lifecycle import Lifecycle
from .magic_cells import MagicCells
from .own import OwnAnswers
from .stdin import StdinRelay

if TYPE_CHECKING:
    from klbr_supervisor.boot.prelaunch import Early

log = logging.getLogger(__name__)


class Proxy:
    """Created by the app with the frontend's connection info; `run` serves until shutdown."""

    def __init__(self, info: dict[str, Any], session: Session, parent: Configurable | None = None,
                 notebook: str | None = None, max_message_size: int = MAX_MESSAGE_SIZE,
                 worker_options: tuple[str, ...] = (), first_worker: Early | None = None):
        """`first_worker`: what `boot.prelaunch` started before the imports, for the supervisor."""
        self.session = session
        self.frontend = frontend = Frontend(info, session, self._frontend_message, max_message_size)
        self.supervisor = supervisor = Supervisor(self, session=session, parent=parent, notebook=notebook,
                                                  kernel_name=info.get("kernel_name") or None,
                                                  worker_options=worker_options, first=first_worker,
                                                  host_client=client_package.files())
        self.cell_log = cell_log = CellLog(supervisor.store)
        self.brackets = brackets = Brackets(frontend, session, cell_log)
        self.queue = queue = ShellQueue()
        self.current = current = Current()
        life = Machine("proxy", PROXY_TRANSITIONS, ProxyState.SERVING)
        # The klbr comm (JupyterLab's extension): answered by the proxy itself, told when the
        # generation, placement or recording state may have changed.
        self.comms = comms = KlbrComms(frontend, brackets, session, cell_log, supervisor, queue, self.start)
        self.own = own = OwnAnswers(self, life=life, queue=queue, current=current, frontend=frontend,
                                    brackets=brackets, cell_log=cell_log, supervisor=supervisor, session=session,
                                    state_changed=comms.changed)
        self.stdin = stdin = StdinRelay(frontend, supervisor, session,
                                        lambda req, text: own.output(req, "stream", {"name": "stderr", "text": text}))
        replay = Replay(frontend, cell_log, queue, supervisor.notebook, own.output)
        self.magic_cells = magic_cells = MagicCells(own, replay, supervisor, cell_log, frontend)
        self.lifecycle = lifecycle = Lifecycle(self, life=life, supervisor=supervisor, queue=queue, current=current,
                                               own=own, brackets=brackets, frontend=frontend)
        self.delivery = delivery = Delivery(self, current=current, queue=queue, supervisor=supervisor,
                                            cell_log=cell_log, own=own, brackets=brackets, stdin=stdin,
                                            frontend=frontend, session=session)
        self.dispatch = dispatch = Dispatch(self, signed=session.auth is not None, lifecycle=lifecycle, queue=queue,
                                            current=current, supervisor=supervisor, own=own,
                                            magic_cells=magic_cells, brackets=brackets, stdin=stdin,
                                            drops=frontend.drops, comms=comms)
        self.endings = Endings(self, current=current, queue=queue, supervisor=supervisor, own=own,
                               delivery=delivery, forward=dispatch.forward, brackets=brackets, frontend=frontend)
        self._tasks: Tasks | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tasks = Tasks(tg, log)
            tg.create_task(self.supervisor.run())
            self.frontend.bind()
            await self.lifecycle.stopped.wait()
        self.frontend.close()

    def request_shutdown(self) -> None:
        """SIGTERM: shut down as for a shutdown_request, with no one to reply to."""
        if self.lifecycle.serving:
            self.start(self.lifecycle.shutdown(None), "shutdown on SIGTERM")

    def request_interrupt(self) -> None:
        """SIGINT, from clients that interrupt by signal: the same ladder as interrupt_request."""
        self.start(self.lifecycle.interrupt(), "interrupt on SIGINT")

    # -- the error boundary (`boundary.Boundary`) --------------------------------------------------

    def guard(self, req: Request | None, handle: Callable[..., Any], *args: Any) -> None:
        """Call `handle(*args)`; if it raises, `req` is answered with an InternalError."""
        try:
            handle(*args)
        except Exception as e:
            if req is None:
                log.exception("klbr failed while handling a message that concerns no request")
            else:
                self.internal_error(req, e)

    def guarded(self, req: Request, handle: Callable[..., Any]) -> Callable[..., None]:
        """`handle` as a callback (of the store, a timer) behind the boundary for `req`."""
        return lambda *args: self.guard(req, handle, *args)

    def start(self, work: Coroutine[Any, Any, Any], what: str, req: Request | None = None) -> None:
        """Background work (an interrupt, a shutdown, a `%klbr` cell); if it fails, `req` is answered."""
        assert self._tasks is not None  # `run` made it, before anything can start work
        self._tasks.start(work, what, (lambda e: self.internal_error(req, e)) if req is not None else None)

    def internal_error(self, req: Request, exc: Exception) -> None:
        """A bug in klbr while it handled `req`: answer it now, with what the frontend still lacks
        (busy, an InternalError reply and error output, idle), record what can be, and go on."""
        log.error("klbr failed while handling %s %s; answered InternalError", req.msg_type, req.msg_id, exc_info=exc)
        if req.phase is Phase.DONE:
            return
        in_flight = req is self.queue.inflight
        gen = req.generation
        abandoned = in_flight and req.awaits_idle and gen is not None and gen.alive
        if abandoned and gen is not None:
            # Its worker still runs it, and nothing here follows it any more: it is interrupted
            # (the ladder kills the worker if it does not stop), and the next request waits for it.
            self.queue.abandon(req, gen)
        self.own.forget(req)
        req.move(Phase.DONE, by_boundary=True)  # the boundary ends a request from whatever phase it was in
        if abandoned:
            if req.msg_type == "execute_request":
                self.start(self.supervisor.interrupt(), "interrupting a cell answered InternalError")
        elif req.msg_type == "execute_request":
            self.supervisor.cells.finished(req.msg_id)  # its deadline is not the next cell's
        error = internal_error(req.msg_type, exc)
        req.outcome = error.status
        try:
            self.brackets.busy(req)
            if req.msg_type.endswith("_request") and not req.reply_sent:
                content = {"status": "error", **error.content()}
                if req.msg_type == "execute_request":
                    content["execution_count"] = req.count or self.supervisor.counts.last
                    self.frontend.send_iopub("error", error.content(), req.header)
                self.brackets.reply(req, content)
                if req.record is not None:
                    self.cell_log.finish(req, content, lambda error: None)
            self.brackets.idle(req)
            if in_flight:  # an error like any other: the executes queued behind it are aborted
                for aborted in self.queue.finish(req, "error"):
                    self.own.abort(aborted)
        except Exception:
            log.exception("answering %s %s after an internal error failed too", req.msg_type, req.msg_id)
        asyncio.get_running_loop().call_soon(self.pump)

    # -- from the frontend and the supervisor (WorkerListener) -------------------------------------

    def _frontend_message(self, channel: str, wire: Wire) -> None:
        self.dispatch.message(channel, wire)

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        abandoned = self.queue.abandoned
        if abandoned is not None and wire.parent_id == abandoned[0]:
            if channel == "iopub" and wire.msg_type == "status" and wire.content.get("execution_state") == "idle":
                self.queue.worker_free(f"the worker of {abandoned[0]} went idle")
                self.supervisor.cells.finished(wire.parent_id)
                self.pump()
            return
        req = self.current.waiting.get(wire.parent_id)
        self.guard(req, self.delivery.message, channel, wire, req)

    def generation_ready(self, generation: Generation) -> None:
        self.guard(None, self.endings.ready, generation)
        self.guard(None, self.comms.changed)

    def generation_ended(self, generation: Generation, ending: Ending) -> None:
        abandoned = self.queue.abandoned
        if abandoned is not None and abandoned[1] is generation:
            self.queue.worker_free(f"the generation of {abandoned[0]} ended")
        self.guard(None, self.endings.ended, generation, ending)
        self.guard(None, self.comms.changed)

    def cell_note(self, msg_id: str, text: str) -> None:
        req = self.current.waiting.get(msg_id)
        if req is not None:
            note = {"data": {"text/plain": f"klbr note: {text}", "text/markdown": f"**klbr note:** {text}"},
                    "metadata": {}, "transient": {}}
            self.guard(req, self.own.output, req, "display_data", note)

    # -- the queue ---------------------------------------------------------------------------------

    def pump(self) -> None:
        """Start the next queued request: answered here, refused, or sent to the current generation."""
        while self.queue.free and self.queue.waiting and self.lifecycle.serving:
            req = self.queue.waiting[0]
            try:
                if not self._start(req):
                    return
            except Exception as e:
                self.internal_error(req, e)

    def _start(self, req: Request) -> bool:
        """Start `req`, the head of the queue; False when it must wait (no generation yet, or it was
        sent and is now the one in flight)."""
        if req.msg_type == "execute_request" and (req.magics is not None or req.magic_error):
            self.queue.take()
            req.move(Phase.PROXY)
            self.start(self.magic_cells.run(req), "a %klbr cell", req)
            return False
        if req.msg_type == "history_request" and self.cell_log.recording:
            self.queue.take()
            self.own.history(req)
            return True
        refusal = self.own.refusal(req)
        if refusal is not None:
            self.queue.take()
            self.own.here(req, error=refusal)
            return True
        generation = self.current.generation
        if generation is None or not generation.alive:  # `current.alive`, with the generation at hand
            # None yet, or one that is ending (a restart asked for by cell code): the next is told
            # ready, and `pump` runs again then.
            self.supervisor.ensure_started()
            return False
        self.queue.take()
        if self.cell_log.is_cell(req) and self.cell_log.recording and req.record is None:
            # Durable before visible (semantics 3): the row commits before the worker sees it.
            req.move(Phase.RECORDING)
            if self.cell_log.start(req, generation.number,
                                   self.guarded(req, lambda error: self._recorded(req, error))):
                self._recorded(req, None)
        else:
            self.delivery.send(req)
        return False

    def _recorded(self, req: Request, error: StoreError | None) -> None:
        """The cell's `running` row is committed (or could not be): now it may run."""
        if req.phase is not Phase.RECORDING:
            return  # answered meanwhile (shutdown)
        if error is not None:
            req.record = None
            self.own.here(req, error=session_paused_error(error))
        elif not self.current.alive:
            req.move(Phase.QUEUED)  # its generation ended meanwhile: it runs on the next one
            self.queue.put_back(req)
            self.supervisor.ensure_started()
        else:
            self.delivery.send(req)
