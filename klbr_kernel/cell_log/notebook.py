"""Which notebook a kernel session serves, and which sessions' cells are that notebook's history.

The server names the notebook when it starts the kernel (`JPY_SESSION_NAME`, its path then); the
klbr extension tells the kernel its path again whenever it changes (a rename, a move, a save-as)
and the ids of the cells it holds. A notebook's history is then the sessions that recorded one of
its cells, whatever the notebook was called when they ran: a renamed notebook keeps its history, a
new `Untitled.ipynb` inherits no one's (its cells' ids are its own), and the name alone never
decides. A kernel no page with the extension has spoken to keeps the older rule: the sessions filed
under the same path. docs/reconnecting.md says what this means for a rename, a save-as, a copy and
a move; docs/decisions/63-notebook-by-cell-ids.md why.
"""

from __future__ import annotations

import posixpath
import sqlite3
from collections.abc import Sequence

from klbr_supervisor.store import queries


class Notebook:
    def __init__(self, started_as: str | None):
        """`started_as`: the notebook's path the server gave at start (absolute), if any."""
        self._started_as = started_as
        self._root: str | None = None  # the server's root directory, once it is known
        self._sessions: list[int] | None = None  # by its cells, once a page said which it holds

    @property
    def told(self) -> bool:
        """Whether a page with the extension has said which cells the notebook holds."""
        return self._sessions is not None

    def absolute(self, path: str, server_root: str | None = None) -> str:
        """The notebook's path as the server's API names it (relative to the server's root) made
        absolute, as `JPY_SESSION_NAME` is: the root is what the path the server started the kernel
        with has before the first path a page reports, else the root the page knows, else the path
        stays as it came."""
        path = path.strip("/")
        start = self._started_as
        if self._root is None and start and (start == path or start.endswith("/" + path)):
            self._root = start[: len(start) - len(path)].rstrip("/") or "/"
        root = self._root if self._root is not None else (server_root or None)
        return posixpath.join(root, path) if root else path

    def cells_are(self, reader: sqlite3.Connection, cell_ids: Sequence[str]) -> list[int]:
        """A page says the notebook holds these cells: its history is the sessions that ran one."""
        self._sessions = queries.sessions_with_cells(reader, cell_ids)
        return self._sessions

    def sessions(self, reader: sqlite3.Connection, path: str | None, session_id: int) -> list[int]:
        """The notebook's sessions, oldest first (this one among them)."""
        ids = queries.sessions_named(reader, path, session_id) if self._sessions is None else self._sessions
        return sorted({*ids, session_id})
