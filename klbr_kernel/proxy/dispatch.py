"""From the frontend: each verified message, admitted by the `door`, goes where it belongs, and the
shell queue's next request starts (`pump`).

kernel_info, interrupt, shutdown and the `klbr` comm are the proxy's own; subshell requests are
refused; shell requests are queued (one in flight, semantics 11) and started here when the queue is
free: answered by the proxy (a `%klbr` cell, history from the cell log, a refusal), or recorded
(semantics 3) and handed to `delivery`; comm messages, control requests for the worker and unknown
types are forwarded at once (ipykernel serves comms during async cells); on stdin only an
`input_reply` is taken, for the worker that asked. An execute sent again (the same message, on any
channel) is answered from the record and never run again (semantics 9).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.policy import Refusal
from klbr_supervisor.store import StoreError
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..comm.comms import KlbrComms
from ..frontend import door
from ..frontend.drops import Drops
from ..frontend.kernel_info import kernel_info_content
from ..magics.parse import MagicError, cell_timeout, line_magics
from ..requests.current import Current
from ..requests.outcomes import CellError, refusal_error, session_paused_error
from ..requests.queue import ShellQueue
from ..requests.request import OWN, QUEUED, SUBSHELL, Phase, Request
from .boundary import Boundary
from .brackets import Brackets
from .delivery import Delivery
from .lifecycle import Lifecycle
from .magic_cells import MagicCells
from .own import OwnAnswers
from .stdin import StdinRelay


class Dispatch:
    def __init__(self, boundary: Boundary, *, signed: bool, lifecycle: Lifecycle, queue: ShellQueue,
                 current: Current, supervisor: Supervisor, own: OwnAnswers, magic_cells: MagicCells,
                 brackets: Brackets, stdin: StdinRelay, drops: Drops, comms: KlbrComms, cell_log: CellLog,
                 delivery: Delivery):
        """`signed`: the frontend's messages are signed with a key (what an execute's digest is, see
        `door.digest`); `drops`: where what is not served is counted; `comms`: the klbr comm, the
        proxy's own; `cell_log`: where a cell's row is written before it runs; `delivery`: what
        sends a started request to the worker."""
        self._boundary = boundary
        self._signed = signed
        self._lifecycle = lifecycle
        self._queue = queue
        self._current = current
        self._supervisor = supervisor
        self._own = own
        self._magic_cells = magic_cells
        self._brackets = brackets
        self._stdin = stdin
        self._comms = comms
        self._drops = drops
        self._cell_log = cell_log
        self._delivery = delivery

    def message(self, channel: str, wire: Wire) -> None:
        """Every verified message from the frontend (the `Frontend`'s callback)."""
        req = None
        try:
            req = door.admit(channel, wire, signed=self._signed)
            self._route(req)
        except door.Refused as refused:
            self._boundary.guard(None, self._refuse, channel, wire, refused)
        except Exception as e:
            self._boundary.fail(req, e)

    def _refuse(self, channel: str, wire: Wire, refused: door.Refused) -> None:
        """A request the door did not let in gets its error reply and bracket; anything else is
        only logged. Their parent header is the request's identity alone: the rest may be what a
        client cannot read back (a date that does not parse)."""
        what = f"a {str(wire.header.get('msg_type'))[:100]}"
        if channel == "stdin" or not refused.answerable:
            self._drops.drop(channel, refused.why, what)
            return
        self._drops.refuse(channel, refused.why, what)
        identity: dict[str, Any] = {k: wire.header[k] for k in ("msg_id", "msg_type", "session", "username", "version")
                    if k in wire.header}
        req = Request(channel, Wire(wire.prefix, wire.body, identity, wire.parent))
        content = None
        if req.msg_type.endswith("_request"):
            content = {"status": "error", **CellError(refused.ename, refused.why).content()}
        self._brackets.refuse(req, content)

    def _route(self, req: Request) -> None:
        msg_type = req.msg_type
        if req.channel == "stdin":
            if msg_type == "input_reply":
                self._stdin.to_worker(req.wire.frames())
            else:
                self._drops.drop("stdin", "only input_reply belongs there", f"a {msg_type}")
        elif not self._lifecycle.serving and msg_type == "shutdown_request":
            self._lifecycle.shutdown_again(req)  # ok: it is stopping, as asked
        elif not self._lifecycle.serving:
            req.move(Phase.ANSWERED)
            self._brackets.own(req, {"status": "aborted"} if msg_type.endswith("_request") else None)
            req.move(Phase.DONE)
        elif req.channel == "shell" and msg_type.startswith("comm_") and self._comms.claims(req):
            self._comms.handle(req)  # the klbr comm is the proxy's own, answered at once
        elif msg_type in OWN:
            self._kernel_own(req)
        elif msg_type in SUBSHELL:
            error = CellError("SubshellsNotSupported", "klbr does not offer kernel subshells")
            req.move(Phase.ANSWERED)
            self._brackets.own(req, {"status": "error", **error.content()})
            req.move(Phase.DONE)
        elif msg_type == "execute_request" and self._brackets.resends.duplicate(req):
            return
        elif req.channel == "shell" and msg_type in QUEUED:
            if msg_type == "execute_request":
                self._read_magics(req)
                if req.magics and all(magic.command == "replay" for magic in req.magics):
                    # A replay only reads the log: answered at once, also while a cell runs.
                    req.move(Phase.PROXY)
                    self._boundary.start(self._magic_cells.run(req), "a %klbr replay cell", req)
                    return
            self._queue.push(req)
            self.pump()
        else:
            self.forward(req)

    def _read_magics(self, req: Request) -> None:
        """An execute's `%klbr` lines, or its `%%klbr timeout=` first line, read into its own state."""
        code, execute = req.code, req.execute
        if "%klbr" not in code or execute is None:
            return  # the common case, without splitting the cell into lines
        try:
            execute.magics = line_magics(code)
            if execute.magics is None:
                timed = cell_timeout(code)
                if timed is not None:
                    execute.timeout, execute.body = timed
        except MagicError as e:
            execute.magic_error = str(e)

    def _kernel_own(self, req: Request) -> None:
        if req.msg_type == "kernel_info_request":
            gen = self._current.generation
            content = kernel_info_content(gen.kernel_info if gen else None, gen.number if gen else None,
                                          self._supervisor.where.spec, gen.target.takes_klbr_options if gen else True)
            req.move(Phase.ANSWERED)
            self._brackets.own(req, content)
            req.move(Phase.DONE)
        elif req.msg_type == "interrupt_request":
            req.move(Phase.PROXY)
            self._boundary.start(self._lifecycle.interrupt_request(req), "an interrupt_request", req)
        elif req.msg_type == "shutdown_request":
            req.move(Phase.PROXY)
            self._boundary.start(self._lifecycle.shutdown(req), "a shutdown_request", req)

    def forward(self, req: Request) -> None:
        """comm messages, control requests for the worker, unknown types: not queued. Also called
        by `Endings` for what was held until a generation was ready."""
        current = self._current
        if current.generation is None:
            refusal = self._supervisor.refusal(None)
            if refusal is not None:  # a crash loop: no generation comes until `%klbr restart`
                self._own.refuse_forwarded(req, refusal_error(refusal))
                return
            current.hold(req)
            self._supervisor.ensure_started()
            return
        current.send(req)
        current.forwarded(req)
        self._supervisor.send(req.channel, req.wire.frames())

    # -- the queue ---------------------------------------------------------------------------------

    def pump(self, refusal: Refusal | None = None) -> None:
        """Start the next queued request: answered here, refused, or sent to the current generation.
        `refusal`: what the supervisor told `Endings` while it hands over (a crash loop, a lost
        link), which a request is then refused with, the supervisor not being asked meanwhile."""
        queue = self._queue
        while queue.free and queue.waiting and self._lifecycle.serving:
            req = queue.waiting[0]
            try:
                if not self._start(req, refusal):
                    return
            except Exception as e:
                self._boundary.fail(req, e)

    def _start(self, req: Request, refusal: Refusal | None) -> bool:
        """Start `req`, the head of the queue; False when it must wait (no generation yet, or it was
        sent and is now the one in flight)."""
        queue, cell_log = self._queue, self._cell_log
        if req.msg_type == "execute_request" and (req.magics is not None or req.magic_error):
            queue.take()
            req.move(Phase.PROXY)
            self._boundary.start(self._magic_cells.run(req), "a %klbr cell", req)
            return False
        if req.msg_type == "history_request" and cell_log.recording:
            queue.take()
            self._own.history(req)
            return True
        error = refusal_error(refusal) if refusal is not None else self._own.refusal(req)
        if error is not None:
            queue.take()
            self._own.here(req, error=error)
            return True
        generation = self._current.generation
        if generation is None or not generation.alive:  # `current.alive`, with the generation at hand
            # None yet, or one that is ending (a restart asked for by cell code): the next is told
            # ready, and `pump` runs again then.
            self._supervisor.ensure_started()
            return False
        queue.take()
        if cell_log.is_cell(req) and cell_log.recording and req.record is None:
            # Durable before visible (semantics 3): the row commits before the worker sees it.
            req.move(Phase.RECORDING)
            if cell_log.start(req, generation.number, partial(self._recorded_late, req)):
                self._recorded(req, None)
        else:
            self._delivery.send(req)
        return False

    def _recorded_late(self, req: Request, error: StoreError | None) -> None:
        """The store's callback, once a `running` row that had to wait for its writer is in."""
        try:
            self._recorded(req, error)
        except Exception as e:
            self._boundary.fail(req, e)

    def _recorded(self, req: Request, error: StoreError | None) -> None:
        """The cell's `running` row is committed (or could not be): now it may run."""
        if req.phase is not Phase.RECORDING:
            return  # answered meanwhile (shutdown)
        if error is not None:  # the cell log left it unrecorded
            self._own.here(req, error=session_paused_error(error))
        elif not self._current.alive:
            req.move(Phase.QUEUED)  # its generation ended meanwhile: it runs on the next one
            self._queue.put_back(req)
            self._supervisor.ensure_started()
        else:
            self._delivery.send(req)
