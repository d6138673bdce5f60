"""A cell's recorded outputs as the iopub messages that show them again, and the relay of a running
cell's outputs to whoever follows it (`Follower`: `%klbr replay --follow`, the klbr comm).

The outputs come from the cell log as a notebook showed them at the end (clears and display updates
applied), so they render as they first did: streams (adjacent writes joined, then cut into messages of
at most `CHUNK` bytes so that a page takes 10 MiB without freezing), displays (a widget's view, whose
model is gone with its worker, leaves its static fallback), an execute_result as a display under an
`Out[n]:` line, errors. A header line says which cell it was and how it ended. They are not recorded
again: the replaying cell's row holds its header, the outputs stay with the cell that made them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from ..requests.request import Request

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
