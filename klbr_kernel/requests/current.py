"""The generation the proxy sends to, as the proxy sees it: its state, and what is with it or waits.

Its state (`states.LinkState`) is none until the supervisor says a generation is ready, then serving,
or serving a debug session (which ends with the generation: the frontend is told); back to none when
the supervisor says it ended. Beside that, as data: the requests sent to it and not finished
(`waiting`, by msg_id), the forwarded-at-once requests that arrived while none was ready (`held`),
the comms open on its worker, and the execute sent last (the frontend that gets a worker's stdin
request with no parent, and the closing `comm_close`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .request import Phase, Request
from .states import LINK_TRANSITIONS, LinkState, Machine

if TYPE_CHECKING:
    from klbr_supervisor.generation import Generation


class Current:
    def __init__(self) -> None:
        self.generation: Generation | None = None
        self.waiting: dict[str, Request] = {}
        self.held: list[Request] = []
        self.open_comms: set[str] = set()
        self.last_execute: Request | None = None
        self._state = Machine("current generation", LINK_TRANSITIONS, LinkState.NONE)

    @property
    def state(self) -> LinkState:
        return self._state.state

    @property
    def alive(self) -> bool:
        """Whether there is a generation to send to now (one that is ending takes nothing more)."""
        return self.generation is not None and self.generation.alive

    def ready(self, generation: Generation) -> list[Request]:
        """`generation` takes requests now (the supervisor says so); returns what was held for one."""
        self._state.move(LinkState.SERVING, f"generation {generation.number} is ready")
        self.generation = generation
        return self.take_held()

    def ended(self, why: str) -> dict[str, Request]:
        """The generation ended (or one that never served failed to start); returns the requests
        that were waiting on it. Its comms and debug session are the caller's to close first."""
        if self._state.state is not LinkState.NONE:
            self._state.move(LinkState.NONE, why)
        self.generation = None
        waiting, self.waiting = self.waiting, {}
        return waiting

    def send(self, req: Request) -> None:
        """`req` goes to the current generation now: it is SENT, and waits on it."""
        req.generation = self.generation
        req.move(Phase.SENT)
        self.waiting[req.msg_id] = req

    def hold(self, req: Request) -> None:
        """Forwarded traffic that arrived while no generation serves: it goes to the next one."""
        self.held.append(req)

    def take_held(self) -> list[Request]:
        """What was held for a generation, in order, to be sent on or answered now."""
        held, self.held = self.held, []
        return held

    def forwarded(self, req: Request) -> None:
        """comm or control traffic sent on: the comms and the debug session it opens or closes."""
        if req.msg_type == "comm_open":
            self.open_comms.add(req.content["comm_id"])
        elif req.msg_type == "comm_close":
            self.open_comms.discard(req.content["comm_id"])
        elif req.msg_type == "debug_request" and self._state.state is LinkState.SERVING:
            self._state.move(LinkState.DEBUGGING, f"debug_request {req.msg_id}")

    def forget(self, req: Request) -> None:
        """`req` waits here no more (it is answered outside its usual path)."""
        if self.waiting.get(req.msg_id) is req:
            del self.waiting[req.msg_id]
        if req in self.held:
            self.held.remove(req)
