"""The `klbr` comm: what the JupyterLab extension asks the proxy itself (docs/comm-protocol.md).

`Dispatch` hands over every comm_open of target `klbr` and every comm_msg and comm_close of a comm
opened so; none of them ever reaches a worker. Each is answered at once, also while a cell runs (it
only reads the cell log and the proxy's state, as `%klbr replay` does), inside exactly one busy/idle
with its own header (semantics 1). A request that is not what the protocol says
(`comm_requests`) gets an error message on its comm, with a name, and changes nothing else.
Following a running or queued cell is `comm_follow`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from jupyter_client.session import Session

from klbr_supervisor.store.store import now
from klbr_supervisor.supervisor import Supervisor

from .._version import __version__
from ..cell_log.notices import Notices
from ..cell_log.recording import CellLog, frontend_cell_id
from ..frontend.sockets import Frontend
from ..magics.commands import restarted_text
from ..magics.status import status_facts, status_rows
from ..requests.queue import ShellQueue
from ..requests.request import Phase, Request
from .follow import Followed, Following, OpenComm
from .ops import (
    MAX_COMM_ID,
    MAX_COMMS,
    PROTOCOL,
    TARGET,
    CellsRequest,
    CommError,
    NotebookRequest,
    NotRecording,
    op_of,
    request_id,
    restored_ids,
    speaks,
    unfollow_target,
    unsupported,
)
from .plan import plan_answer
from .restore import UNMATCHED_LISTED, Chunks, Json, entry, unmatched

if TYPE_CHECKING:
    from ..proxy.brackets import Brackets  # the proxy's, which hands it over: its busy and idle

log = logging.getLogger(__name__)
# The least change of the worker's memory that is pushed as `state` (checked as each request ends;
# it moves by an eighth of itself otherwise): the status item follows a growing worker, not noise.
MEMORY_STEP = 32 << 20
# Seconds between looks at the worker's memory while a klbr comm is open, so the status item moves
# while a cell runs (the worker is sampled about as often: `klbr_supervisor.memory.INTERVAL`).
MEMORY_LOOK = 1.0

Start = Callable[[Coroutine[Any, Any, Any], str, Request | None], None]
Guard = Callable[..., None]


class KlbrComms:
    """The open klbr comms, their requests and pushes. Owned by the proxy; `claims` and `handle` are
    called by `Dispatch`, `changed` by the proxy when a generation or the store may have changed."""

    def __init__(self, frontend: Frontend, brackets: Brackets, session: Session, cell_log: CellLog,
                 supervisor: Supervisor, queue: ShellQueue, notices: Notices, start: Start, guard: Guard):
        """`notices`: told which cells' outputs a page got back; `start(work, what, req)` runs what
        is asynchronous; `guard(req, handle, *args)` calls a timer's work inside the error boundary."""
        self._frontend = frontend
        self._brackets = brackets
        self._session = session
        self._cell_log = cell_log
        self._supervisor = supervisor
        self._notices = notices
        self._start = start
        self._guard = guard
        self._look: asyncio.TimerHandle | None = None  # the next look at the worker's memory
        self._following = Following(queue, self._push)
        self._comms: dict[str, OpenComm] = {}
        self._state: tuple[object, ...] | None = None  # what was last pushed as `state`
        self._memory = 0  # the worker's memory last pushed (bytes; 0: none)

    def claims(self, req: Request) -> bool:
        """Whether `req` is the klbr comm's (then the proxy answers it, and no worker sees it)."""
        if req.msg_type == "comm_open":
            return req.content.get("target_name") == TARGET
        return req.msg_type in ("comm_msg", "comm_close") and req.content.get("comm_id") in self._comms

    def handle(self, req: Request) -> None:
        """Answer `req` inside its bracket; what is asynchronous (the log's read, a restart) finishes later."""
        req.move(Phase.PROXY)
        self._brackets.busy(req)
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
        """Push `state` to every open klbr comm if the generation, placement, recording or notebook
        changed, or the worker's memory moved by an eighth (32 MiB at least) since the last push.
        Called as each request ends, and about once a second while a comm is open (a cell that
        allocates is seen growing)."""
        if not self._comms:
            return
        generation = self._supervisor.current
        key = (generation.number if generation is not None else None, self._supervisor.where.spec,
               self._cell_log.recording_state(), self._supervisor.notebook)
        memory = generation.memory.now if generation is not None and generation.memory is not None else 0
        if key == self._state and abs(memory - self._memory) <= max(MEMORY_STEP, self._memory // 8):
            return  # the common case, after every request: four reads (memory is the last sample's)
        self._state, self._memory = key, memory
        state = self._state_fields()
        for comm in list(self._comms.values()):
            self._push(comm, comm.opened, {"op": "state", **state})

    # -- opening and closing -----------------------------------------------------------------------

    def _open(self, req: Request, comm_id: str) -> None:
        version = (req.content.get("data") or {}).get("v")
        if not speaks(version):
            self._error(comm_id, req.header, None, unsupported(version))
            self._frontend.send_iopub("comm_close", {"comm_id": comm_id, "data": {}}, req.header)
            return
        if comm_id in self._comms:
            self._close(comm_id)  # opened again under the same id: a new comm
        while len(self._comms) >= MAX_COMMS:
            oldest = next(iter(self._comms))
            self._close(oldest)
            self._frontend.send_iopub("comm_close", {"comm_id": oldest, "data": {}}, req.header)
        self._comms[comm_id] = OpenComm(comm_id, req.header)
        if self._look is None:
            self._look = asyncio.get_running_loop().call_later(MEMORY_LOOK, self._guard, None, self._look_again)

    def _look_again(self) -> None:
        """The memory timer: `changed`, and again in a second while a comm is open."""
        self._look = None
        if not self._comms:
            return
        self._look = asyncio.get_running_loop().call_later(MEMORY_LOOK, self._guard, None, self._look_again)
        self.changed()

    def _close(self, comm_id: str) -> None:
        comm = self._comms.pop(comm_id, None)
        if comm is not None:
            comm.closed = True
            self._following.unfollow_all(comm)

    # -- requests ----------------------------------------------------------------------------------

    def _message(self, req: Request, comm: OpenComm) -> None:
        data = req.content.get("data") or {}
        rid: str | int | None = None
        try:
            rid = request_id(data.get("id"))
            if not speaks(data.get("v")):
                raise unsupported(data.get("v"))
            op = op_of(data)
            if op == "hello":
                self._push(comm, req.header, {"op": "hello", "id": rid, **self._state_fields()})
            elif op == "unfollow":
                msg_id = unfollow_target(data)
                self._following.unfollow(comm, msg_id)
                self._push(comm, req.header, {"op": "unfollow", "id": rid, "msg_id": msg_id[:100]})
            elif op == "cells":
                work = self._cells(req, comm, rid, CellsRequest.parse(data))
                self._start(work, "a klbr comm's cells request", req)
                return
            elif op == "restart":
                self._start(self._restart(req, comm, rid), "a klbr comm's restart", req)
                return
            elif op == "plan":
                self._start(self._plan(req, comm, rid), "a klbr comm's plan request", req)
                return
            elif op == "notebook":
                self._notebook(req, comm, rid, NotebookRequest.parse(data))
            elif op == "restored":
                ids = restored_ids(data)
                self._notices.reached(ids, req.header)
                self._push(comm, req.header, {"op": "restored", "id": rid})
            elif op == "generations":
                self._start(self._generations(req, comm, rid), "a klbr comm's generations request", req)
                return
        except CommError as e:
            self._error(comm.comm_id, req.header, rid, e)
        self._done(req)

    async def _cells(self, req: Request, comm: OpenComm, rid: str | int, ask: CellsRequest) -> None:
        cell_log = self._cell_log
        if not cell_log.recording:
            self._error(comm.comm_id, req.header, rid,
                        NotRecording("the cell log is not available in this session: nothing to restore"))
            self._done(req)
            return
        live = self._following.running()
        followed: Followed = self._following.follow(req, comm) if ask.follow else []
        # A followed running cell's snapshot ends where its follower starts; unfollowed, it is all
        # that was recorded by the time of the read.
        before = live.record.seq + 1 if ask.follow and live is not None and live.record is not None else None
        try:
            await cell_log.settled()
            self._answer_cells(req, comm, rid, ask, live, before)
        except BaseException:
            self._following.unfollow_all(comm, followed)
            raise
        self._following.caught_up(comm, followed)
        self._done(req)

    def _answer_cells(self, req: Request, comm: OpenComm, rid: str | int, ask: CellsRequest,
                      live: Request | None, before: int | None) -> None:
        cell_log = self._cell_log
        wanted = list(dict.fromkeys(ask.cell_ids))
        rows = cell_log.frontend_cells(wanted, previous_sessions=ask.previous_sessions)
        chosen = [rows[cell_id] for cell_id in wanted if cell_id in rows]
        taken = {row["id"] for row in chosen}
        asked = list(dict.fromkeys(ask.record_ids))
        chosen += [row for row in cell_log.records(asked, previous_sessions=ask.previous_sessions)
                   if row["id"] not in taken]
        chunks, k = Chunks(ask.max_chunk_bytes), 0
        live_id = live.record.id if live is not None and live.record is not None else None
        for row in chosen:
            running = row["id"] == live_id
            fields = entry(row, running=running, count=live.count if running and live is not None else None)
            outputs = cell_log.replay_outputs(row["id"], before if running else None)
            for full in chunks.add(fields, outputs):
                self._push(comm, req.header,
                           {"op": "cells", "id": rid, "chunk": k, "last": False, "cells": full})
                k += 1
        listed, named = set(wanted), set(asked)
        missing = [unmatched(row) for row in reversed(cell_log.session_cells())
                   if row["frontend_cell_id"] not in listed and row["id"] not in named][:UNMATCHED_LISTED]
        queued = [{"cell_id": frontend_cell_id(r), "msg_id": r.msg_id, "code": r.code}
                  for r in self._following.live_cells() if r is not live]
        self._push(comm, req.header, {
            "op": "cells", "id": rid, "chunk": k, "last": True, "cells": chunks.rest(),
            "session": cell_log.session_id, "unmatched": missing, "queued": queued,
            "following": sorted(comm.following)})

    def _notebook(self, req: Request, comm: OpenComm, rid: str | int, ask: NotebookRequest) -> None:
        """A page says where its notebook is now and which cells it holds: the session is filed
        under that path, and its history is the sessions that ran one of those cells."""
        cell_log = self._cell_log
        path = cell_log.notebook.absolute(ask.path, ask.server_root)
        sessions = cell_log.notebook_holds(ask.cell_ids) if cell_log.recording else []
        self._supervisor.notebook_moved(path)
        self._push(comm, req.header, {"op": "notebook", "id": rid, "notebook": path, "sessions": sessions})
        self.changed()

    async def _generations(self, req: Request, comm: OpenComm, rid: str | int) -> None:
        """This session's generations, for the status dialog's picture: read once what was recorded
        is written (an end just recorded is in it), the serving one's peak as sampled now (the store
        has an ended one's)."""
        rows: list[Json] = []
        if self._cell_log.recording:
            await self._cell_log.settled()
            rows = [dict(row) for row in self._cell_log.generations()]
        current = self._supervisor.current
        for row in rows:
            if current is not None and current.memory is not None and row["number"] == current.number:
                row["memory_peak"] = current.memory.peak or row["memory_peak"]
        self._push(comm, req.header, {"op": "generations", "id": rid, "generations": rows, "now": now()})
        self._done(req)

    async def _plan(self, req: Request, comm: OpenComm, rid: str | int) -> None:
        """What a rebuild would run, and which generation each cell's results belong to."""
        cell_log = self._cell_log
        if not cell_log.recording:
            self._error(comm.comm_id, req.header, rid,
                        NotRecording("the cell log is not available in this session: there is no plan"))
        else:
            await cell_log.settled()
            self._push(comm, req.header, {"op": "plan", "id": rid, **plan_answer(cell_log, self._supervisor)})
        self._done(req)

    async def _restart(self, req: Request, comm: OpenComm, rid: str | int) -> None:
        """As `%klbr restart`: a fresh generation; answered once it has taken over (or failed to)."""
        old = self._supervisor.current
        await self._supervisor.restart()
        text = restarted_text(old, self._supervisor.current)
        self._push(comm, req.header, {"op": "restart", "id": rid, "text": text, **self._state_fields()})
        if req.phase is Phase.PROXY:
            self._done(req)
        self.changed()

    # -- sending -----------------------------------------------------------------------------------

    def _state_fields(self) -> Json:
        supervisor, cell_log = self._supervisor, self._cell_log
        generation = supervisor.current
        st = supervisor.status()  # read once for the rows and the facts
        return {
            "protocol": PROTOCOL, "implementation": "klbr", "version": __version__,
            "kernel_session": self._session.session, "store_session": cell_log.session_id,
            "generation": generation.number if generation is not None else None,
            "placement": supervisor.where.spec, "recording": cell_log.recording_state(),
            "notebook": supervisor.notebook,
            "status": [list(row) for row in status_rows(supervisor, cell_log, self._frontend, st)],
            "memory": dict(generation.memory.status()) if generation is not None and generation.memory else None,
            "facts": status_facts(supervisor, cell_log, st),
        }

    def _push(self, comm: OpenComm, parent: dict[str, Any], data: Json) -> None:
        self._frontend.send_iopub("comm_msg", {"comm_id": comm.comm_id, "data": {"v": PROTOCOL, **data}}, parent)

    def _error(self, comm_id: str, parent: dict[str, Any], rid: str | int | None, error: CommError) -> None:
        log.info("klbr comm %s: %s: %s", comm_id[:40], error.name, error.message)
        data = {"v": PROTOCOL, "id": rid, "error": {"name": error.name, "message": error.message}}
        self._frontend.send_iopub("comm_msg", {"comm_id": comm_id, "data": data}, parent)

    def _done(self, req: Request) -> None:
        req.move(Phase.ANSWERED)
        self._brackets.idle(req)
        req.move(Phase.DONE)
