"""What only an execute_request carries, apart from what every request does (`request.Request`).

Each field has one writer, named beside it: the part that decides it, or the `Execute` itself
through a method where several parts take part in what the field records (who follows its
outputs, an output no frontend saw). Every part reads them through the `Request`'s properties.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klbr_supervisor.store import CellRecord

from .states import IllegalMove

if TYPE_CHECKING:
    from klbr_supervisor.running import RunningCell

    from ..cell_log.replay import Follower
    from ..magics.parse import Magic
    from .request import Request


@dataclass(slots=True)
class Commit:
    """A recorded cell's outcome on its way to the store (semantics 3): a commit is in flight or
    not, and the last one covers the outputs counted when it began. The cell is released once a
    commit that has landed covers every output (`Delivery._settle`)."""

    in_flight: bool = False
    covered: int | None = None  # output bytes the last commit began with

    def begin(self, output_bytes: int) -> None:
        if self.in_flight:
            msg = "an outcome commit began while another was in flight"
            raise IllegalMove(msg)
        self.in_flight, self.covered = True, output_bytes

    def landed(self) -> None:
        if not self.in_flight:
            msg = "an outcome commit landed that never began"
            raise IllegalMove(msg)
        self.in_flight = False

    def covers(self, output_bytes: int) -> bool:
        """Whether the last commit has landed and includes `output_bytes` of outputs."""
        return not self.in_flight and self.covered == output_bytes


@dataclass(eq=False)
class Execute:
    """An execute_request's own state; made with its `Request` (`door.admit`)."""

    digest: str = ""  # the door: what tells it from another with the same msg_id (`door.digest`)
    magics: list[Magic] | None = None  # dispatch: a cell of `%klbr` lines, answered by the proxy
    magic_error: str | None = None  # dispatch: why its `%klbr` lines cannot be carried out
    timeout: float | None = None  # dispatch: `%%klbr timeout=SECONDS`
    body: str | None = None  # dispatch: the code after a `%%klbr` first line
    record: CellRecord | None = None  # the cell log: its row in the store, once it is a recorded cell
    running: RunningCell | None = None  # delivery: as the supervisor watches it, once sent (its deadline)
    commit: Commit = field(default_factory=Commit)  # delivery: its outcome's, once it is a recorded cell
    count: int | None = None  # the execution counts (`counts`): the worker's, or the proxy's
    reply_content: dict[str, Any] | None = None  # brackets: the reply the frontend gets (for the store, resends)
    outcome: str | None = None  # brackets: the store status of an answer the proxy wrote itself (`cell_status`)
    interrupted: bool = False  # lifecycle: klbr interrupted its worker while it ran (interrupt_request, SIGINT)
    own_outputs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # own: outputs the proxy gave it
    duplicates: list[Request] = field(default_factory=list)  # resends: copies sent again, waiting for its reply
    orphaned: bool = False  # brackets: its reply found the frontend that sent it gone
    unseen: int = 0  # itself (`published_unseen`): its outputs published while no frontend was subscribed
    followers: list[Follower] = field(default_factory=list)  # itself: `%klbr replay --follow`, the comm
    followed: bool = False  # itself (`end_followers`): a follower saw it to its end (its outputs reached a page)

    def published_unseen(self) -> None:
        """One of its outputs went out while no frontend was subscribed to iopub."""
        self.unseen += 1

    def follow(self, follower: Follower) -> None:
        """`follower` relays its outputs from now on, until it ends (`end_followers`) or leaves."""
        self.followers.append(follower)

    def unfollow(self, follower: Follower) -> None:
        if follower in self.followers:
            self.followers.remove(follower)

    def end_followers(self) -> None:
        """It is answered: the replays following it end with it."""
        followers, self.followers = self.followers, []
        self.followed = self.followed or bool(followers)
        for follower in followers:
            follower.end()
