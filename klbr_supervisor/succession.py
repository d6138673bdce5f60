"""What follows a generation's end: the supervisor's state, decided first, then the listener told,
then the spare or a new generation taking over (or nothing, until the user says).

Part of the `Supervisor` (a base class, as `SupervisorSettings` is): its state is one of
`states.SupervisorState`, grouped in `states` (HALTED, STARTS) and changed only by `_set_state`,
which checks the move against `SUPERVISOR_TRANSITIONS` and logs it. What a refusal needs (the
restarts a crash loop counted, how a link was lost) is held beside the state, as its `Refusal`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .policy import Policy, Refusal
from .states import HALTED, STARTS, SUPERVISOR_TRANSITIONS, Ending, EndReason, SupervisorState

if TYPE_CHECKING:
    from .cell_watch import CellWatch
    from .generation import Generation
    from .host import HostService
    from .listener import WorkerListener
    from .store import Store
    from .tasks import Tasks

# Endings that count against the restart budget: the worker went away without being asked to.
_AUTOMATIC = frozenset({EndReason.LOST, EndReason.KILLED, EndReason.DEADLINE})
# Asked for: news, not a warning in the server's log at every exit.
_ASKED = frozenset({EndReason.SHUTDOWN, EndReason.RESTART, EndReason.RELOCATED})


class Succession:
    # What it shares with the rest of the `Supervisor`.
    state: SupervisorState
    _refusal: Refusal | None  # in a HALTED state: what requests are told
    current: Generation | None
    spare: Generation | None
    _live: set[Generation]
    listener: WorkerListener
    policy: Policy
    store: Store
    host: HostService
    cells: CellWatch
    log: logging.Logger
    _tasks: Tasks | None
    kill_grace: float
    restart_window: float
    standby_on: bool

    @property
    def _background(self) -> Tasks:
        """Where its background work runs: set by `Supervisor.run` before any generation starts."""
        assert self._tasks is not None, "no background work before Supervisor.run"
        return self._tasks

    def _launch(self, *, spare: bool) -> Generation:
        raise NotImplementedError  # the Supervisor's

    def _record_start(self, gen: Generation) -> None:
        raise NotImplementedError  # the Supervisor's

    def ensure_started(self) -> None:
        """Called by the proxy when a request waits: start a generation if none is alive or starting."""
        if self.current is None and self.state in STARTS:
            self._takeover()

    def _ensure_spare(self) -> None:
        if (self.standby_on and self.spare is None and self.state is not SupervisorState.STOPPING
                and self.state not in HALTED):
            self._launch(spare=True)

    def _takeover(self) -> None:
        """Make the spare current (at once if it is ready), or start a new generation."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self.current = spare
            if spare.alive:
                self._record_start(spare)
                self.listener.generation_ready(spare)
                self._ensure_spare()
            # else: still starting; `_bring_up` announces it, since it is current now
        else:
            self._launch(spare=False)

    def _resume(self, why: str) -> None:
        """The user asked for a generation: a crash loop or a lost link is over."""
        if self.state in HALTED:
            self._refusal = None
            self._set_state(SupervisorState.SERVING, why)

    def _ended(self, gen: Generation, ending: Ending) -> None:
        (self.log.info if ending.reason in _ASKED else self.log.warning)(
            "generation %d (pid %s) ended: %s, %s", gen.number, gen.pid, ending.reason.value, ending.how)
        self._live.discard(gen)
        self.host.retire(gen.credentials, ending)
        if gen.served:
            self.store.generation_ended(gen.number, f"{ending.reason.value}: {ending.how}",
                                        gen.memory.peak if gen.memory is not None else None)
        if gen is self.spare:
            self.spare = None  # replaced at the next takeover, not in a loop now
            return
        if gen is not self.current:
            return
        self.cells.ended(gen, ending.reason)
        self.current = None
        if self.state is SupervisorState.STOPPING:
            self.listener.generation_ended(gen, ending, None)
            return
        # Decided before the listener is told, and told with it, so it can answer what waits (a
        # crash loop, a lost link, a failed start) with no call back.
        after = self._after(gen, ending)
        self._set_state(SupervisorState.HANDING_OVER, f"generation {gen.number} {ending.reason.value}")
        try:
            self.listener.generation_ended(gen, ending, self._refusal)
        finally:
            self._set_state(after, f"after generation {gen.number}")
        if after is SupervisorState.SERVING:
            self._takeover()
        # A failed start is retried by the next request (`ensure_started`), never in a loop.

    def _after(self, gen: Generation, ending: Ending) -> SupervisorState:
        """What follows the current generation's end (its `Refusal`, for a halt)."""
        if ending.reason is EndReason.START_FAILED:
            return SupervisorState.START_FAILED
        if ending.reason is EndReason.LINK_LOST:
            # Never a second kernel while the first may still run, never a silent fallback: the
            # user says what next (`%klbr reconnect`, `%klbr placement`).
            self._refusal = Refusal("placement_lost", 0, detail=f"{gen.placement}: {ending.how}")
            self.store.event("link_lost", {"generation": gen.number, "placement": gen.placement.spec,
                                           "how": ending.how})
            self._stop_spare()
            return SupervisorState.LINK_LOST
        if ending.reason in _AUTOMATIC:
            if not self.policy.may_restart():
                used = self.policy.restarts_in_window()
                self._refusal = Refusal("crash_loop", used, self.restart_window)
                self.log.error("%d new generations in %.0f s: not starting another until %%klbr restart",
                               used, self.restart_window)
                self._stop_spare()
                return SupervisorState.CRASH_LOOP
            self.policy.note_restart()
        return SupervisorState.SERVING

    def _stop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self._background.start(spare.stop(EndReason.SHUTDOWN, self.kill_grace), "stopping the spare")

    def _set_state(self, new: SupervisorState, why: str) -> None:
        """The only door: a move its table does not allow is a bug, raised (staying put is no move)."""
        if new is self.state:
            return
        if new not in SUPERVISOR_TRANSITIONS[self.state]:
            msg = f"supervisor: {self.state.value} -> {new.value} is not allowed"
            raise RuntimeError(msg)
        self.log.info("supervisor: %s -> %s (%s)", self.state.value, new.value, why)
        self.state = new
