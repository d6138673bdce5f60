"""What a generation's worker says, sorted: the generation's own bookkeeping, or the listener's.

Its own: the replies and iopub of its own requests (`readiness`: the kernel_info probes, the
execution-count sync, the identity question), ipykernel's ``iopub_welcome``, and what the worker
publishes about no request at all (its ``starting`` status, start-up noise such as debugpy's
warnings), which goes to the kernel's log and the stderr tail instead (DESIGN.md semantics 10).
Everything else goes to the supervisor's listener as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .readiness import Readiness
from .wire import Wire

if TYPE_CHECKING:
    from .generation import Generation

# Published with no parent and still the frontend's business: the debugger's events.
_UNPARENTED_FOR_FRONTEND = frozenset({"debug_event"})


class Traffic:
    def __init__(self, generation: Generation, readiness: Readiness,
                 on_message: Callable[[Generation, str, Wire], None]):
        self._generation = generation
        self._readiness = readiness
        self._on_message = on_message

    def route(self, channel: str, wire: Wire) -> None:
        """A verified message from the worker on `channel`."""
        readiness = self._readiness
        own = readiness.own_ids
        if channel == "iopub":
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
