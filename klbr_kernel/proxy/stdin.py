"""input() and getpass between a worker and the frontend whose cell asked.

The worker's input_request goes to the frontend that sent the running execute, on that
frontend's stdin; its input_reply goes back to the worker. Neither is recorded: getpass answers
stay secret.

A ROUTER drops a message for a peer it does not know, so a frontend whose stdin is not connected
would leave input() waiting forever. This happens when the frontend is still between libzmq's
reconnect attempts (up to 200 ms), or when it runs with allow_stdin but never connected a stdin
channel at all. The frontend's stdin is ROUTER_MANDATORY, so the relay can tell. It tries again
for `INPUT_PATIENCE` seconds. After that it answers the worker with end-of-file, as a terminal
would: input() raises EOFError in the cell, and the cell says why on stderr.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from jupyter_client.session import Session

from klbr_supervisor.messages.protocol import Frames
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.supervisor import Supervisor

from ..frontend.sockets import Frontend
from ..requests.request import Request

log = logging.getLogger(__name__)

INPUT_PATIENCE = 3.0  # seconds an input_request waits for its frontend's stdin to connect
_RETRY = 0.05
_EOF = "\x04"  # ipykernel raises EOFError for this answer


class StdinRelay:
    def __init__(self, frontend: Frontend, supervisor: Supervisor, session: Session,
                 tell: Callable[[Request, str], None]):
        """`tell(req, text)` shows `text` on the cell's stderr (and records it)."""
        self.frontend = frontend
        self.supervisor = supervisor
        self.session = session
        self._tell = tell
        self._retry: asyncio.TimerHandle | None = None

    def to_frontend(self, req: Request, wire: Wire) -> None:
        """A stdin message from the worker, for the frontend that sent `req` (the running execute)."""
        self._cancel()
        # (The supervisor paused the cell's deadline as the input_request passed: a person is thinking.)
        asking = wire.msg_type == "input_request"
        deadline = asyncio.get_running_loop().time() + INPUT_PATIENCE
        self._send(req, wire, deadline if asking else None)

    def to_worker(self, frames: Frames) -> None:
        """An input_reply: to the worker that asked (the cell's deadline runs again as it goes)."""
        self.supervisor.send("stdin", frames)

    def _send(self, req: Request, wire: Wire, deadline: float | None, tries: int = 0) -> None:
        self._retry = None
        if not req.awaits_reply:
            return  # the cell ended meanwhile (an interrupt, a lost worker): nobody asks any more
        if self.frontend.forward("stdin", req.idents, wire.frames()) or deadline is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:
            if not tries:
                log.info("stdin: the frontend of %s has no stdin connected yet; trying for %g s", req.msg_id,
                         INPUT_PATIENCE)
            self._retry = loop.call_later(_RETRY, self._send, req, wire, deadline, tries + 1)
            return
        log.warning("stdin: no frontend stdin connected to answer input() of %s; answered end-of-file",
                    req.msg_id)
        self._tell(req, f"klbr: input() got no answer: the frontend that ran this cell has no stdin channel "
                        f"connected (waited {INPUT_PATIENCE:g} s). input() raises EOFError; the namespace is kept. Give "
                        "the value another way (a variable, a file) where no one can type it.\n")
        reply = self.session.msg("input_reply", {"value": _EOF}, parent=wire.header)
        self.to_worker(self.session.serialize(reply))

    def _cancel(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
