"""Handles the proxy holds for rows the store writes later (the writer thread fills in ids)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class CellRecord:
    """One cell's row, from `Store.cell_started` to `Store.cell_finished`.

    Outputs are counted here, on the loop thread, so the per-cell bound costs no SQL.
    """

    msg_id: str
    client_session: str
    code: str
    generation: int | None
    msg_digest: str | None = None  # what tells this execute from another with its msg_id (semantics 9)
    frontend_cell_id: str | None = None  # the frontend's id of the cell (JupyterLab's metadata.cellId)
    rebuild_of: int | None = None  # the cell `%klbr rebuild` runs again, for a rebuilt cell
    id: int | None = None  # set by the writer when the row is inserted
    seq: int = 0
    output_bytes: int = 0
    truncated: bool = False
