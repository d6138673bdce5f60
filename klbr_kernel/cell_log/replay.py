"""`%klbr replay [CELL] [--follow]`: a cell's recorded outputs, published again as the current cell's.

The outputs come from the cell log as a notebook showed them at the end (clears and display updates
applied), so they render as they first did: streams (adjacent writes joined, then cut into messages of
at most `CHUNK` bytes so that a page takes 10 MiB without freezing), displays (a widget's view, whose
model is gone with its worker, leaves its static fallback), an execute_result as a display under an
`Out[n]:` line, errors. A header line says which cell it was and how it ended. They are not recorded
again: the replay cell's row holds its header, the outputs stay with the cell that made them.

A cell still running in this kernel replays what it has so far; with `--follow` the replay then relays
its new outputs as they come and ends when it does. Replays only read the log, so `Dispatch` answers
them at once, also while another cell runs (that is when a reconnected notebook needs one).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from ..frontend.sockets import Frontend
from ..magics.parse import MagicError, ReplaySpec
from ..requests.queue import ShellQueue
from ..requests.request import Request
from .recording import CellLog

Show = Callable[[Request, str, dict[str, Any]], None]

CHUNK = 2**20  # bytes of stream text per replayed message
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def stream_chunks(text: str, limit: int = CHUNK) -> list[str]:
    """`text` cut into pieces of at most `limit` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return [text]
    chunks, start = [], 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte: back off
            end -= 1
        chunks.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return chunks


def _shown(data: dict[str, Any]) -> dict[str, Any]:
    """What a replayed display shows: a widget's static fallback, not its view of a gone model."""
    if _WIDGET_VIEW in data and len(data) > 1:
        return {mime: value for mime, value in data.items() if mime != _WIDGET_VIEW}
    return data


def messages(outputs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The iopub messages that show `outputs` (nbformat-shaped, see `queries.rendered_outputs`)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for output in outputs:
        kind = output["output_type"]
        if kind == "stream":
            out += [("stream", {"name": output["name"], "text": text}) for text in stream_chunks(output["text"])]
        elif kind == "error":
            out.append(("error", {key: output[key] for key in ("ename", "evalue", "traceback")}))
        else:
            if kind == "execute_result":
                out.append(("stream", {"name": "stdout", "text": f"Out[{output.get('execution_count')}]:\n"}))
            out.append(("display_data", {"data": _shown(output["data"]), "metadata": output["metadata"],
                                         "transient": {}}))
    return out


def header(row: sqlite3.Row, *, running: bool, follow: bool, count: int | None = None) -> str:
    """The line a replay starts with: which cell, which generation, when, how it ended (`count`: a
    running cell's, which its row gets only when it ends)."""
    count = row["execution_count"] if count is None else count
    label = f"In [{count}]" if count is not None else "no In[n]"
    when = row["started"][:19].replace("T", " ")
    if running:
        how = "still running: its outputs so far" + (", then the rest as they come" if follow else "")
    else:
        finished = (row["finished"] or "")[11:19]
        how = f"ended {row['status']}" + (f" at {finished}" if finished else "")
    text = (f"klbr replay: cell {row['id']} ({label} of session {row['session_id']}, generation "
            f"{row['generation'] if row['generation'] is not None else '-'}), started {when} UTC, {how}.")
    if row["outputs_truncated"]:
        text += f" The log kept only part of its {row['output_bytes']} bytes of output (Store.max_output_bytes)."
    return text + "\n"


class Follower:
    """A replay cell relaying the outputs of the running cell it replays, until that cell ends."""

    def __init__(self, replay: Request, publish: Show):
        self.replay = replay
        self._publish = publish
        self._pending: list[tuple[str, dict[str, Any]]] | None = []  # what came before the replay caught up
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def output(self, msg_type: str, content: dict[str, Any]) -> None:
        """An output of the followed cell, as it is published (`Delivery`)."""
        if self._pending is not None:
            self._pending.append((msg_type, content))
        else:
            self._publish(self.replay, msg_type, content)

    def caught_up(self) -> None:
        pending, self._pending = self._pending or [], None
        for msg_type, content in pending:
            self._publish(self.replay, msg_type, content)

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


class Replay:
    def __init__(self, frontend: Frontend, cell_log: CellLog, queue: ShellQueue, notebook: str | None, show: Show):
        """`queue`: where the cell still running is; `notebook`: whose cells are replayed;
        `show(req, msg_type, content)`: an output of the replay cell's own (its header line),
        shown and recorded (`OwnAnswers.output`)."""
        self._frontend = frontend
        self._cell_log = cell_log
        self._queue = queue
        self._notebook = notebook
        self._show = show

    def publish(self, req: Request, msg_type: str, content: dict[str, Any]) -> None:
        """A replayed output: shown as the replay cell's, not recorded again."""
        self._frontend.send_iopub(msg_type, content, req.header)

    async def run(self, req: Request, spec: ReplaySpec) -> None:
        cell_log = self._cell_log
        if not cell_log.recording:
            msg = "the cell log is not available in this session: there is nothing to replay"
            raise MagicError(msg)
        live = self._queue.inflight
        record = live.record if live is not None and live.with_worker else None  # a cell running on a worker
        follower, before = None, None
        if live is not None and record is not None:
            # What it has recorded so far is read from the log; what it prints from now on, the
            # follower relays, so nothing is shown twice or missed.
            before = record.seq + 1
            if spec.follow:
                follower = Follower(req, self.publish)
                live.followers.append(follower)
        try:
            await cell_log.settled()
            row = cell_log.replay_cell(self._notebook, cell_id=spec.cell_id, count=spec.count)
            if row is None:
                raise MagicError(self._missing(spec))
            running = live if record is not None and record.id == row["id"] else None  # the cell replayed runs
            text = header(row, running=running is not None, follow=follower is not None,
                          count=running.count if running is not None else None)
            self._show(req, "stream", {"name": "stdout", "text": text})
            for msg_type, content in messages(cell_log.replay_outputs(row["id"], before if running is not None else None)):
                self.publish(req, msg_type, content)
            if follower is not None and running is not None:
                follower.caught_up()
                await follower.ended
                status = (running.reply_content or {}).get("status", "?")
                self._show(req, "stream", {"name": "stdout", "text": f"klbr replay: cell {row['id']} ended {status}.\n"})
        finally:
            if follower is not None and live is not None and follower in live.followers:
                live.followers.remove(follower)

    @staticmethod
    def _missing(spec: ReplaySpec) -> str:
        if spec.cell_id is not None:
            return f"there is no cell {spec.cell_id} in the cell log (`%klbr history` lists them)"
        if spec.count is not None:
            return f"no In[{spec.count}] in this session's cell log (`%klbr history` lists them)"
        return "no cell of this notebook has outputs to replay yet"
