"""What the supervisor tells its driver: the proxy kernel, or a test."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .generation import Generation
    from .messages.wire import Wire
    from .policy import Refusal
    from .states import Ending


class WorkerListener(Protocol):
    """What the supervisor tells its driver (the proxy kernel)."""

    def worker_message(self, generation: Generation, channel: str, wire: Wire) -> None:
        """A message from the current generation's shell, control, stdin or iopub channel."""

    def generation_ready(self, generation: Generation) -> None:
        """`generation` is now the current one and takes requests."""

    def generation_ended(self, generation: Generation, ending: Ending, refusal: Refusal | None) -> None:
        """The current `generation` ended; everything it sent before was delivered first.
        `refusal`: what every request is told from now on, until the user says otherwise (a crash
        loop, a lost link), or None. The supervisor's own state is decided before this call and
        nothing in it may call back into the supervisor: it is handing over."""

    def cell_note(self, msg_id: str, text: str) -> None:
        """The running cell `msg_id` left a note with `host.notify`: show it in its output."""
