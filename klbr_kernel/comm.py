"""The `klbr` comm: what the JupyterLab extension asks the proxy itself (docs/comm-protocol.md).

`Dispatch` hands over every comm_open of target `klbr` and every comm_msg and comm_close of a comm
opened so; none of them ever reaches a worker. Each is answered at once, also while a cell runs (it
only reads the cell log and the proxy's state, as `%klbr replay` does), inside exactly one busy/idle
with its own header (DESIGN.md semantics 1). A request that is not what the protocol says gets an
error message on its comm, with a name (`CommError`), and changes nothing else.

Following a running or queued cell reuses `replay.Follower`: registered on the request before the
log is read, it relays what the cell prints after the snapshot, so no line is missed or doubled.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from jupyter_client.session import Session

from klbr_supervisor.supervisor import Supervisor

from ._version import __version__
from .cell_log import CellLog, frontend_cell_id
from .frontend import Frontend
from .outcomes import cell_status
from .queue import ShellQueue
from .replay import Follower
from .replies import Replies
from .requests import Phase, Request
from .restore import UNMATCHED_LISTED, Chunks, Json, chunk_limit, entry, unmatched
from .status import status_rows

log = logging.getLogger(__name__)

TARGET = "klbr"
PROTOCOL = 1
OPS = frozenset({"hello", "cells", "unfollow", "restart"})
MAX_COMMS = 64  # klbr comms open at once; opening one more closes the oldest (a page gone for good)
MAX_COMM_ID = 256  # characters of a comm id answered (longer ones are dropped: echoing them costs)
MAX_REQUEST_ID = 64
MAX_CELL_IDS = 100_000
_CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

Start = Callable[[Coroutine[Any, Any, Any], str, Request | None], None]


class CommError(Exception):
    """A comm request the proxy does not serve. Each kind is a subclass, whose name is what the
    frontend sees (stable: the protocol's error names); the text says what is wrong."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def message(self) -> str:
        return str(self)


class UnsupportedVersion(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """The request speaks another version of the protocol."""


class MalformedRequest(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """A field is missing, or of the wrong type or shape."""


class UnknownOp(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """No such op."""


class TooLarge(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """A field past its bound."""


class NotRecording(CommError):  # noqa: N818 - the class name is the error name the protocol sends
    """The cell log is not available in this session."""


@dataclass(eq=False)
class _Comm:
    comm_id: str
    opened: dict[str, Any]  # the comm_open's header: the parent of what the proxy pushes unasked
    following: dict[str, tuple[Request, Follower]] = field(default_factory=dict)  # by followed msg_id


class KlbrComms:
    """The open klbr comms, their requests and pushes. Owned by the proxy; `claims` and `handle` are
    called by `Dispatch`, `changed` by the proxy when a generation or the store may have changed."""

    def __init__(self, frontend: Frontend, replies: Replies, session: Session, cell_log: CellLog,
                 supervisor: Supervisor, queue: ShellQueue, start: Start):
        self._frontend = frontend
        self._replies = replies
        self._session = session
        self._cell_log = cell_log
        self._supervisor = supervisor
        self._queue = queue
        self._start = start
        self._comms: dict[str, _Comm] = {}
        self._state: tuple[object, ...] | None = None  # what was last pushed as `state`

    def claims(self, req: Request) -> bool:
        """Whether `req` is the klbr comm's (then the proxy answers it, and no worker sees it)."""
        if req.msg_type == "comm_open":
            return req.content.get("target_name") == TARGET
        return req.msg_type in ("comm_msg", "comm_close") and req.content.get("comm_id") in self._comms

    def handle(self, req: Request) -> None:
        """Answer `req` inside its bracket; what is asynchronous (the log's read, a restart) finishes later."""
        req.move(Phase.PROXY)
        self._replies.busy(req)
        comm_id = str(req.content["comm_id"])
        if len(comm_id) > MAX_COMM_ID:
            self._frontend.drops.refuse("shell", f"a klbr comm id longer than {MAX_COMM_ID} characters",
                                        f"a {req.msg_type}")
            self._done(req)
            return
        if req.msg_type == "comm_open":
            self._open(req, comm_id)
        elif req.msg_type == "comm_close":
            self._close(comm_id)
        else:
            self._message(req, self._comms[comm_id])
            return
        self._done(req)

    def changed(self) -> None:
        """Push `state` to every open klbr comm if the generation, placement or recording changed."""
        if not self._comms:
            return
        generation = self._supervisor.current
        key = (generation.number if generation is not None else None, self._supervisor.where.spec,
               self._cell_log.recording_state())
        if key == self._state:
            return  # the common case, after every request: three reads
        self._state = key
        state = self._state_fields()
        for comm in list(self._comms.values()):
            self._push(comm, comm.opened, {"op": "state", **state})

    # -- opening and closing -----------------------------------------------------------------------

    def _open(self, req: Request, comm_id: str) -> None:
        version = (req.content.get("data") or {}).get("v")
        if not _speaks(version):
            self._error(comm_id, req.header, None, _unsupported(version))
            self._frontend.send_iopub("comm_close", {"comm_id": comm_id, "data": {}}, req.header)
            return
        if comm_id in self._comms:
            self._close(comm_id)  # opened again under the same id: a new comm
        while len(self._comms) >= MAX_COMMS:
            oldest = next(iter(self._comms))
            self._close(oldest)
            self._frontend.send_iopub("comm_close", {"comm_id": oldest, "data": {}}, req.header)
        self._comms[comm_id] = _Comm(comm_id, req.header)

    def _close(self, comm_id: str) -> None:
        comm = self._comms.pop(comm_id, None)
        if comm is not None:
            for msg_id in list(comm.following):
                self._unfollow(comm, msg_id)

    # -- requests ----------------------------------------------------------------------------------

    def _message(self, req: Request, comm: _Comm) -> None:
        data = req.content.get("data") or {}
        request_id: str | int | None = None
        try:
            rid = request_id = self._request_id(data.get("id"))
            if not _speaks(data.get("v")):
                raise _unsupported(data.get("v"))
            op = data.get("op")
            if not isinstance(op, str) or op not in OPS:
                shown = op[:40] if isinstance(op, str) else type(op).__name__
                msg = f"no op {shown!r}: the ops are {', '.join(sorted(OPS))}"
                raise UnknownOp(msg)
            if op == "hello":
                self._push(comm, req.header, {"op": "hello", "id": request_id, **self._state_fields()})
            elif op == "unfollow":
                msg_id = data.get("msg_id")
                if not isinstance(msg_id, str):
                    msg = "unfollow needs 'msg_id', a string"
                    raise MalformedRequest(msg)
                self._unfollow(comm, msg_id)
                self._push(comm, req.header, {"op": "unfollow", "id": request_id, "msg_id": msg_id[:100]})
            elif op == "cells":
                work = self._cells(req, comm, rid, _CellsRequest.parse(data))
                self._start(work, "a klbr comm's cells request", req)
                return
            elif op == "restart":
                self._start(self._restart(req, comm, rid), "a klbr comm's restart", req)
                return
        except CommError as e:
            self._error(comm.comm_id, req.header, request_id, e)
        self._done(req)

    @staticmethod
    def _request_id(value: object) -> str | int:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            msg = "a request needs 'id', a string or an integer of its own choosing"
            raise MalformedRequest(msg)
        if isinstance(value, str) and len(value) > MAX_REQUEST_ID:
            msg = f"a request id has at most {MAX_REQUEST_ID} characters"
            raise TooLarge(msg)
        if isinstance(value, int) and abs(value) >= 2**53:
            msg = "a request id is an integer JavaScript can hold exactly"
            raise TooLarge(msg)
        return value

    async def _cells(self, req: Request, comm: _Comm, request_id: str | int, ask: _CellsRequest) -> None:
        cell_log = self._cell_log
        if not cell_log.recording:
            self._error(comm.comm_id, req.header, request_id,
                        NotRecording("the cell log is not available in this session: nothing to restore"))
            self._done(req)
            return
        live, followed = self._follow(req, comm, ask)
        # A followed running cell's snapshot ends where its follower starts; unfollowed, it is all
        # that was recorded by the time of the read.
        before = live.record.seq + 1 if ask.follow and live is not None and live.record is not None else None
        try:
            await cell_log.settled()
            self._answer_cells(req, comm, request_id, ask, live, before)
        except BaseException:
            for target, _follower in followed:
                self._unfollow(comm, target.msg_id)
            raise
        for target, follower in followed:
            follower.caught_up()  # what it printed meanwhile, then the rest as it comes
            # Its end is told after its last output, also when it ended while the log was read.
            follower.ended.add_done_callback(partial(self._ended, comm, target))
        self._done(req)

    def _follow(self, req: Request, comm: _Comm,
                ask: _CellsRequest) -> tuple[Request | None, list[tuple[Request, Follower]]]:
        """The cell running now (whose snapshot is cut at its current output), and followers
        registered on it and on the cells queued behind it, before anything is read."""
        inflight = self._queue.inflight
        live = inflight if (inflight is not None and inflight.with_worker and inflight.record is not None
                            and inflight.record.id is not None) else None
        followed: list[tuple[Request, Follower]] = []
        if not ask.follow:
            return live, followed
        for target in self._live_cells():
            if target.msg_id in comm.following:
                continue
            follower = Follower(req, partial(self._relay, comm, target))
            target.followers.append(follower)
            comm.following[target.msg_id] = (target, follower)
            followed.append((target, follower))
        return live, followed

    def _live_cells(self) -> list[Request]:
        """Executes of a notebook cell that are running or queued, in order."""
        queue = self._queue
        candidates = ([queue.inflight] if queue.inflight is not None else []) + list(queue.waiting)
        return [r for r in candidates if r.msg_type == "execute_request" and r.counts and r.phase is not Phase.DONE
                and frontend_cell_id(r) is not None]

    def _answer_cells(self, req: Request, comm: _Comm, request_id: str | int, ask: _CellsRequest,
                      live: Request | None, before: int | None) -> None:
        cell_log = self._cell_log
        rows = cell_log.frontend_cells(self._supervisor.notebook, previous_sessions=ask.previous_sessions)
        by_record = {row["id"]: row for row in rows.values()}
        wanted = list(dict.fromkeys(ask.cell_ids))
        chosen = [rows[cell_id] for cell_id in wanted if cell_id in rows]
        taken = {row["id"] for row in chosen}
        chosen += [by_record[i] for i in dict.fromkeys(ask.record_ids) if i in by_record and i not in taken]
        chunks, k = Chunks(ask.max_chunk_bytes), 0
        live_id = live.record.id if live is not None and live.record is not None else None
        for row in chosen:
            running = row["id"] == live_id
            fields = entry(row, running=running, count=live.count if running and live is not None else None)
            outputs = cell_log.replay_outputs(row["id"], before if running else None)
            for full in chunks.add(fields, outputs):
                self._push(comm, req.header,
                           {"op": "cells", "id": request_id, "chunk": k, "last": False, "cells": full})
                k += 1
        session = cell_log.session_id
        listed = set(wanted)
        missing = [unmatched(row) for row in reversed(list(rows.values()))
                   if row["session_id"] == session and row["frontend_cell_id"] not in listed
                   and row["id"] not in ask.record_ids][:UNMATCHED_LISTED]
        queued = [{"cell_id": frontend_cell_id(r), "msg_id": r.msg_id, "code": r.code}
                  for r in self._live_cells() if r is not live]
        self._push(comm, req.header, {
            "op": "cells", "id": request_id, "chunk": k, "last": True, "cells": chunks.rest(), "session": session,
            "unmatched": missing, "queued": queued, "following": sorted(comm.following)})

    async def _restart(self, req: Request, comm: _Comm, request_id: str | int) -> None:
        """As `%klbr restart`: a fresh generation; answered once it has taken over (or failed to)."""
        old = self._supervisor.current
        await self._supervisor.restart()
        new = self._supervisor.current
        text = (f"generation {old.number if old else '-'} ended; generation "
                f"{new.number if new else '-'} takes over with a fresh namespace")
        self._push(comm, req.header, {"op": "restart", "id": request_id, "text": text, **self._state_fields()})
        if req.phase is Phase.PROXY:
            self._done(req)
        self.changed()

    # -- following ---------------------------------------------------------------------------------

    def _relay(self, comm: _Comm, target: Request, _replay: Request, msg_type: str, content: Json) -> None:
        """A follower's publish: an output of `target`, for `comm` (the follower's own request,
        `_replay`, is the comm message that asked)."""
        self._output(comm, target, msg_type, content)

    def _output(self, comm: _Comm, target: Request, msg_type: str, content: Json) -> None:
        if comm.comm_id in self._comms:
            record_id = target.record.id if target.record is not None else None
            self._push(comm, comm.opened, {"op": "output", "msg_id": target.msg_id, "record_id": record_id,
                                           "msg_type": msg_type, "content": content})

    def _ended(self, comm: _Comm, target: Request, _ended: asyncio.Future[None] | None = None) -> None:
        """The followed cell is answered (its outcome committed): say how it ended, once."""
        if comm.following.pop(target.msg_id, None) is None or comm.comm_id not in self._comms:
            return
        reply = target.reply_content or {}
        count = reply.get("execution_count", target.count)
        self._push(comm, comm.opened, {
            "op": "ended", "msg_id": target.msg_id, "record_id": target.record.id if target.record else None,
            "status": cell_status(reply, own=target.outcome, interrupted=target.interrupted) if reply else "aborted", "execution_count": count})

    def _unfollow(self, comm: _Comm, msg_id: str) -> None:
        target, follower = comm.following.pop(msg_id, (None, None))
        if target is not None and follower in target.followers:
            target.followers.remove(follower)

    # -- sending -----------------------------------------------------------------------------------

    def _state_fields(self) -> Json:
        supervisor, cell_log = self._supervisor, self._cell_log
        generation = supervisor.current
        return {
            "protocol": PROTOCOL, "implementation": "klbr", "version": __version__,
            "kernel_session": self._session.session, "store_session": cell_log.session_id,
            "generation": generation.number if generation is not None else None,
            "placement": supervisor.where.spec, "recording": cell_log.recording_state(),
            "notebook": supervisor.notebook,
            "status": [list(row) for row in status_rows(supervisor, cell_log, self._frontend)],
        }

    def _push(self, comm: _Comm, parent: dict[str, Any], data: Json) -> None:
        self._frontend.send_iopub("comm_msg", {"comm_id": comm.comm_id, "data": {"v": PROTOCOL, **data}}, parent)

    def _error(self, comm_id: str, parent: dict[str, Any], request_id: str | int | None, error: CommError) -> None:
        log.info("klbr comm %s: %s: %s", comm_id[:40], error.name, error.message)
        data = {"v": PROTOCOL, "id": request_id, "error": {"name": error.name, "message": error.message}}
        self._frontend.send_iopub("comm_msg", {"comm_id": comm_id, "data": data}, parent)

    def _done(self, req: Request) -> None:
        req.move(Phase.ANSWERED)
        self._replies.idle(req)
        req.move(Phase.DONE)


def _speaks(version: object) -> bool:
    return type(version) is int and version == PROTOCOL  # not True, not 1.0


def _unsupported(version: object) -> CommError:
    shown = repr(version)[:40] if isinstance(version, (str, int, float)) or version is None else type(version).__name__
    return UnsupportedVersion(f"this kernel speaks klbr comm protocol {PROTOCOL}, not {shown}")


@dataclass(frozen=True)
class _CellsRequest:
    cell_ids: list[str]
    record_ids: list[int]
    previous_sessions: bool
    follow: bool
    max_chunk_bytes: int

    @classmethod
    def parse(cls, data: Json) -> _CellsRequest:
        cell_ids, record_ids = data.get("cell_ids", []), data.get("record_ids", [])
        if not isinstance(cell_ids, list) or not isinstance(record_ids, list):
            msg = "'cell_ids' and 'record_ids' are lists"
            raise MalformedRequest(msg)
        if len(cell_ids) + len(record_ids) > MAX_CELL_IDS:
            msg = f"at most {MAX_CELL_IDS} cell ids in one request"
            raise TooLarge(msg)
        if not all(isinstance(c, str) and _CELL_ID.match(c) for c in cell_ids):
            msg = "a cell id is 1 to 64 characters of a-z, A-Z, 0-9, - and _"
            raise MalformedRequest(msg)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in record_ids):
            msg = "a record id is an integer (the store's cells.id)"
            raise MalformedRequest(msg)
        flags = {name: data.get(name, False) for name in ("previous_sessions", "follow")}
        if not all(isinstance(v, bool) for v in flags.values()):
            msg = "'previous_sessions' and 'follow' are true or false"
            raise MalformedRequest(msg)
        limit = data.get("max_chunk_bytes")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            msg = "'max_chunk_bytes' is an integer"
            raise MalformedRequest(msg)
        return cls(cell_ids, record_ids, flags["previous_sessions"], flags["follow"], chunk_limit(limit))
