"""The states of a workbench generation and the reasons it can end. Imports nothing of ours."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GenerationState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    ENDING = "ending"
    ENDED = "ended"


# The only transitions `Generation._set_state` accepts.
TRANSITIONS: dict[GenerationState, frozenset[GenerationState]] = {
    GenerationState.STARTING: frozenset({GenerationState.READY, GenerationState.ENDING, GenerationState.ENDED}),
    GenerationState.READY: frozenset({GenerationState.BUSY, GenerationState.ENDING, GenerationState.ENDED}),
    GenerationState.BUSY: frozenset({GenerationState.READY, GenerationState.ENDING, GenerationState.ENDED}),
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
