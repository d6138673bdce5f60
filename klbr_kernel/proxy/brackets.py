"""What the frontend gets for a request, and the record of what it has had: the proxy's own replies
and the busy/idle bracket around each request it answers (semantics 1), and the worker's busy and
reply and idle as `delivery` relays them (the worker's outputs `delivery` forwards itself). It is
the one writer of what a request keeps of that: `busy_sent`, `reply_sent`, `idle_sent`, and an
execute's answer (`decided`: the reply's content, and the status the store records when the proxy
wrote it) and whether its reply found its frontend gone.

A frontend shows the kernel's state as the last status it had: an idle for a request answered
while the cell in flight still runs is followed by a `busy` with no parent, so the kernel does not
look idle until that cell's own idle (semantics 1; decision 69). Only a cell's: JupyterLab and
jupyter_server pass over the statuses of other requests (comm_info, kernel_info: their
`untracked_message_types`), so the idle of one of those in flight would not undo the busy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jupyter_client.session import Session

from klbr_supervisor.messages.wire import Wire

from ..cell_log.recording import CellLog
from ..frontend.sockets import Frontend
from ..requests.queue import ShellQueue
from ..requests.request import Request
from .resends import Resends


class Brackets:
    def __init__(self, frontend: Frontend, session: Session, cell_log: CellLog, queue: ShellQueue):
        """`queue`: whose request in flight keeps the kernel busy while other requests are answered."""
        self.frontend = frontend
        self.session = session
        self._queue = queue
        # Executes sent again: answered with the reply each one's original gets (through `send`).
        self.resends = Resends(cell_log, self.send)

    def busy(self, req: Request) -> None:
        """busy for `req`, unless the frontend has had it already (from the worker, or a retry)."""
        if not req.busy_sent:
            req.busy_sent = True
            self.frontend.status("busy", req.header)

    def idle(self, req: Request) -> None:
        self._dropped_notice(req)
        self.frontend.status("idle", req.header)
        self._idled(req)

    def relay_idle(self, req: Request, wire: Wire) -> None:
        """The worker's idle for `req`, told first how many of its outputs were dropped, if any."""
        self._dropped_notice(req)
        self.frontend.publish(wire)
        self._idled(req)

    def _idled(self, req: Request) -> None:
        """`req`'s idle is out: if the cell in flight still runs, the kernel is busy again."""
        req.idle_sent = True
        running = self._queue.inflight
        if (running is not None and running is not req and running.msg_type == "execute_request"
                and running.busy_sent and not running.idle_sent):
            self.frontend.status("busy", {})

    def _dropped_notice(self, req: Request) -> None:
        """Before `req`'s idle: if outputs of it were dropped for a frontend that did not keep up
        (see `outbox`), say how many, and how to see them."""
        dropped = self.frontend.outbox.take_dropped(req.msg_id) if self.frontend.outbox else 0
        if not dropped:
            return
        record = req.record
        if record is None or record.id is None:
            where = "they were not recorded either"
        elif record.truncated:  # past `Store.max_output_bytes`, the log counts outputs instead of keeping them
            where = f"the cell log kept this cell's outputs up to its size limit: `%klbr replay {record.id}`"
        else:
            where = f"the cell log has every one: `%klbr replay {record.id}`"
        text = (f"klbr: {dropped} outputs of this request were not delivered, because the frontend did not "
                f"read them fast enough; {where}.\n")
        self.frontend.send_iopub("stream", {"name": "stderr", "text": text}, req.header, keep=True)

    def decided(self, req: Request, content: dict[str, Any], outcome: str | None = None) -> None:
        """The reply the frontend gets for `req` is `content` (a cell's is held until its outcome is
        committed, and kept for the store and for copies sent again); `outcome`, the store status
        of an answer the proxy wrote itself (`outcomes.cell_status`). Only an execute keeps it."""
        execute = req.execute
        if execute is not None:
            execute.reply_content = content
            if outcome is not None:
                execute.outcome = outcome

    def reply(self, req: Request, content: dict[str, Any], outcome: str | None = None) -> None:
        """Send the proxy's own reply to the frontend that asked (`orphaned` if it is gone)."""
        self.decided(req, content, outcome)
        self.replied(req)
        if not self.send(req, content):
            self._orphaned(req)

    def relay_busy(self, req: Request, wire: Wire) -> None:
        """The worker's busy for `req`, the first it sends (a retried request's second is dropped)."""
        if not req.busy_sent:
            req.busy_sent = True
            self.frontend.publish(wire)

    def relay_reply(self, req: Request, wire: Wire) -> None:
        """The worker's reply to `req`, as the exact frames it sent (`orphaned` if its frontend is gone)."""
        self.replied(req)
        if not self.frontend.forward(req.channel, req.idents, wire.frames()):
            self._orphaned(req)

    def _orphaned(self, req: Request) -> None:
        if req.execute is not None:
            req.execute.orphaned = True

    def own(self, req: Request, content: dict[str, Any] | None) -> None:
        """The whole bracket at once: busy (unless already sent), the reply if there is one, idle."""
        self.busy(req)
        if content is not None:
            self.reply(req, content)
        self.idle(req)

    def refuse(self, req: Request, content: dict[str, Any] | None) -> None:
        """The bracket and error reply for a message the door did not let in (never remembered)."""
        self.busy(req)
        if content is not None:
            self.send(req, content)
        self.idle(req)

    def replied(self, req: Request) -> None:
        """`req`'s reply goes out now (the proxy's or the worker's)."""
        req.reply_sent = True
        self.resends.replied(req)

    def send(self, req: Request, content: dict[str, Any]) -> bool:
        """The reply with `content` to the frontend that sent `req`; False when it is gone."""
        reply_type = req.msg_type.rsplit("_", 1)[0] + "_reply"
        metadata = {
            "started": datetime.now(UTC).isoformat(),
            "dependencies_met": True,
            "engine": self.session.session,
            "status": content.get("status"),
        }
        return self.frontend.reply(req.channel, req.idents, reply_type, content, req.header, metadata)
