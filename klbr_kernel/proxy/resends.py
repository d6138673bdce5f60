"""An execute the kernel already took, sent again, is answered from the record and never run twice
(semantics 9): the same message (its digest, see `door.digest`), not only the same msg_id.

The executes taken are remembered by (client session, msg_id) with their digest: the request while
it runs (a copy sent meanwhile waits for its reply), then only its reply's content. Past what is
remembered, the cell log answers, read at most once per client session (`_unlogged`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..cell_log.recording import CellLog
from ..requests.outcomes import CellError
from ..requests.request import Request

log = logging.getLogger(__name__)

# Executes remembered by (client session, msg_id); older ones are looked up in the store.
_REMEMBERED = 10_000
# Client sessions whose msg_ids in the log are kept (see `Resends._unlogged`), and those msg_ids in all.
_CLIENTS = 1_000
_LOGGED = 10_000

Send = Callable[[Request, dict[str, Any]], bool]


class Resends:
    def __init__(self, cell_log: CellLog, send: Send):
        """`send(req, content)`: the proxy's reply to `req` (`Brackets.send`), no bracket: the
        frontend has one busy/idle pair per msg_id already."""
        self.cell_log = cell_log
        self._send = send
        # An execute taken, with its digest: the request while it runs, then only its reply content.
        self._executes: dict[tuple[str, str], tuple[str, Request | dict[str, Any]]] = {}
        # Client sessions already warned of a msg_id reused: later reuses are logged at info.
        self._reusers: set[str] = set()
        # Per client session seen: the msg_ids of its executes in the log when this kernel first saw
        # it, and those `_executes` forgot since; None: too many to keep, the log is asked each time.
        self._logged: dict[str, set[str] | None] = {}
        self._logged_ids = 0  # msg_ids held in `_logged`, at most _LOGGED

    def replied(self, req: Request) -> None:
        """`req`'s reply goes out now (the proxy's or the worker's): copies of it that were sent
        again while it ran get the same reply, and only its content is remembered from now on."""
        execute = req.execute
        if execute is None:
            return  # only an execute is taken, and sent again
        reply = execute.reply_content or {"status": "aborted"}
        duplicates, execute.duplicates = execute.duplicates, []
        for dup in duplicates:
            self._send(dup, reply)
        key = (req.header.get("session", ""), req.msg_id)
        taken = self._executes.get(key)
        if taken is not None and taken[1] is req:
            self._executes[key] = (execute.digest, reply)

    def duplicate(self, req: Request) -> bool:
        """Answer an execute this session already took: the same message sent again (its digest,
        see `door.digest`), on any channel, from the record or when the original finishes. No
        second busy/idle: the frontend already has one pair for that msg_id. False for a new
        execute, which is remembered; one that reuses an earlier one's msg_id with other bytes is
        new (semantics 9): it runs, and the reuse is logged."""
        client = req.header.get("session", "")
        key = (client, req.msg_id)
        taken = self._executes.get(key)
        if taken is not None and taken[0] == req.digest:
            log.info("execute %s received again: answered from the record, not re-run", req.msg_id)
            original = taken[1]
            if isinstance(original, dict):
                self._send(req, original)
            else:
                assert original.execute is not None, "only an execute is taken"
                original.execute.duplicates.append(req)
            return True
        # Past what is remembered, taken by an earlier kernel on this log (a client that resends
        # to the kernel that replaced it), or sent again after another reused its msg_id: the
        # record answers, one indexed read; none for a msg_id its client has nowhere in the log.
        recorded = None if taken is None and self._unlogged(client, req.msg_id) else self.cell_log.recorded_execute(req)
        if recorded is not None and recorded.resent:
            log.info("execute %s was taken before (%s): answered from the record, not re-run",
                     req.msg_id, recorded.status)
            self._send(req, recorded.reply or _unfinished(req.msg_id, recorded.status))
            return True
        if taken is not None or recorded is not None:
            self._reused(req)
        self._executes.pop(key, None)  # the newest message of a msg_id is the one remembered longest
        self._executes[key] = (req.digest, req)
        if len(self._executes) > _REMEMBERED:
            self._forget_oldest()
        return False

    def _unlogged(self, client: str, msg_id: str) -> bool:
        """Whether the log holds no execute of `client` with `msg_id` that `_executes` does not: then
        it need not be read. The log is read once per client session, when this kernel first sees
        it (before it records any cell of it): the msg_ids it had then; every execute this kernel
        takes after is in `_executes` until it is forgotten there, and then added here. Another
        kernel's are not: a client sends to one kernel at a time, and to the next one on the file
        only after its predecessor ended (a restart), which this kernel reads at its first sight.
        False when the client's msg_ids are too many to keep, or its session one too many."""
        if client not in self._logged:
            if len(self._logged) >= _CLIENTS:
                return False
            found = self.cell_log.logged_msg_ids(client, _LOGGED - self._logged_ids)
            self._logged[client] = found
            self._logged_ids += len(found) if found is not None else 0
        ids = self._logged[client]
        return ids is not None and msg_id not in ids

    def _forget_oldest(self) -> None:
        """Forget the oldest execute remembered. The log may have it (and the executes its msg_id
        had before), so its client's msg_ids (`_unlogged`) take its msg_id, whether it was a cell
        or not; past _LOGGED in all, that client's executes are looked up in the log each time."""
        client, msg_id = next(iter(self._executes))
        del self._executes[client, msg_id]
        ids = self._logged.get(client)
        if ids is None or msg_id in ids:
            return
        if self._logged_ids < _LOGGED:
            ids.add(msg_id)
            self._logged_ids += 1
        else:
            self._logged[client] = None
            self._logged_ids -= len(ids)

    def _reused(self, req: Request) -> None:
        """A new execute whose msg_id an earlier, different one had: one line for each, a warning
        for the first of its client session."""
        client = req.header.get("session", "")
        first = client not in self._reusers
        if first:
            if len(self._reusers) >= _REMEMBERED:
                self._reusers.clear()
            self._reusers.add(client)
        log.log(logging.WARNING if first else logging.INFO,
                "execute %s of client session %s reuses the msg_id of an earlier, different execute (a "
                "client whose message counter started again, as jupyter_client's Session.clone() does for "
                "every KernelManager.client()): it is a new cell, and runs", req.msg_id, client)


def _unfinished(msg_id: str, status: str) -> dict[str, Any]:
    """The answer to an execute taken before whose outcome was never recorded (its kernel died)."""
    error = CellError(
        "WorkerLost",
        "This cell is not run again: an earlier kernel of this session took it and ended before it recorded how "
        "the cell ended, so it may have run, in part or whole. Run it again yourself if that is safe.\n"
        f"execute {msg_id}: {status!r} in the cell log.", "lost")
    return {"status": "error", **error.content()}
