"""Following cells for a `klbr` comm: the running cell's later outputs and the end of every followed
cell (running or queued), pushed to the comm that asked (docs/comm-protocol.md, "follow").

Each followed cell gets a `replay.Follower`, registered on it before the log is read: it holds what
the cell prints until the snapshot has been sent (`caught_up`), then relays as it comes, so no
output is missed or doubled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..cell_log.recording import frontend_cell_id
from ..cell_log.replay import Follower
from ..requests.outcomes import cell_status
from ..requests.queue import ShellQueue
from ..requests.request import Phase, Request
from .restore import Json


@dataclass(eq=False)
class OpenComm:
    comm_id: str
    opened: dict[str, Any]  # the comm_open's header: the parent of what the proxy pushes unasked
    following: dict[str, tuple[Request, Follower]] = field(default_factory=dict)  # by followed msg_id
    closed: bool = False


Push = Callable[[OpenComm, dict[str, Any], Json], None]
Followed = list[tuple[Request, Follower]]


class Following:
    """The cells each open klbr comm follows. `push(comm, parent, data)` sends one comm message."""

    def __init__(self, queue: ShellQueue, push: Push):
        self._queue = queue
        self._push = push

    def running(self) -> Request | None:
        """The cell a worker runs now, if it has a record (its snapshot is cut at its current output)."""
        inflight = self._queue.inflight
        if inflight is not None and inflight.with_worker and inflight.record is not None \
                and inflight.record.id is not None:
            return inflight
        return None

    def live_cells(self) -> list[Request]:
        """Executes of a notebook cell that are running or queued, in order."""
        queue = self._queue
        candidates = ([queue.inflight] if queue.inflight is not None else []) + list(queue.waiting)
        return [r for r in candidates if r.msg_type == "execute_request" and r.counts and r.phase is not Phase.DONE
                and frontend_cell_id(r) is not None]

    def follow(self, req: Request, comm: OpenComm) -> Followed:
        """Followers on every live cell `comm` does not follow yet, registered before anything is
        read; they hold what comes until `caught_up`."""
        followed: Followed = []
        for target in self.live_cells():
            if target.msg_id in comm.following or target.execute is None:
                continue
            follower = Follower(req, partial(self._relay, comm, target))
            target.execute.follow(follower)
            comm.following[target.msg_id] = (target, follower)
            followed.append((target, follower))
        return followed

    def caught_up(self, comm: OpenComm, followed: Followed) -> None:
        """The snapshot is sent: what each followed cell printed meanwhile, then the rest as it
        comes; its end is told after its last output, also when it ended while the log was read."""
        for target, follower in followed:
            follower.caught_up()
            follower.ended.add_done_callback(partial(self._ended, comm, target))

    def unfollow(self, comm: OpenComm, msg_id: str) -> None:
        target, follower = comm.following.pop(msg_id, (None, None))
        if target is not None and follower is not None and target.execute is not None:
            target.execute.unfollow(follower)

    def unfollow_all(self, comm: OpenComm, followed: Followed | None = None) -> None:
        """Stop following (`followed`, or everything `comm` follows)."""
        msg_ids = [target.msg_id for target, _ in followed] if followed is not None else list(comm.following)
        for msg_id in msg_ids:
            self.unfollow(comm, msg_id)

    def _relay(self, comm: OpenComm, target: Request, _replay: Request, msg_type: str, content: Json) -> None:
        """A follower's publish: an output of `target`, for `comm` (the follower's own request,
        `_replay`, is the comm message that asked)."""
        if not comm.closed:
            record_id = target.record.id if target.record is not None else None
            self._push(comm, comm.opened, {"op": "output", "msg_id": target.msg_id, "record_id": record_id,
                                           "msg_type": msg_type, "content": content})

    def _ended(self, comm: OpenComm, target: Request, _ended: asyncio.Future[None] | None = None) -> None:
        """The followed cell is answered (its outcome committed): say how it ended, once."""
        if comm.following.pop(target.msg_id, None) is None or comm.closed:
            return
        reply, execute = target.reply_content or {}, target.execute
        status = (cell_status(reply, own=execute.outcome, interrupted=execute.interrupted)
                  if reply and execute is not None else "aborted")
        self._push(comm, comm.opened, {
            "op": "ended", "msg_id": target.msg_id, "record_id": target.record.id if target.record else None,
            "status": status, "execution_count": reply.get("execution_count", target.count)})
