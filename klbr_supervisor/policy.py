"""The supervisor's decisions, with no I/O and an injectable clock: a test walks them without a kernel.

- the interrupt ladder: interrupt, and kill if the cell has not ended `interrupt_grace` seconds later;
- deadlines: the per-cell override, else the session's `%klbr timeout`, else `cell_timeout`; the clock
  runs only while the cell runs, not while it waits for `input()`;
- the restart budget: at most `restart_limit` automatic new generations per `restart_window` seconds;
- the poison rule: code whose worker died under it `poison_after` times in a row is refused;
- the retry rule: idempotent requests in flight at a loss are sent once more (`may_retry`).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


class Deadline:
    """A cell's time budget that pauses while the cell waits for input."""

    def __init__(self, seconds: float, clock: Clock):
        self.seconds = seconds
        self._clock = clock
        self._used = 0.0
        self._since: float | None = clock()

    def pause(self) -> None:
        if self._since is not None:
            self._used += self._clock() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = self._clock()

    @property
    def paused(self) -> bool:
        return self._since is None

    def remaining(self) -> float:
        used = self._used + (self._clock() - self._since if self._since is not None else 0.0)
        return self.seconds - used


def code_digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Policy:
    interrupt_grace: float = 3.0
    cell_timeout: float = 0.0
    restart_limit: int = 5
    restart_window: float = 300.0
    poison_after: int = 2
    clock: Clock = time.monotonic
    session_timeout: float | None = None  # %klbr timeout; None falls back to cell_timeout
    _restarts: deque[float] = field(default_factory=deque)
    _poison_digest: str | None = None
    _poison_count: int = 0

    # -- deadlines ---------------------------------------------------------------------------------

    def timeout_for(self, cell_override: float | None = None) -> float | None:
        """Seconds a cell may run, or None for no limit (0 means none at every level)."""
        for seconds in (cell_override, self.session_timeout, self.cell_timeout):
            if seconds is not None:
                return seconds if seconds > 0 else None
        return None

    def deadline_for(self, cell_override: float | None = None) -> Deadline | None:
        seconds = self.timeout_for(cell_override)
        return Deadline(seconds, self.clock) if seconds is not None else None

    # -- interrupt ladder --------------------------------------------------------------------------

    def kill_at(self, interrupted_at: float) -> float:
        """When a cell interrupted at `interrupted_at` is killed if it has not ended."""
        return interrupted_at + self.interrupt_grace

    # -- restart budget ----------------------------------------------------------------------------

    def restarts_in_window(self) -> int:
        now = self.clock()
        while self._restarts and self._restarts[0] <= now - self.restart_window:
            self._restarts.popleft()
        return len(self._restarts)

    def may_restart(self) -> bool:
        """Whether one more automatic new generation fits the budget."""
        return self.restarts_in_window() < self.restart_limit

    def note_restart(self) -> None:
        self._restarts.append(self.clock())

    def reset_restarts(self) -> None:
        """`%klbr restart`: the user asked; the budget starts over."""
        self._restarts.clear()

    # -- poison ------------------------------------------------------------------------------------

    def note_outcome(self, code: str, *, lost: bool) -> None:
        """A cell ended; `lost` when its worker died under it (timeouts and kills do not count)."""
        if not lost:
            self.clear_poison()
            return
        digest = code_digest(code)
        if digest == self._poison_digest:
            self._poison_count += 1
        else:
            self._poison_digest, self._poison_count = digest, 1

    def is_poisoned(self, code: str) -> bool:
        return (
            self.poison_after > 0
            and self._poison_count >= self.poison_after
            and code_digest(code) == self._poison_digest
        )

    def poison_count(self) -> int:
        return self._poison_count

    def clear_poison(self) -> None:
        self._poison_digest, self._poison_count = None, 0


# -- refusals and retries ------------------------------------------------------------------------

# Requests that are safe to send again (semantics 8): asking twice changes nothing.
IDEMPOTENT = frozenset({"complete_request", "inspect_request", "is_complete_request", "history_request",
                        "comm_info_request"})


def may_retry(msg_type: str, retried: bool) -> bool:
    """Whether a request in flight when its generation was lost is sent once more to the next one."""
    return msg_type in IDEMPOTENT and not retried


@dataclass(frozen=True)
class Refusal:
    """Why the supervisor will not run a cell now; the proxy words it for the notebook."""

    reason: str  # "crash_loop": the restart budget is spent; "poisoned": this code killed its worker;
    # "placement_lost": the link to a worker elsewhere was lost, and nothing starts until asked
    count: int  # restarts in the window, or losses in a row
    window: float = 0.0  # seconds the restarts were counted over
    detail: str = ""  # placement_lost: the placement, and how its link was lost
