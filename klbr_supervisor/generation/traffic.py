"""What a generation's worker says and is sent: re-signed, verified, and sorted.

A worker with a key of its own is re-signed both ways (`resign`); what does not verify, or is no
message, is dropped with a warning. What is left is the generation's own bookkeeping or the
listener's. Its own: the replies and iopub of its own requests (`readiness`: the kernel_info probes, the
execution-count sync, the identity question), ipykernel's ``iopub_welcome``, and what the worker
publishes about no request at all (its ``starting`` status, start-up noise such as debugpy's
warnings), which goes to the kernel's log and the stderr tail instead (semantics 10).
Everything else goes to the supervisor's listener as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..messages.protocol import Frames
from ..messages.wire import Wire
from ..states import GenerationState
from .readiness import Readiness
from .resign import Resigner
from .sequence import Sequence

if TYPE_CHECKING:
    from . import Generation

# Published with no parent and still the frontend's business: the debugger's events.
_UNPARENTED_FOR_FRONTEND = frozenset({"debug_event"})


class Traffic:
    def __init__(self, generation: Generation, readiness: Readiness, resigner: Resigner | None,
                 on_message: Callable[[Generation, str, Wire], None], sequence: Sequence | None = None):
        """`sequence`: where the worker's message numbers are counted, when its iopub may drop."""
        self._generation = generation
        self._readiness = readiness
        self._resigner = resigner
        self._on_message = on_message
        self.sequence = sequence
        self.heard: Callable[[], None] | None = None  # once its link is watched (`link`)

    def outgoing(self, frames: Frames) -> Frames:
        """Frames for the worker, as the proxy would send them to a shared-key worker."""
        return self._resigner.to_worker(frames) if self._resigner is not None else frames

    def received(self, channel: str, frames: Frames) -> None:
        """Frames from the worker on `channel` (its `channels` call this, on the loop)."""
        gen = self._generation
        try:
            if self._resigner is not None:
                frames = self._resigner.from_worker(frames)
            wire = Wire.parse(frames)
            if self.heard is not None:
                self.heard()  # a message its key signed: word from it
            if self.sequence is not None:
                self.sequence.note(wire.msg_id, channel == "iopub", wire.parent_id)
        except ValueError as e:  # MalformedMessage, a bad signature, an undecodable header
            gen.log.warning("generation %d: malformed %s message dropped: %s", gen.number, channel, e)
            return
        if gen.state is not GenerationState.ENDED:  # a stale generation has no voice
            self.route(channel, wire)

    def route(self, channel: str, wire: Wire) -> None:
        """A verified message from the worker on `channel`."""
        readiness = self._readiness
        own = readiness.own_ids
        if channel == "iopub":
            if not readiness.iopub_seen:
                readiness.iopub()
            if wire.parent_id in own or wire.msg_type == "iopub_welcome":
                return
            if not wire.parent_id and wire.msg_type not in _UNPARENTED_FOR_FRONTEND:
                self._own_news(wire)
                return
        elif wire.parent_id in own:
            readiness.reply(wire)
            return
        self._on_message(self._generation, channel, wire)

    def _own_news(self, wire: Wire) -> None:
        """Published about no request (the `starting` status, start-up stderr): not the frontend's."""
        if wire.msg_type != "stream":
            return
        text = wire.content.get("text", "")
        if isinstance(text, str) and text:
            gen = self._generation
            gen.log.info("generation %d (pid %s) printed: %s", gen.number, gen.pid, text.rstrip())
            gen.target.keep(text.encode("utf-8", "replace"))
