"""Which requests are cells, and what the store records of them. The proxy's only door to the store.

A cell is an execute that takes an execution count (store_history and not silent): variable
explorers' silent executes are not cells. Statuses are the store's public vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

from klbr_supervisor.store import CellRecord, Store, StoreError

from .requests import Request

# iopub messages that are a cell's outputs (what an exported notebook shows).
OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"})

_STATUS_BY_ENAME = {
    "KeyboardInterrupt": "interrupted",
    "CellTimeout": "timeout",
    "WorkerLost": "lost",
    "WorkerKilled": "killed",
    "PoisonedCell": "refused",
    "CrashLoop": "refused",
    "SessionPaused": "refused",
}


def cell_status(content: dict) -> str:
    """The store status for the reply content a cell ended with."""
    status = content.get("status", "ok")
    if status == "error":
        return _STATUS_BY_ENAME.get(content.get("ename", ""), "error")
    return "aborted" if status == "aborted" else "ok"


class CellLog:
    def __init__(self, store: Store):
        self.store = store

    @staticmethod
    def is_cell(req: Request) -> bool:
        return req.msg_type == "execute_request" and req.counts

    @property
    def recording(self) -> bool:
        return self.store.recording

    def start(self, req: Request, generation: int | None, done: Callable[[StoreError | None], None]) -> None:
        req.record = CellRecord(req.msg_id, req.header.get("session", ""), req.code, generation)
        self.store.cell_started(req.record, done)

    def output(self, req: Request, msg_type: str, content) -> None:
        """`content` is the message's content frame (a zmq.Frame or bytes), recorded as sent."""
        if req.record is not None:
            self.store.output(req.record, msg_type, content)

    def finish(self, req: Request, content: dict, done: Callable[[StoreError | None], None]) -> None:
        """The outcome of a recorded cell, `content` being the reply the frontend gets."""
        error = f"{content.get('ename')}: {content.get('evalue')}" if content.get("status") == "error" else None
        generation = req.generation.number if req.generation else None
        self.store.cell_finished(req.record, status=cell_status(content), count=content.get("execution_count"),
                                 error=error, reply=content, generation=generation, done=done)

    def answered(self, req: Request, content: dict, outputs: list[tuple[str, dict]] = ()) -> None:
        """A cell that never reached a worker (aborted, refused, a `%klbr` line): one row."""
        if not self.is_cell(req) or not self.store.recording or self.store.paused:
            return
        record = CellRecord(req.msg_id, req.header.get("session", ""), req.code, None)
        error = f"{content.get('ename')}: {content.get('evalue')}" if content.get("status") == "error" else ""
        self.store.answered(record, status=cell_status(content), count=content.get("execution_count"),
                            error=error, reply=content, outputs=outputs)
