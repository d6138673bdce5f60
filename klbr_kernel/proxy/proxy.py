"""The proxy kernel: speaks Jupyter to the frontend and routes everything through the supervisor.

The `Proxy` builds its parts, hands each the collaborators it uses, and keeps the error boundary
(`boundary.Boundary`, the one thing its parts call back). It is on no message's path: the frontend
delivers to `dispatch`, and what the supervisor tells its driver (`WorkerListener`) goes to the part
that acts on it (`delivery`, `endings`, `own`), set here as the listener's methods. The state the
parts share is each in an object of its own (`klbr_kernel.requests`), with its own door
(`states`): the shell queue, the current generation as the proxy sees it, the execution counts,
the proxy's own life (moved by `lifecycle`). The parts:

- `dispatch`: what comes from the frontend, admitted by the `door`, goes where it belongs, and the
  queue's next request starts (`pump`);
- `delivery`: what the worker sends goes to the frontend, and a cell's reply and idle are held
  until its outcome is committed (semantics 3);
- `own`: what the proxy answers itself (history, refusals, aborts), and how every answered
  request ends; `brackets`: the proxy's replies and busy/idle, and (`resends`) an execute sent
  again; `magic_cells`: `%klbr` cells; `lifecycle`: interrupt and shutdown;
- `endings`: when a generation ends, everything that waited on it is answered (semantics 1, 2, 8).

The error boundary: wherever a message or a callback enters a part, what its handling raises is
handed to `fail`, which answers the request it concerned as an InternalError (`internal_error`),
and the kernel keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from jupyter_client.session import Session
from traitlets.config import Configurable

from klbr_supervisor.generation import Generation
from klbr_supervisor.listener import WorkerListener
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.policy import Refusal
from klbr_supervisor.states import Ending
from klbr_supervisor.supervisor import Supervisor
from klbr_supervisor.tasks import Tasks

from .. import client_package
from ..cell_log.notebook import Notebook
from ..cell_log.notices import Notices
from ..cell_log.recording import CellLog
from ..comm.comms import KlbrComms
from ..frontend.sockets import Frontend
from ..frontend.standin import MAX_MESSAGE_SIZE
from ..magics.rebuild import Rebuild
from ..magics.replay import Replay
from ..requests.counts import ExecutionCounts
from ..requests.current import Current
from ..requests.outcomes import internal_error
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
from .rebuilt import RebuiltCells
from .stdin import StdinRelay

if TYPE_CHECKING:
    from klbr_supervisor.boot.early import Early

log = logging.getLogger(__name__)


class Proxy:
    """Created by the app with the frontend's connection info; `run` serves until shutdown."""

    # What the supervisor tells its driver (`WorkerListener`): each is the method of the part that
    # acts on it, set once the parts are built.
    worker_message: Callable[[Generation, str, Wire], None]
    generation_ready: Callable[[Generation], None]
    generation_ended: Callable[[Generation, Ending, Refusal | None], None]
    cell_note: Callable[[str, str], None]
    # The queue's pump (`Boundary.pump`): the dispatch's.
    pump: Callable[[], None]

    def __init__(self, info: dict[str, Any], session: Session, parent: Configurable | None = None,
                 notebook: str | None = None, max_message_size: int = MAX_MESSAGE_SIZE,
                 worker_options: tuple[str, ...] = (), first_worker: Early | None = None, *,
                 frontend: Frontend | None = None,
                 make_supervisor: Callable[[WorkerListener], Supervisor] | None = None):
        """`first_worker`: what `boot.prelaunch` started before the imports, for the supervisor;
        `frontend`, and the supervisor (`make_supervisor(listener)`, the proxy being its listener):
        made here unless given, as a test gives stand-ins for both (tests/harness.py)."""
        self.session = session
        self.frontend = frontend = frontend or Frontend(info, session, max_message_size)
        if make_supervisor is None:
            supervisor = Supervisor(self, session=session, parent=parent, notebook=notebook,
                                    kernel_name=info.get("kernel_name") or None, worker_options=worker_options,
                                    first=first_worker, host_client=client_package.files())
        else:
            supervisor = make_supervisor(self)
        self.supervisor = supervisor
        self.cell_log = cell_log = CellLog(supervisor.store, Notebook(supervisor.notebook))
        self.queue = queue = ShellQueue()
        self.brackets = brackets = Brackets(frontend, session, cell_log, queue)
        self.current = current = Current()
        self.counts = counts = ExecutionCounts()
        life = Machine("proxy", PROXY_TRANSITIONS, ProxyState.SERVING)
        # The klbr comm (JupyterLab's extension): answered by the proxy itself, told when the
        # generation, placement or recording state may have changed.
        notices = Notices(frontend)
        self.comms = comms = KlbrComms(frontend, brackets, session, cell_log, supervisor, queue, notices,
                                       self.start, self.guard)
        self.own = own = OwnAnswers(self, life=life, queue=queue, current=current, frontend=frontend,
                                    brackets=brackets, cell_log=cell_log, supervisor=supervisor, session=session,
                                    counts=counts, notices=notices, state_changed=comms.changed)
        self.stdin = stdin = StdinRelay(frontend, supervisor, session,
                                        lambda req, text: own.output(req, "stream", {"name": "stderr", "text": text}))
        replay = Replay(frontend, cell_log, queue, lambda: supervisor.notebook, notices, own.output)
        self.rebuilt = rebuilt = RebuiltCells(supervisor=supervisor, cell_log=cell_log, session=session)
        rebuild = Rebuild(cell_log, supervisor, own.output, rebuilt.run)
        self.magic_cells = magic_cells = MagicCells(own, replay, rebuild, supervisor, cell_log, frontend)
        self.lifecycle = lifecycle = Lifecycle(self, life=life, supervisor=supervisor, queue=queue, current=current,
                                               own=own, brackets=brackets, frontend=frontend)
        self.delivery = delivery = Delivery(self, current=current, queue=queue, supervisor=supervisor,
                                            cell_log=cell_log, own=own, brackets=brackets, stdin=stdin,
                                            frontend=frontend, session=session, counts=counts, rebuilt=rebuilt)
        self.dispatch = dispatch = Dispatch(self, signed=session.auth is not None, lifecycle=lifecycle, queue=queue,
                                            current=current, supervisor=supervisor, own=own,
                                            magic_cells=magic_cells, brackets=brackets, stdin=stdin,
                                            drops=frontend.drops, comms=comms, cell_log=cell_log, delivery=delivery)
        self.endings = endings = Endings(self, current=current, queue=queue, own=own, delivery=delivery,
                                         forward=dispatch.forward, pump=dispatch.pump, brackets=brackets,
                                         frontend=frontend, counts=counts, state_changed=comms.changed,
                                         rebuilt=rebuilt, interrupt_grace=supervisor.interrupt_grace)
        self.pump = dispatch.pump
        self.worker_message = delivery.worker_message
        self.generation_ready = endings.ready
        self.generation_ended = endings.ended
        self.cell_note = own.cell_note
        self._tasks: Tasks | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tasks = Tasks(tg, log)
            tg.create_task(self.supervisor.run())
            self.frontend.bind(self.dispatch.message)
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

    def fail(self, req: Request | None, exc: Exception) -> None:
        """What a part's handling of a message or callback raised: `req`, if it concerned one, is
        answered with an InternalError; otherwise the failure is logged."""
        if req is None:
            log.error("klbr failed while handling a message that concerns no request", exc_info=exc)
        else:
            self.internal_error(req, exc)

    def guard(self, req: Request | None, handle: Callable[..., Any], *args: Any) -> None:
        """Call `handle(*args)`; if it raises, `fail` answers `req`."""
        try:
            handle(*args)
        except Exception as e:
            self.fail(req, e)

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
        if abandoned and req.msg_type == "execute_request":
            self.start(self.supervisor.interrupt(), "interrupting a cell answered InternalError")
        error = internal_error(req.msg_type, exc)
        try:
            self.brackets.busy(req)
            if req.msg_type.endswith("_request") and not req.reply_sent:
                content = {"status": "error", **error.content()}
                if req.msg_type == "execute_request":
                    content["execution_count"] = req.count or self.counts.last
                    self.frontend.send_iopub("error", error.content(), req.header)
                self.brackets.reply(req, content, error.status)
                if req.record is not None:
                    self.cell_log.finish(req, content, lambda error: None)
            self.brackets.idle(req)
            if in_flight:  # an error like any other: the executes queued behind it are aborted
                for aborted in self.queue.finish(req, "error"):
                    self.own.abort(aborted)
        except Exception:
            log.exception("answering %s %s after an internal error failed too", req.msg_type, req.msg_id)
        asyncio.get_running_loop().call_soon(self.pump)
