"""What the proxy itself sends back for a request: its replies, busy/idle brackets, and the answer
to an execute it already took, which is never run twice (DESIGN.md semantics 1, 9)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from jupyter_client.session import Session

from .cell_log import CellLog
from .frontend import Frontend
from .requests import Request

log = logging.getLogger(__name__)

# Executes remembered by (client session, msg_id); older ones are looked up in the store.
_REMEMBERED = 10_000


class Replies:
    def __init__(self, frontend: Frontend, session: Session, cell_log: CellLog):
        self.frontend = frontend
        self.session = session
        self.cell_log = cell_log
        # An execute taken: the request while it runs, then only its reply content.
        self._executes: dict[tuple[str, str], Request | dict] = {}

    def busy(self, req: Request) -> None:
        """busy for `req`, unless the frontend has had it already (from the worker, or a retry)."""
        if not req.busy_sent:
            req.busy_sent = True
            self.frontend.status("busy", req.header)

    def idle(self, req: Request) -> None:
        self.dropped_notice(req)
        self.frontend.status("idle", req.header)

    def dropped_notice(self, req: Request) -> None:
        """Before `req`'s idle: if outputs of it were dropped for a frontend that did not keep up
        (see `outbox`), say how many, and how to see them."""
        dropped = self.frontend.outbox.take_dropped(req.msg_id) if self.frontend.outbox else 0
        if not dropped:
            return
        record = req.record
        where = (f"the cell log has every one: `%klbr replay {record.id}`" if record is not None and record.id is not None
                 else "they were not recorded either")
        text = (f"klbr: {dropped} outputs of this request were not delivered, because the frontend did not "
                f"read them fast enough; {where}.\n")
        self.frontend.send_iopub("stream", {"name": "stderr", "text": text}, req.header, keep=True)

    def reply(self, req: Request, content: dict) -> None:
        """Send the proxy's own reply to the frontend that asked (`orphaned` if it is gone)."""
        req.reply_content = content
        self.replied(req)
        if not self._send(req, content):
            req.orphaned = True

    def own(self, req: Request, content: dict | None) -> None:
        """The whole bracket at once: busy (unless already sent), the reply if there is one, idle."""
        self.busy(req)
        if content is not None:
            self.reply(req, content)
        self.idle(req)

    def refuse(self, req: Request, content: dict | None) -> None:
        """The bracket and error reply for a message the door did not let in (never remembered)."""
        self.busy(req)
        if content is not None:
            self._send(req, content)
        self.idle(req)

    def replied(self, req: Request) -> None:
        """`req`'s reply goes out now (the proxy's or the worker's): copies of it that were sent
        again while it ran get the same reply, and only its content is remembered from now on."""
        req.reply_sent = True
        for dup in req.duplicates:
            self._send(dup, req.reply_content or {"status": "aborted"})
        req.duplicates = []
        if req.msg_type == "execute_request":
            key = (req.header.get("session", ""), req.msg_id)
            if self._executes.get(key) is req:
                self._executes[key] = req.reply_content or {"status": "aborted"}

    def duplicate(self, req: Request) -> bool:
        """Answer an execute this session already took (same client session and msg_id, on any
        channel): from the record, or when the original finishes. No second busy/idle: the frontend
        already has one pair for that msg_id. False for a new execute, which is remembered."""
        key = (req.header.get("session", ""), req.msg_id)
        original = self._executes.get(key)
        if original is None:
            # Past what is remembered, or taken by an earlier kernel on this log (a client that
            # resends to the kernel that replaced it): the record answers, one indexed read.
            recorded = self.cell_log.recorded_execute(*key)
            if recorded is None:
                self._executes[key] = req
                if len(self._executes) > _REMEMBERED:
                    self._executes.pop(next(iter(self._executes)))
                return False
            status, reply = recorded
            log.info("execute %s was taken before (%s): answered from the record, not re-run", req.msg_id, status)
            self._send(req, reply or _unfinished(req.msg_id, status))
            return True
        log.info("execute %s received again: answered from the record, not re-run", req.msg_id)
        if isinstance(original, dict):
            self._send(req, original)
        else:
            original.duplicates.append(req)
        return True

    def _send(self, req: Request, content: dict) -> bool:
        reply_type = req.msg_type.rsplit("_", 1)[0] + "_reply"
        metadata = {
            "started": datetime.now(timezone.utc).isoformat(),
            "dependencies_met": True,
            "engine": self.session.session,
            "status": content.get("status"),
        }
        return self.frontend.reply(req.channel, req.idents, reply_type, content, req.header, metadata)


def _unfinished(msg_id: str, status: str) -> dict:
    """The answer to an execute taken before whose outcome was never recorded (its kernel died)."""
    text = (f"this execute ({msg_id}) was taken before, by a kernel that ended before its outcome was "
            f"recorded (it is {status!r} in the cell log): it is not run again")
    return {"status": "error", "ename": "WorkerLost", "evalue": text, "traceback": [f"WorkerLost: {text}"]}
