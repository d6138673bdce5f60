"""The generations of one session, one after another: which one serves (`current`), the warm one
waiting to take over (`spare`), every one not yet ended (`live`), and the supervisor's state, which
says what follows a generation's end.

A `Succession` is the `Supervisor`'s (its `succession`), and owns all of that: nothing else writes
it. The supervisor's state is one of `states.SupervisorState`, grouped in `states` (HALTED, STARTS)
and changed only by `set_state`, which checks the move against `SUPERVISOR_TRANSITIONS` and logs it.
What a refusal needs (the restarts a crash loop counted, how a link was lost) is held beside the
state, as its `Refusal`. When the current generation ends, what follows is decided first (HANDING_OVER:
nothing starts meanwhile), then the listener is told, with the refusal, then the spare or a new
generation takes over, or nothing until the user says. It decides nothing the `Policy` decides (the
budget); it makes no generation itself (`launch` does, the supervisor's, which hands it back to `add`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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
    def __init__(self, *, listener: WorkerListener, policy: Policy, store: Store, host: HostService,
                 cells: CellWatch, log: logging.Logger, launch: Callable[[bool], Generation],
                 record_start: Callable[[Generation], None], standby: Callable[[], bool], kill_grace: float,
                 restart_window: float):
        """`launch(spare)` makes a generation and starts its bring-up (it calls `add`);
        `record_start(gen)` writes a generation that serves into the store; `standby()` whether a
        spare is kept now (it depends on the placement)."""
        self.state = SupervisorState.SERVING
        self.refusal: Refusal | None = None  # in a HALTED state: what requests are told
        self.current: Generation | None = None
        self.spare: Generation | None = None
        # Generations not yet ended (current, spare, and any being stopped); an ended one is let go
        # of, and only its row in the store remains.
        self.live: set[Generation] = set()
        self.tasks: Tasks | None = None  # where its background work runs, once the supervisor runs
        self._listener = listener
        self._policy = policy
        self._store = store
        self._host = host
        self._cells = cells
        self._log = log
        self._launch = launch
        self._record_start = record_start
        self._standby = standby
        self._kill_grace = kill_grace
        self._restart_window = restart_window

    @property
    def _background(self) -> Tasks:
        """Where its background work runs: set by `Supervisor.run` before any generation starts."""
        assert self.tasks is not None, "no background work before Supervisor.run"
        return self.tasks

    def add(self, gen: Generation, *, spare: bool) -> None:
        """`gen` was just made (`launch`): the spare, or the current generation."""
        self.live.add(gen)
        if spare:
            self.spare = gen
        else:
            self.current = gen

    def ensure_started(self) -> None:
        """Called by the proxy when a request waits: start a generation if none is alive or starting."""
        if self.current is None and self.state in STARTS:
            self.takeover()

    def ensure_spare(self) -> None:
        if (self._standby() and self.spare is None and self.state is not SupervisorState.STOPPING
                and self.state not in HALTED):
            self._launch(True)

    def takeover(self) -> None:
        """Make the spare current (at once if it is ready), or start a new generation."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self.current = spare
            if spare.alive:
                self._record_start(spare)
                self._listener.generation_ready(spare)
                self.ensure_spare()
            # else: still starting; its bring-up announces it, since it is current now
        else:
            self._launch(False)

    def resume(self, why: str) -> None:
        """The user asked for a generation: a crash loop or a lost link is over."""
        if self.state in HALTED:
            self.refusal = None
            self.set_state(SupervisorState.SERVING, why)

    def ended(self, gen: Generation, ending: Ending) -> None:
        """A generation's end, recorded once (its `on_end`): what follows, and the listener told."""
        (self._log.info if ending.reason in _ASKED else self._log.warning)(
            "generation %d (pid %s) ended: %s, %s", gen.number, gen.pid, ending.reason.value, ending.how)
        self.live.discard(gen)
        self._host.retire(gen.credentials, ending)
        if gen.served:
            self._store.generation_ended(gen.number, f"{ending.reason.value}: {ending.how}",
                                         gen.memory.peak if gen.memory is not None else None)
        if gen is self.spare:
            self.spare = None  # replaced at the next takeover, not in a loop now
            return
        if gen is not self.current:
            return
        self._cells.ended(gen, ending.reason)
        self.current = None
        if self.state is SupervisorState.STOPPING:
            self._listener.generation_ended(gen, ending, None)
            return
        # Decided before the listener is told, and told with it, so it can answer what waits (a
        # crash loop, a lost link, a failed start) with no call back.
        after = self._after(gen, ending)
        self.set_state(SupervisorState.HANDING_OVER, f"generation {gen.number} {ending.reason.value}")
        try:
            self._listener.generation_ended(gen, ending, self.refusal)
        finally:
            self.set_state(after, f"after generation {gen.number}")
        if after is SupervisorState.SERVING:
            self.takeover()
        # A failed start is retried by the next request (`ensure_started`), never in a loop.

    def _after(self, gen: Generation, ending: Ending) -> SupervisorState:
        """What follows the current generation's end (its `Refusal`, for a halt)."""
        if ending.reason is EndReason.START_FAILED:
            return SupervisorState.START_FAILED
        if ending.reason is EndReason.LINK_LOST:
            # Never a second kernel while the first may still run, never a silent fallback: the
            # user says what next (`%klbr reconnect`, `%klbr placement`).
            self.refusal = Refusal("placement_lost", 0, detail=f"{gen.placement}: {ending.how}")
            self._store.event("link_lost", {"generation": gen.number, "placement": gen.placement.spec,
                                            "how": ending.how})
            self.stop_spare()
            return SupervisorState.LINK_LOST
        if ending.reason in _AUTOMATIC:
            if not self._policy.may_restart():
                used = self._policy.restarts_in_window()
                self.refusal = Refusal("crash_loop", used, self._restart_window)
                self._log.error("%d new generations in %.0f s: not starting another until %%klbr restart",
                                used, self._restart_window)
                self.stop_spare()
                return SupervisorState.CRASH_LOOP
            self._policy.note_restart()
        return SupervisorState.SERVING

    def stop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None and spare.ending is None:
            self._background.start(spare.stop(EndReason.SHUTDOWN, self._kill_grace), "stopping the spare")

    def set_state(self, new: SupervisorState, why: str) -> None:
        """The only door: a move its table does not allow is a bug, raised (staying put is no move)."""
        if new is self.state:
            return
        if new not in SUPERVISOR_TRANSITIONS[self.state]:
            msg = f"supervisor: {self.state.value} -> {new.value} is not allowed"
            raise RuntimeError(msg)
        self._log.info("supervisor: %s -> %s (%s)", self.state.value, new.value, why)
        self.state = new
