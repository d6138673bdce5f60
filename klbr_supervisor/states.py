"""The states of a generation and of the supervisor, the moves between them, and why a generation
ends. Imports nothing of ours: every other module may read it.

Each state machine has one door that checks a move against its table and logs it
(`Generation._set_state`, `Supervisor._set_state`), as supervisord's processes do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GenerationState(enum.Enum):
    # Members hash by identity, as they compare: enum's own __hash__ is a Python function, and
    # every move looks its state up in a table and a set (dozens of calls per cell).
    __hash__ = object.__hash__
    NEW = "new"  # created; its start has not begun
    LAUNCHING = "launching"  # its placement checked, then its target launching the worker
    STARTING = "starting"  # launched: connecting, until it answers kernel_info (`readiness`)
    READY = "ready"
    BUSY = "busy"  # a cell runs on it
    ENDING = "ending"  # it takes nothing more; its end is under way (`closing.Closing`)
    ENDED = "ended"  # its `Ending` is recorded; its channels are closed

    @property
    def shown(self) -> str:
        """As `%klbr status` shows it: a generation not serving yet is starting."""
        return "starting" if self in _NOT_YET else self.value


_NOT_YET = frozenset({GenerationState.NEW, GenerationState.LAUNCHING, GenerationState.STARTING})
# It takes requests.
ALIVE = frozenset({GenerationState.READY, GenerationState.BUSY})
# Every way out goes through ENDING: an end is decided once, then carried out.
TRANSITIONS: dict[GenerationState, frozenset[GenerationState]] = {
    GenerationState.NEW: frozenset({GenerationState.LAUNCHING, GenerationState.ENDING}),
    GenerationState.LAUNCHING: frozenset({GenerationState.STARTING, GenerationState.ENDING}),
    GenerationState.STARTING: frozenset({GenerationState.READY, GenerationState.ENDING}),
    GenerationState.READY: frozenset({GenerationState.BUSY, GenerationState.ENDING}),
    GenerationState.BUSY: frozenset({GenerationState.READY, GenerationState.ENDING}),
    GenerationState.ENDING: frozenset({GenerationState.ENDED}),
    GenerationState.ENDED: frozenset(),
}


class EndReason(enum.Enum):
    LOST = "lost"  # the worker died on its own
    KILLED = "killed"  # killed after an interrupt it did not obey
    DEADLINE = "deadline"  # killed after its cell overran the deadline
    RESTART = "restart"  # a restart was asked for
    RELOCATED = "relocated"  # replaced by a generation on another placement
    SHUTDOWN = "shutdown"  # the kernel shut down
    START_FAILED = "start_failed"  # never became ready
    LINK_LOST = "link_lost"  # a worker elsewhere fell silent with no exit reported: outcome unknown


@dataclass(frozen=True)
class Ending:
    """Why and how a generation ended, as recorded and reported."""

    reason: EndReason
    returncode: int | None
    how: str  # e.g. "killed by signal 9 (SIGKILL)"
    stderr_tail: str = ""


class SupervisorState(enum.Enum):
    __hash__ = object.__hash__  # as GenerationState's
    SERVING = "serving"  # a generation serves or starts, or one starts when a request waits
    START_FAILED = "start_failed"  # the current generation never served: the next request starts
    # another, its placement checked first (a failed start is never retried in a loop)
    HANDING_OVER = "handing_over"  # the current generation ended and the listener is being told;
    # what follows was decided first, and nothing starts meanwhile
    CRASH_LOOP = "crash_loop"  # the restart budget is spent: nothing starts until `%klbr restart`
    LINK_LOST = "link_lost"  # a worker elsewhere fell silent: nothing starts until the user says
    # what next (`%klbr reconnect`, `%klbr placement`, `%klbr restart`)
    STOPPING = "stopping"  # shutting down: nothing starts again


# Nothing starts until the user asks; requests are refused with the held `Refusal`.
HALTED = frozenset({SupervisorState.CRASH_LOOP, SupervisorState.LINK_LOST})
# A request that waits starts a generation.
STARTS = frozenset({SupervisorState.SERVING, SupervisorState.START_FAILED})
SUPERVISOR_TRANSITIONS: dict[SupervisorState, frozenset[SupervisorState]] = {
    SupervisorState.SERVING: frozenset({SupervisorState.HANDING_OVER, SupervisorState.STOPPING}),
    SupervisorState.START_FAILED: frozenset({
        SupervisorState.SERVING, SupervisorState.HANDING_OVER, SupervisorState.STOPPING}),
    SupervisorState.HANDING_OVER: frozenset({
        SupervisorState.SERVING, SupervisorState.START_FAILED, SupervisorState.CRASH_LOOP,
        SupervisorState.LINK_LOST}),
    SupervisorState.CRASH_LOOP: frozenset({SupervisorState.SERVING, SupervisorState.STOPPING}),
    SupervisorState.LINK_LOST: frozenset({SupervisorState.SERVING, SupervisorState.STOPPING}),
    SupervisorState.STOPPING: frozenset(),
}
