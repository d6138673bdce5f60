"""What the proxy itself sends back for a request: its replies, busy/idle brackets, and the answer
to an execute it already took, which is never run twice (DESIGN.md semantics 1, 9)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from jupyter_client.session import Session

from klbr_supervisor.store import Store

from .frontend import Frontend
from .requests import Request

log = logging.getLogger(__name__)

# Executes remembered by (client session, msg_id); older ones are looked up in the store.
_REMEMBERED = 10_000


class Replies:
    def __init__(self, frontend: Frontend, session: Session, store: Store):
        self.frontend = frontend
        self.session = session
        self.store = store
        self._executes: dict[tuple[str, str], Request] = {}
        self._forgot = False  # some were let go of: a new execute costs a look in the store

    def reply(self, req: Request, content: dict) -> None:
        """Send the proxy's own reply to the frontend that asked."""
        self.replied(req)
        reply_type = req.msg_type.rsplit("_", 1)[0] + "_reply"
        metadata = {
            "started": datetime.now(timezone.utc).isoformat(),
            "dependencies_met": True,
            "engine": self.session.session,
            "status": content.get("status"),
        }
        self.frontend.reply(req.channel, req.idents, reply_type, content, req.header, metadata)

    def own(self, req: Request, content: dict | None, *, busy: bool = True) -> None:
        """busy (unless the worker already said it), the reply if there is one, idle."""
        if busy:
            self.frontend.status("busy", req.header)
        if content is not None:
            self.reply(req, content)
        self.frontend.status("idle", req.header)

    def invalid(self, req: Request, why: str) -> None:
        content = None
        if req.msg_type.endswith("_request"):
            content = {"status": "error", "ename": "InvalidMessage", "evalue": why, "traceback": []}
        self.own(req, content)

    def replied(self, req: Request) -> None:
        """`req`'s reply goes out now (the proxy's or the worker's): copies of it that were sent
        again while it ran get the same reply."""
        req.answered = True
        waiting, req.duplicates = req.duplicates, []
        for dup in waiting:
            self.reply(dup, req.reply_content or {"status": "aborted"})

    def duplicate(self, req: Request) -> bool:
        """Answer an execute this session already took (same client session and msg_id): from the
        record, or when the original finishes. No second busy/idle: the frontend already has one
        pair for that msg_id. False for a new execute, which is remembered."""
        key = (req.header.get("session", ""), req.msg_id)
        original = self._executes.get(key)
        if original is None:
            reply = self.store.recorded_reply(*key) if self._forgot and self.store.recording else None
            if reply is None:
                self._executes[key] = req
                if len(self._executes) > _REMEMBERED:
                    self._executes.pop(next(iter(self._executes)))
                    self._forgot = True
                return False
            self.reply(req, reply)
            return True
        log.info("execute %s received again: answered from the record, not re-run", req.msg_id)
        if original.answered:
            self.reply(req, original.reply_content)
        else:
            original.duplicates.append(req)
        return True
