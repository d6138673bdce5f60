"""The `cells` answer of the klbr comm: a page's recorded cells, cut into chunks bounded in bytes.

No I/O: `comm` reads the rows and outputs from the cell log and publishes what this builds. A cell's
entry travels in one or more parts, each with the cell's fields and some of its outputs in order
(`part` counts from 0, `complete` marks the last); a stream output longer than a chunk is cut into
several stream outputs of the same name, which a notebook shows as one. An output that cannot be cut
(an image bigger than the bound) travels alone in a chunk of its own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

from ..cell_log.replay import stream_chunks

DEFAULT_CHUNK_BYTES = 2**20
MIN_CHUNK_BYTES = 2**16
MAX_CHUNK_BYTES = 2**24
UNMATCHED_LISTED = 50  # recorded cells the page does not have, listed newest first

Json = dict[str, Any]


def size(value: object) -> int:
    """Bytes of `value` as the message carries it (UTF-8 JSON)."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def entry(row: sqlite3.Row, *, running: bool, count: int | None) -> Json:
    """A recorded cell's fields in the answer, without its outputs (`count`: a running cell's, which
    its row gets only when it ends)."""
    return {
        "cell_id": row["frontend_cell_id"],
        "record_id": row["id"],
        "msg_id": row["msg_id"],
        "session": row["session_id"],
        "execution_count": count if running else row["execution_count"],
        "status": row["status"],
        "running": running,
        "code": row["code"],
        "outputs_truncated": bool(row["outputs_truncated"]),
    }


def unmatched(row: sqlite3.Row) -> Json:
    """A recorded cell whose frontend cell the page does not have: enough for a notice that points to
    `%klbr replay N`."""
    code = row["code"] or ""
    return {"record_id": row["id"], "cell_id": row["frontend_cell_id"], "execution_count": row["execution_count"],
            "status": row["status"], "first_line": code.splitlines()[0][:200] if code.strip() else ""}


def _pieces(output: Json, limit: int) -> list[Json]:
    """`output`, or a stream too big for one chunk cut into streams of the same name."""
    if output.get("output_type") != "stream" or size(output) <= limit:
        return [output]
    # Half the bound for the text: JSON escapes can lengthen what is measured in UTF-8 bytes.
    return [{"output_type": "stream", "name": output["name"], "text": text}
            for text in stream_chunks(output["text"], max(1, limit // 2))]


class Chunks:
    """Cells' parts gathered into chunks of at most `limit` bytes (see the module's docstring)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._parts: list[Json] = []
        self._size = 0

    def add(self, fields: Json, outputs: list[Json]) -> Iterator[list[Json]]:
        """Add one cell; yields each chunk that is full."""
        base = size(fields) + 64  # the part's own fields
        part: Json = dict(fields, part=0, complete=False, outputs=[])
        part_size = base
        for output in outputs:
            for piece in _pieces(output, self.limit):
                piece_size = size(piece)
                if self._size + part_size + piece_size > self.limit and (self._parts or part["outputs"]):
                    if part["outputs"]:
                        self._parts.append(part)
                        part = dict(fields, part=part["part"] + 1, complete=False, outputs=[])
                        part_size = base
                    yield self._take()
                part["outputs"].append(piece)
                part_size += piece_size
        part["complete"] = True
        self._parts.append(part)
        self._size += part_size

    def rest(self) -> list[Json]:
        """What is left: the last chunk (possibly empty)."""
        return self._take()

    def _take(self) -> list[Json]:
        parts, self._parts, self._size = self._parts, [], 0
        return parts


def chunk_limit(requested: object) -> int:
    """The chunk bound a request asked for, within what the proxy allows."""
    if requested is None:
        return DEFAULT_CHUNK_BYTES
    assert isinstance(requested, int)
    return min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, requested))
