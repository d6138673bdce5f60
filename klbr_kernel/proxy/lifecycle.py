"""What acts on the kernel itself: an interrupt (interrupt_request, or SIGINT) and a shutdown
(shutdown_request, or SIGTERM), which moves the proxy's own state (`states.ProxyState`): serving,
then stopping, then stopped once everything is answered.

Shutdown wins (semantics 13): once it begins, nothing new runs (`Dispatch` answers it aborted, the
queue's pump stops), every generation ends at once and nothing respawns, and what waited is aborted.
"""

from __future__ import annotations

import asyncio

from klbr_supervisor.supervisor import Supervisor

from ..frontend.sockets import Frontend
from ..requests.current import Current
from ..requests.queue import ShellQueue
from ..requests.request import Phase, Request
from ..requests.states import Machine, ProxyState
from .boundary import Boundary
from .brackets import Brackets
from .own import OwnAnswers


class Lifecycle:
    def __init__(self, boundary: Boundary, *, life: Machine[ProxyState], supervisor: Supervisor,
                 queue: ShellQueue, current: Current, own: OwnAnswers, brackets: Brackets, frontend: Frontend):
        """`life`: the proxy's state, which only this part moves."""
        self._boundary = boundary
        self._life = life
        self._supervisor = supervisor
        self._queue = queue
        self._current = current
        self._own = own
        self._brackets = brackets
        self._frontend = frontend
        self.stopped = asyncio.Event()  # set once the shutdown has answered everything

    @property
    def serving(self) -> bool:
        return self._life.state is ProxyState.SERVING

    async def interrupt(self) -> None:
        """Interrupt the current generation (an interrupt_request, SIGINT). The execute it runs is
        marked first, before the interrupt can land, so a KeyboardInterrupt it replies with is known
        for klbr's doing (`interrupted` in the cell log), never taken from the error's name; so is a
        `%klbr` cell the proxy carries out (a rebuild stops before its next cell)."""
        req = self._queue.inflight
        if req is not None and req.execute is not None and (
                req.phase is Phase.PROXY or (req.awaits_reply and req.generation is self._current.generation)):
            req.execute.interrupted = True
        await self._supervisor.interrupt()

    async def interrupt_request(self, req: Request) -> None:
        self._brackets.busy(req)
        await self.interrupt()
        req.move(Phase.ANSWERED)
        self._brackets.own(req, {"status": "ok"})
        req.move(Phase.DONE)

    async def shutdown(self, req: Request | None) -> None:
        """Shutdown wins (semantics 13): workers end at once, nothing respawns, then the reply.
        `req` is None for a SIGTERM. Whatever fails on the way, the kernel still stops. A second
        shutdown_request (a frontend that asks again, one while another frontend's runs) is
        answered at once: the first one is stopping the kernel."""
        if not self.serving:  # both dispatched while it was serving: this one came second
            if req is not None:
                self.shutdown_again(req)
            return
        self._life.move(ProxyState.STOPPING, f"shutdown_request {req.msg_id}" if req is not None else "SIGTERM")
        try:
            if req is not None:
                self._brackets.busy(req)
            await self._supervisor.shutdown()
        finally:
            try:
                queue = self._queue
                pending = ([queue.inflight] if queue.inflight else []) + queue.clear() + self._current.held
                for r in pending:
                    self._boundary.guard(r, self._own.abort, r)  # one that fails costs itself, not the others
                if req is not None:
                    self._shutdown_reply(req)
            finally:
                self._life.move(ProxyState.STOPPED, "everything is answered")
                self.stopped.set()

    def shutdown_again(self, req: Request) -> None:
        """A shutdown_request once the kernel is stopping, or stopped: answered ok at once, with no
        task (once stopped, none can start)."""
        self._brackets.busy(req)
        self._shutdown_reply(req)

    def _shutdown_reply(self, req: Request) -> None:
        """The reply on control, and its copy on iopub, as ipykernel sends them."""
        content = {"status": "ok", "restart": bool(req.content.get("restart", False))}
        req.move(Phase.ANSWERED)
        self._brackets.own(req, content)
        self._frontend.send_iopub("shutdown_reply", content, req.header)
        req.move(Phase.DONE)
