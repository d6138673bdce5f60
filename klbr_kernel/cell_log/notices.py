"""Notices of outputs that reached no notebook: given in the next cell, only while they are true.

A cell whose outputs went out while no frontend was subscribed, or whose reply found the frontend
that ran it gone (a reloaded page: docs/decisions/18-unseen-outputs.md), is noticed by the next
cell that runs, with the `%klbr replay N` that brings its outputs back. Not when a page got them
after all: a follower (the klbr extension following the cell, `%klbr replay --follow`) saw the cell
to its end, or the extension put the cell's outputs back into their cell before the next cell ran.

A notice is a display with an id of its own, `klbr-unseen-N`, and the cell log does not keep it
(it is news about another cell, not an output of the cell that shows it). Once it no longer holds
(`reached`: the extension restored those outputs, or `%klbr replay N` showed them), an
`update_display_data` empties it in every page and notebook client that shows it, so a notebook
saved after that does not keep its words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..frontend.sockets import Frontend
from ..requests.request import Request


def display_id(record_id: int) -> str:
    return f"klbr-unseen-{record_id}"


class Notices:
    def __init__(self, frontend: Frontend):
        self._frontend = frontend
        self._pending: dict[int, str] = {}  # by record id: notices for the next cell to show
        self._shown: set[int] = set()  # record ids whose notice a cell shows

    def unseen(self, req: Request) -> None:
        """`req` is done: if its outputs reached no frontend, and no follower saw it to its end, the
        next cell says so, once."""
        execute = req.execute
        record = execute.record if execute is not None else None
        if execute is None or record is None or record.id is None or execute.followed \
                or not (execute.unseen or execute.orphaned):
            return
        count = f"cell [{execute.count}]" if execute.count is not None else "a cell"
        if execute.orphaned:
            what = (f"klbr: {count} ended after the frontend that ran it disconnected, so its "
                    f"{record.seq} outputs reached no notebook")
        else:
            what = f"klbr: {execute.unseen} outputs of {count} were published while no frontend was connected"
        self._pending[record.id] = f"{what}; `%klbr replay {record.id}` brings them back."

    def show(self, req: Request) -> None:
        """The notices waiting, as the first outputs of the cell `req` (not a silent one: they wait)."""
        if req.silent or not self._pending:
            return
        pending, self._pending = self._pending, {}
        for record_id, text in pending.items():
            self._display("display_data", record_id, text, "unseen", req.header)
            self._shown.add(record_id)

    def withhold(self, record_ids: Iterable[int]) -> None:
        """A cell about to start shows these cells' outputs: their notices are not given in it."""
        for record_id in record_ids:
            self._pending.pop(record_id, None)

    def reached(self, record_ids: Iterable[int], parent: dict[str, Any]) -> None:
        """The outputs of these cells reached a notebook after all (restored into their cells, or
        replayed by `parent`): their notices are not given, and those shown are emptied."""
        for record_id in record_ids:
            self._pending.pop(record_id, None)
            if record_id in self._shown:
                self._shown.discard(record_id)
                self._display("update_display_data", record_id, "", "cleared", parent)

    def _display(self, msg_type: str, record_id: int, text: str, state: str, parent: dict[str, Any]) -> None:
        self._frontend.send_iopub(msg_type, {
            "data": {"text/plain": text}, "metadata": {"klbr": {"notice": state, "record_id": record_id}},
            "transient": {"display_id": display_id(record_id)}}, parent, keep=True)
