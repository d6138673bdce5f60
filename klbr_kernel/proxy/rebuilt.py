"""The cells `%klbr rebuild` runs again (`magics.rebuild`), with the worker, one at a time.

Each is an execute of the proxy's own, sent to the current generation as any cell is
(`Supervisor.send_execute`: its deadline, the interrupt ladder and the poison rule apply), with
`store_history` off (it takes no `In[n]`: the notebook's counts go on as they were, semantics 4) and
no stdin (no one is asked for input). It is a cell of its own in the log, `running` before the
worker sees it and linked to the cell it repeats (`cells.rebuild_of`); its outputs are kept there
and never published: the frontend asked for none of them (`%klbr replay CELL` shows them). Its end
is its reply and idle (`message`, which `Delivery` hands the worker's messages for it), or its
generation's end (`ended`, which `Endings` calls), answered as a frontend's cell would be.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.session import Session

from klbr_supervisor.generation import Generation
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.policy import Refusal
from klbr_supervisor.running import RunningCell
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.store import CellRecord, StoreError
from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import OUTPUT_TYPES, CellLog, Then
from ..magics.plan import PlanCell
from ..magics.rebuild import Rerun, interrupted
from ..requests.outcomes import (
    CellError,
    ending_error,
    no_reply_error,
    obeyed_interrupt,
    session_paused_error,
    timeout_error,
)
from ..requests.request import Request
from .delivery import NO_REPLY_GRACE


@dataclass(eq=False)
class RebuiltCell:
    """The rebuilt cell with the worker now."""

    msg_id: str
    record: CellRecord
    generation: Generation
    label: str  # `In[n]` of the cell it repeats
    running: RunningCell | None = None  # as the supervisor watches it, once sent
    reply: dict[str, Any] | None = None
    idle: bool = False
    ended: CellError | None = None  # its generation ended under it
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # its reply or its idle came, or it ended
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # both came, or it ended


class RebuiltCells:
    def __init__(self, *, supervisor: Supervisor, cell_log: CellLog, session: Session):
        """`session`: the frontend's, which signs an execute the way the worker checks it (and a
        worker with a key of its own gets it re-signed, as every message)."""
        self._supervisor = supervisor
        self._cell_log = cell_log
        self._session = session
        self.cell: RebuiltCell | None = None  # the one with the worker (`Delivery` routes its messages here)

    async def run(self, plan_cell: PlanCell, generation: Generation, req: Request) -> Rerun:
        """Run `plan_cell` again on `generation`, recorded; how it ended, once that is durable.
        `req`: the rebuild cell, whose interrupt (or end) before the send leaves this cell unrun."""
        session = self._session
        msg = session.msg("execute_request", {
            "code": plan_cell.body, "silent": False, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False})
        msg_id = msg["header"]["msg_id"]
        record = CellRecord(msg_id, session.session, plan_cell.code, generation.number,
                            rebuild_of=plan_cell.record_id)
        error = await self._durable(lambda then: self._cell_log.rebuilt_started(record, then))
        if error is not None:  # klbr runs nothing it cannot record
            return Rerun(None, "refused", 0.0, session_paused_error(error))
        cell = RebuiltCell(msg_id, record, generation, plan_cell.label)
        started = time.monotonic()
        if interrupted(req) or not generation.alive or self._supervisor.current is not generation:
            # The rebuild was interrupted, or its generation ended, while the row committed.
            cell.reply = {"status": "aborted"}
        else:
            self.cell = cell
            try:
                cell.running = self._supervisor.send_execute(
                    session.serialize(msg), msg_id=msg_id, code=plan_cell.body, counts=False,
                    timeout=plan_cell.timeout, cell_id=record.id)
                if cell.running is not None:
                    await self._answer(cell)
                else:  # its generation is no more
                    cell.ended = CellError("WorkerLost", f"generation {generation.number} ended before it was sent",
                                           "aborted")
            finally:
                self.cell = None
        return await self._finish(cell, time.monotonic() - started)

    async def _answer(self, cell: RebuiltCell) -> None:
        """Until its reply and idle are in (one of them, and `NO_REPLY_GRACE` for the other, as a
        frontend's cell is given), or its generation ended."""
        await cell.answered.wait()
        if not cell.finished.is_set():
            try:
                async with asyncio.timeout(NO_REPLY_GRACE):
                    await cell.finished.wait()
            except TimeoutError:
                pass  # a reply stands without its idle; an idle without a reply is answered below

    async def _finish(self, cell: RebuiltCell, seconds: float) -> Rerun:
        """Its outcome, as a frontend's cell would have it, committed before the rebuild goes on."""
        error = cell.ended
        traceback: tuple[str, ...] = ()
        content = cell.reply
        if error is None and content is None:
            error = no_reply_error("execute_request", NO_REPLY_GRACE)
        if error is not None:
            content, status = {"status": "error", **error.content()}, error.status
        else:
            assert content is not None  # one or the other, above
            status = "ok" if content.get("status") == "ok" else "aborted" if content.get("status") == "aborted" else "error"
            running = cell.running
            if status == "error":
                status, error = self._error(content, running)
                traceback = tuple(str(line) for line in content.get("traceback") or ())
            elif status == "aborted":
                error = CellError("Aborted", "the rebuild was interrupted, or its generation ended, before it ran",
                                  "aborted")
        generation = cell.generation
        written = await self._durable(
            lambda then: self._cell_log.rebuilt_finished(cell.record, content, status, generation, then))
        if written is not None and error is None:
            error = session_paused_error(written)
        return Rerun(cell.record.id, status, seconds, error, traceback)

    @staticmethod
    def _error(content: dict[str, Any], running: RunningCell | None) -> tuple[str, CellError]:
        """The status and error of a rebuilt cell the worker answered with an error."""
        ename, evalue = str(content.get("ename", "")), str(content.get("evalue", ""))
        if running is not None and running.timed_out and obeyed_interrupt(content):
            seconds = running.deadline.seconds if running.deadline else None
            error = timeout_error(None, seconds, killed=False)
            return error.status, error
        if running is not None and running.interrupted and obeyed_interrupt(content):
            return "interrupted", CellError(ename, evalue, "interrupted")
        return "error", CellError(ename, evalue)

    async def _durable(self, write: Callable[[Then], bool]) -> StoreError | None:
        """Do a cell log write (`write(then)`, True when committed at once); the error it failed with."""
        future: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()

        def then(error: StoreError | None) -> None:
            if not future.done():
                future.set_result(error)

        if write(then):
            return None
        return await future

    # -- from the worker and the supervisor ------------------------------------------------------

    def message(self, channel: str, wire: Wire) -> None:
        """A message of the current generation about the rebuilt cell (`Delivery` hands it over)."""
        cell = self.cell
        if cell is None:
            return
        if channel == "iopub":
            msg_type = wire.msg_type
            if msg_type == "status":
                if wire.execution_state == "idle":
                    cell.idle = True
                    self._check(cell)
            elif msg_type in OUTPUT_TYPES:
                self._cell_log.rebuilt_output(cell.record, msg_type, wire.body[4])
        elif channel == "shell" and wire.msg_type == "execute_reply":
            cell.reply = wire.content
            self._check(cell)

    @staticmethod
    def _check(cell: RebuiltCell) -> None:
        cell.answered.set()
        if cell.reply is not None and cell.idle:
            cell.finished.set()

    def ended(self, generation: Generation, ending: Ending, refusal: Refusal | None = None) -> bool:
        """`generation` ended (`Endings`, while the supervisor hands over: nothing here calls it
        back): True when a rebuilt cell ran on it, which ends with the error that says how (and, with
        `refusal`, that no new generation starts: a crash loop)."""
        cell = self.cell
        if cell is None or cell.generation is not generation:
            return False
        if cell.reply is not None:  # it had its reply: that stands, only its idle is missing
            cell.finished.set()
            return True
        if ending.reason is EndReason.DEADLINE:
            running = cell.running
            deadline = running.deadline if running is not None else None
            cell.ended = timeout_error(None, deadline.seconds if deadline else None, killed=True,
                                       generation=generation.number, pid=generation.pid, how=ending.how,
                                       refusal=refusal)
        else:
            cell.ended = ending_error(ending, generation=generation.number, pid=generation.pid,
                                      cell=f"the rebuilt {cell.label}", refusal=refusal)
        cell.answered.set()
        cell.finished.set()
        return True
