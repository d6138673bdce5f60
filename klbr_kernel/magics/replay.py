"""`%klbr replay [CELL] [--follow]`: a cell's recorded outputs published again as the current cell's
(rendered by `cell_log.replay`), and with `--follow` a running cell's new outputs as they come.

Replays only read the log, so `Dispatch` answers them at once, also while another cell runs (that
is when a reconnected notebook needs one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..cell_log.notices import Notices
from ..cell_log.recording import CellLog
from ..cell_log.replay import Follower, Show, header, messages
from ..frontend.sockets import Frontend
from ..requests.queue import ShellQueue
from ..requests.request import Request
from .parse import Magic, MagicError, ReplaySpec, replay_spec


class Replay:
    def __init__(self, frontend: Frontend, cell_log: CellLog, queue: ShellQueue, notebook: Callable[[], str | None],
                 notices: Notices, show: Show):
        """`queue`: where the cell still running is; `notebook()`: the path of the notebook whose
        cells are replayed; `notices`: told that a replayed cell's outputs reached a notebook;
        `show(req, msg_type, content)`: an output of the replay cell's own (its header line),
        shown and recorded (`OwnAnswers.output`)."""
        self._frontend = frontend
        self._cell_log = cell_log
        self._queue = queue
        self._notebook = notebook
        self._notices = notices
        self._show = show

    def acted_on(self, magics: Iterable[Magic]) -> None:
        """A cell of these `%klbr` lines is about to start: the notices of the cells it replays by
        id are not given in it (`run` empties those that were shown)."""
        ids = [spec.cell_id for spec in (replay_spec(m.args) for m in magics if m.command == "replay")
               if spec.cell_id is not None]
        self._notices.withhold(ids)

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
        followed = live.execute if live is not None and record is not None else None
        follower, before = None, None
        if followed is not None and record is not None:
            # What it has recorded so far is read from the log; what it prints from now on, the
            # follower relays, so nothing is shown twice or missed.
            before = record.seq + 1
            if spec.follow:
                follower = Follower(req, self.publish)
                followed.follow(follower)
        try:
            await cell_log.settled()
            row = cell_log.replay_cell(self._notebook(), cell_id=spec.cell_id, count=spec.count)
            if row is None:
                raise MagicError(self._missing(spec))
            self._notices.reached([row["id"]], req.header)
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
            if follower is not None and followed is not None:
                followed.unfollow(follower)

    @staticmethod
    def _missing(spec: ReplaySpec) -> str:
        if spec.cell_id is not None:
            return f"there is no cell {spec.cell_id} in the cell log (`%klbr history` lists them)"
        if spec.count is not None:
            return f"no In[{spec.count}] in this session's cell log (`%klbr history` lists them)"
        return "no cell of this notebook has outputs to replay yet"
