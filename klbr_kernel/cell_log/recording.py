"""Which requests are cells, and what the store records of them. The proxy's only door to the store.

A cell is an execute that takes an execution count (store_history and not silent): variable
explorers' silent executes are not cells. Statuses are the store's public vocabulary, decided by
`outcomes.cell_status` from what the proxy knows of the request, never from an error's name.
`start`, `finish` and `answered` return True when the row is durable already; otherwise their `then`
callback runs later, on the loop, once the write is committed or has failed (never inside the call).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from klbr_supervisor.messages.protocol import as_bytes
from klbr_supervisor.messages.wire import loads
from klbr_supervisor.store import CellRecord, Store, StoreError, lineage, queries

from ..requests.outcomes import cell_status
from ..requests.request import Request
from .notebook import Notebook

if TYPE_CHECKING:
    from typing_extensions import Buffer  # bytes, or a zmq.Frame as received (collections.abc's from 3.12)

    from klbr_supervisor.generation import Generation

# iopub messages that are a cell's outputs (what an exported notebook shows).
OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"})

Then = Callable[[StoreError | None], None]
# A history_reply's entry: (session, execution count, input), or with `output`, (session, count,
# (input, its execute_result's text/plain or None)), as jupyter_client's protocol has it.
HistoryEntry = tuple[int, int, str | tuple[str, str | None]]


# nbformat 4.5's cell id: what a frontend's id must be to be recorded and exported as one.
_CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def frontend_cell_id(req: Request) -> str | None:
    """The id of the frontend cell an execute came from: JupyterLab 4 sends `metadata.cellId`
    (its cell model's shared id) with every execute_request; None when absent or not an nbformat id."""
    metadata = req.wire.body[3]
    metadata = metadata if type(metadata) is bytes else as_bytes(metadata)
    if b"cellId" not in metadata:  # most frontends send none: no decoding for them
        return None
    value = loads(metadata).get("cellId")  # the door decoded it already: it is a JSON object
    return value if isinstance(value, str) and _CELL_ID.match(value) else None


def _error_text(content: dict[str, Any]) -> str | None:
    return f"{content.get('ename')}: {content.get('evalue')}" if content.get("status") == "error" else None


class CellLog:
    def __init__(self, store: Store, notebook: Notebook | None = None):
        """`notebook`: which sessions are the served notebook's history (none named: this one only)."""
        self._store = store
        self.notebook = notebook or Notebook(None)

    @staticmethod
    def is_cell(req: Request) -> bool:
        return req.msg_type == "execute_request" and req.counts

    # -- state -------------------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._store.recording

    @property
    def unavailable(self) -> StoreError | None:
        """Why the store could not be opened at start, if it could not."""
        return self._store.unavailable

    @property
    def required(self) -> bool:
        """Cells are refused when they cannot be recorded (`Store.required`)."""
        return self._store.required

    @property
    def session_id(self) -> int | None:
        """This kernel session's id in the store (None when it is not recorded)."""
        return self._store.session_id if self._store.recording else None

    def recording_state(self) -> str:
        """`recording`, `paused` (writes fail: cells are refused) or `unavailable` (not opened)."""
        if self._store.unavailable is not None or not self._store.recording:
            return "unavailable"
        return "paused" if self._store.paused is not None else "recording"

    def state_text(self) -> str:
        """One line for `%klbr status`."""
        store = self._store
        if store.unavailable is not None:
            return f"unavailable, not recording ({store.unavailable})"
        if store.paused is not None:
            return f"PAUSED, cells refused ({store.paused})"
        return f"{store.path} (session {store.session_id})"

    def where(self) -> tuple[str, str | None]:
        """The log's path, and why it does not record now (None while it records): the status dialog's."""
        store = self._store
        problem = store.unavailable if store.unavailable is not None else store.paused
        return str(store.path), str(problem) if problem is not None else None

    # -- reading (on the loop, with the store's read connection) ------------------------------------

    def history(self, content: dict[str, Any], notebook: str | None) -> list[HistoryEntry]:
        """A history_request's answer, from the log (across generations and the notebook's sessions)."""
        reader = self._store.reader()
        return queries.history(reader, content, self._sessions(reader, notebook))

    def _sessions(self, reader: sqlite3.Connection, path: str | None) -> list[int]:
        """The notebook's sessions (`Notebook.sessions`). Also asked while the log is unavailable:
        this session is then none (0 matches no row), and the notebook's earlier ones are still read."""
        return self.notebook.sessions(reader, path, self._store.session_id or 0)

    def recorded_execute(self, req: Request) -> queries.Taken | None:
        """The execute this log took, in any session, under `req`'s client session and msg_id:
        the same message if it was taken, else another that reused the msg_id (semantics 9)."""
        if not self.recording:
            return None
        return queries.recorded_execute(self._store.reader(), req.header.get("session", ""), req.msg_id, req.digest)

    def logged_msg_ids(self, client_session: str, limit: int) -> set[str] | None:
        """The msg_ids of the executes this log took from `client_session`, in any session; None
        when there are more than `limit`, or when nothing is recorded (`recorded_execute` then
        answers None for every execute, with no read)."""
        if not self.recording:
            return None
        return queries.logged_msg_ids(self._store.reader(), client_session, limit)

    def recent_cells(self, n: int, notebook: str | None) -> list[sqlite3.Row]:
        """This notebook's last `n` cells, with their store ids and output counts (`%klbr history`)."""
        reader = self._store.reader()
        return queries.recent_cells(reader, self._sessions(reader, notebook), n)

    def replay_cell(self, notebook: str | None, *, cell_id: int | None = None,
                    count: int | None = None) -> sqlite3.Row | None:
        """The row of the cell `%klbr replay` shows, or None (see `queries.replay_cell`)."""
        session_id, reader = self._store.session_id, self._store.reader()
        assert session_id is not None, "asked only while recording (see `recording`)"
        return queries.replay_cell(reader, session_id, self._sessions(reader, notebook), cell_id=cell_id, count=count)

    def replay_outputs(self, cell_id: int, before_seq: int | None = None) -> list[dict[str, Any]]:
        """A cell's recorded outputs as a notebook shows them (nbformat's shape), those before `before_seq`."""
        return queries.rendered_outputs(queries.replay_outputs(self._store.reader(), cell_id, before_seq))

    def frontend_cells(self, cell_ids: Sequence[str], *, previous_sessions: bool) -> dict[str, sqlite3.Row]:
        """The latest recorded cell for each of these frontend cell ids, of this session (or of any:
        a page's cells are found by their ids, whatever their notebook was called when they ran)."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return queries.latest_by_frontend_cell(self._store.reader(), cell_ids,
                                               None if previous_sessions else session_id)

    def session_cells(self) -> list[sqlite3.Row]:
        """The latest recorded cell of each frontend cell id this session ran, oldest first."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return queries.session_frontend_cells(self._store.reader(), session_id)

    def records(self, ids: Sequence[int], *, previous_sessions: bool) -> list[sqlite3.Row]:
        """The recorded frontend cells with these store ids, of this session (or of any)."""
        return queries.records(self._store.reader(), ids, None if previous_sessions else self._store.session_id)

    def notebook_holds(self, cell_ids: Sequence[str]) -> list[int]:
        """A page said which cells the notebook holds: the sessions that are its history now (this one among them)."""
        reader = self._store.reader()
        self.notebook.cells_are(reader, cell_ids)
        return self._sessions(reader, None)

    def generations(self) -> list[sqlite3.Row]:
        """This session's generations, each with its cells counted (`queries.generations`)."""
        session_id = self._store.session_id
        return queries.generations(self._store.reader(), session_id) if session_id is not None else []

    def served_generations(self) -> list[sqlite3.Row]:
        """This session's generations that served, oldest first (`lineage.generations`)."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return lineage.generations(self._store.reader(), session_id)

    def generation_cells(self, number: int) -> list[sqlite3.Row]:
        """The cells generation `number` of this session ran, in the order they ran (`lineage`)."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return lineage.generation_cells(self._store.reader(), session_id, number)

    def cell_generations(self) -> dict[str, int]:
        """Each frontend cell id of this session: the last generation that has what it made (`lineage`)."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return lineage.cell_generations(self._store.reader(), session_id)

    def ended_by_request(self, number: int) -> bool:
        """Whether a cell of generation `number` asked for its end (`host.restart`, `host.relocate`)."""
        session_id = self._store.session_id
        assert session_id is not None, "asked only while recording (see `recording`)"
        return lineage.ended_by_request(self._store.reader(), session_id, number)

    async def settled(self) -> None:
        """Return once every write submitted so far is committed (what was sent is also readable)."""
        future: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()

        def done(error: StoreError | None) -> None:
            if not future.done():
                future.set_result(error)

        if not self._store.settled(done):
            await future

    # -- writing -----------------------------------------------------------------------------------

    def start(self, req: Request, generation: int | None, then: Then) -> bool:
        """The cell's `running` row, committed before the worker sees it (semantics 3). A row that
        could not be written leaves it unrecorded before `then` hears so."""
        execute = req.execute
        assert execute is not None, "a cell is an execute"
        record = CellRecord(req.msg_id, req.header.get("session", ""), req.code, generation, execute.digest,
                            frontend_cell_id(req))
        execute.record = record

        def written(error: StoreError | None) -> None:
            if error is not None:
                execute.record = None
            then(error)

        return self._store.cell_started(record, written)

    def output(self, req: Request, msg_type: str, content: Buffer) -> None:
        """`content` is the message's content frame (a zmq.Frame or bytes), recorded as sent."""
        if req.record is not None:
            self._store.output(req.record, msg_type, content)

    def finish(self, req: Request, content: dict[str, Any], then: Then) -> bool:
        """The outcome of a recorded cell (one `start` wrote the row of), `content` being the reply the
        frontend gets."""
        execute = req.execute
        assert execute is not None and execute.record is not None, "only a recorded cell finishes"
        generation = req.generation.number if req.generation else None
        memory = req.generation.memory if req.generation else None
        status = cell_status(content, own=execute.outcome, interrupted=execute.interrupted)
        return self._store.cell_finished(execute.record, status=status, count=content.get("execution_count"),
                                         error=_error_text(content), reply=content, generation=generation, done=then,
                                         memory_peak=memory.cell_ended() if memory is not None else None)

    def rebuilt_started(self, record: CellRecord, then: Then) -> bool:
        """A cell `%klbr rebuild` runs again (`record.rebuild_of`), `running` before its worker sees it
        (semantics 3), as `start` writes a frontend's."""
        return self._store.cell_started(record, then)

    def rebuilt_output(self, record: CellRecord, msg_type: str, content: Buffer) -> None:
        """An output of a rebuilt cell: kept in the log, as `output` keeps a cell's."""
        self._store.output(record, msg_type, content)

    def rebuilt_finished(self, record: CellRecord, content: dict[str, Any], status: str, generation: Generation,
                         then: Then) -> bool:
        """A rebuilt cell's outcome (`status`, decided by the rebuild), `content` its reply."""
        memory = generation.memory
        return self._store.cell_finished(record, status=status, count=None, error=_error_text(content), reply=content,
                                         generation=generation.number, done=then,
                                         memory_peak=memory.cell_ended() if memory is not None else None)

    def answered(self, req: Request, content: dict[str, Any], then: Then,
                 outputs: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        """A cell that never reached a worker (aborted, refused, a `%klbr` line): one row, durable
        before the frontend sees `content` (semantics 3). True when there is nothing to wait for
        (committed now, or not recorded at all); otherwise `then` runs later, as for `finish`."""
        store = self._store
        if not self.is_cell(req) or not store.recording or store.paused:
            return True
        record = CellRecord(req.msg_id, req.header.get("session", ""), req.code, None, req.digest,
                            frontend_cell_id(req))
        status = cell_status(content, own=req.execute.outcome if req.execute is not None else None,
                             interrupted=False)
        return store.answered(record, status=status, count=content.get("execution_count"),
                              error=_error_text(content) or "", reply=content, outputs=outputs, done=then)
