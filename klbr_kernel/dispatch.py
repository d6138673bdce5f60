"""From the frontend: each verified message, admitted by the `door`, goes where it belongs.

kernel_info, interrupt, shutdown and the `klbr` comm are the proxy's own; subshell requests are refused; shell
requests are queued (one in flight, semantics 11); comm messages, control requests for the worker
and unknown types are forwarded at once (ipykernel serves comms during async cells); on stdin only
an `input_reply` is taken, for the worker that asked. An execute sent again (the same message, on
any channel) is answered from the record and never run again (semantics 9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from klbr_supervisor.wire import Wire

from . import door
from .kernel_info import kernel_info_content
from .magics import MagicError, cell_timeout, line_magics
from .outcomes import CellError, refusal_error
from .requests import OWN, QUEUED, SUBSHELL, Phase, Request

if TYPE_CHECKING:
    from .proxy import Proxy


class Dispatch:
    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def message(self, channel: str, wire: Wire) -> None:
        try:
            req = door.admit(channel, wire, signed=self.proxy.session.auth is not None)
        except door.Refused as refused:
            self.proxy.guard(None, self._refuse, channel, wire, refused)
            return
        self.proxy.guard(req, self._route, req)

    def _refuse(self, channel: str, wire: Wire, refused: door.Refused) -> None:
        """A request the door did not let in gets its error reply and bracket; anything else is
        only logged. Their parent header is the request's identity alone: the rest may be what a
        client cannot read back (a date that does not parse)."""
        what = f"a {str(wire.header.get('msg_type'))[:100]}"
        if channel == "stdin" or not refused.answerable:
            self.proxy.frontend.drops.drop(channel, refused.why, what)
            return
        self.proxy.frontend.drops.refuse(channel, refused.why, what)
        identity = {k: wire.header[k] for k in ("msg_id", "msg_type", "session", "username", "version")
                    if k in wire.header}
        req = Request(channel, Wire(wire.prefix, wire.body, identity, wire.parent))
        content = None
        if req.msg_type.endswith("_request"):
            content = {"status": "error", **CellError(refused.ename, refused.why).content()}
        self.proxy.replies.refuse(req, content)

    def _route(self, req: Request) -> None:
        proxy, msg_type = self.proxy, req.msg_type
        if req.channel == "stdin":
            if msg_type == "input_reply":
                proxy.stdin.to_worker(req.wire.frames())
            else:
                proxy.frontend.drops.drop("stdin", "only input_reply belongs there", f"a {msg_type}")
        elif proxy.stopping:
            req.move(Phase.ANSWERED)
            proxy.replies.own(req, {"status": "aborted"} if msg_type.endswith("_request") else None)
            req.move(Phase.DONE)
        elif req.channel == "shell" and msg_type.startswith("comm_") and proxy.comms.claims(req):
            proxy.comms.handle(req)  # the klbr comm is the proxy's own, answered at once
        elif msg_type in OWN:
            self._own(req)
        elif msg_type in SUBSHELL:
            error = CellError("SubshellsNotSupported", "klbr does not offer kernel subshells")
            req.move(Phase.ANSWERED)
            proxy.replies.own(req, {"status": "error", **error.content()})
            req.move(Phase.DONE)
        elif msg_type == "execute_request" and proxy.replies.duplicate(req):
            return
        elif req.channel == "shell" and msg_type in QUEUED:
            if msg_type == "execute_request":
                self._read_magics(req)
                if req.magics and all(magic.command == "replay" for magic in req.magics):
                    # A replay only reads the log: answered at once, also while a cell runs.
                    req.move(Phase.PROXY)
                    proxy.start(proxy.answers.magics(req), "a %klbr replay cell", req)
                    return
            proxy.queue.push(req)
            proxy.pump()
        else:
            self.forward(req)

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
        proxy = self.proxy
        if req.msg_type == "kernel_info_request":
            gen = proxy.generation
            content = kernel_info_content(gen.kernel_info if gen else None, gen.number if gen else None,
                                          proxy.supervisor.where.spec)
            req.move(Phase.ANSWERED)
            proxy.replies.own(req, content)
            req.move(Phase.DONE)
        elif req.msg_type == "interrupt_request":
            req.move(Phase.PROXY)
            proxy.start(proxy.answers.interrupt(req), "an interrupt_request", req)
        elif req.msg_type == "shutdown_request":
            req.move(Phase.PROXY)
            proxy.start(proxy.answers.shutdown(req), "a shutdown_request", req)

    def forward(self, req: Request) -> None:
        """comm messages, control requests for the worker, unknown types: not queued."""
        proxy = self.proxy
        gen = proxy.generation
        if gen is None:
            refusal = proxy.supervisor.refusal(None)
            if refusal is not None:  # a crash loop: no generation comes until `%klbr restart`
                proxy.answers.refuse_forwarded(req, refusal_error(refusal))
                return
            proxy.held.append(req)
            proxy.supervisor.ensure_started()
            return
        req.generation = gen
        req.move(Phase.SENT)
        proxy.waiting[req.msg_id] = req
        if req.msg_type == "comm_open":
            proxy.open_comms.add(req.content["comm_id"])
        elif req.msg_type == "comm_close":
            proxy.open_comms.discard(req.content["comm_id"])
        elif req.msg_type == "debug_request":
            proxy.debugging = True
        proxy.supervisor.send(req.channel, req.wire.frames())
