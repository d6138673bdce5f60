"""The supervisor's policy walked with a fake clock: no kernel, no I/O. The interrupt ladder is also
walked as the supervisor carries it out (`CellWatch`), on an event loop, with a stand-in generation."""

import asyncio
import logging
import time

from klbr_supervisor.cell_watch import RESEND, CellWatch
from klbr_supervisor.policy import Policy
from klbr_supervisor.states import EndReason
from klbr_supervisor.tasks import Tasks


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_deadline_resolution_cell_then_session_then_config():
    p = Policy(cell_timeout=600, clock=FakeClock())
    assert p.timeout_for() == 600
    p.session_timeout = 30
    assert p.timeout_for() == 30
    assert p.timeout_for(5) == 5
    assert p.timeout_for(0) is None  # %%klbr timeout=0: no limit for this cell
    p.session_timeout = 0
    assert p.timeout_for() is None
    assert Policy(clock=FakeClock()).deadline_for() is None


def test_deadline_pauses_while_waiting_for_input():
    clock = FakeClock()
    d = Policy(clock=clock).deadline_for(10)
    clock.now += 4
    d.pause()
    clock.now += 100  # the user takes their time answering input()
    assert d.remaining() == 6
    d.resume()
    clock.now += 5
    assert d.remaining() == 1


class StandIn:
    """What the ladder asks of a generation: its number, whether it is ending, `interrupt` and `stop`."""

    number = 1

    def __init__(self):
        self.ending = None
        self.stopped: list[tuple[EndReason, float]] = []
        self.interrupts: list[float] = []  # when each interrupt went to its worker

    def mark_busy(self, busy: bool) -> None:
        pass

    async def interrupt(self) -> None:
        self.interrupts.append(time.monotonic())

    async def stop(self, reason: EndReason, grace: float) -> None:
        self.stopped.append((reason, time.monotonic()))
        self.ending = reason


def _interrupt(grace: float, *, ends_in_time: bool) -> tuple[list, float]:
    """A running cell interrupted, and ended at once or never: how its generation was stopped, and
    when the interrupt went out. Returns once the ladder has done all it will do."""
    generation = StandIn()

    async def walk() -> float:
        log = logging.getLogger("test-ladder")
        watch = CellWatch(Policy(interrupt_grace=grace), kill_grace=0.1, log=log, on_finished=lambda cell: None)
        async with asyncio.TaskGroup() as group:  # ends when the ladder's task has
            watch.tasks = Tasks(group, log)
            watch.sent("cell", "while True: pass", generation, None, None)
            watch.started("cell")
            watch.began("cell")
            interrupted = time.monotonic()
            await watch.interrupt(generation)
            if ends_in_time:
                watch.finished("cell")  # its reply came: an interrupted cell that ended
        return interrupted

    interrupted = asyncio.run(walk())
    return generation.stopped, interrupted


def test_interrupt_ladder_kills_after_the_grace():
    p = Policy(interrupt_grace=3, clock=FakeClock())
    assert p.kill_at(50.0) == 53.0
    # As carried out: a cell that does not end is killed (WorkerKilled), not before the grace ...
    stopped, interrupted = _interrupt(0.5, ends_in_time=False)
    assert [reason for reason, _ in stopped] == [EndReason.KILLED]
    assert stopped[0][1] - interrupted >= 0.5
    # ... and one that ends within it keeps its worker and namespace.
    stopped, _ = _interrupt(0.5, ends_in_time=True)
    assert stopped == []


def _walk(steps) -> StandIn:
    """`steps(watch, generation)` walked with a ladder of 0.5 s grace; returns once the ladder is done."""
    generation = StandIn()

    async def walk() -> None:
        log = logging.getLogger("test-ladder")
        watch = CellWatch(Policy(interrupt_grace=0.5), kill_grace=0.1, log=log, on_finished=lambda cell: None)
        async with asyncio.TaskGroup() as group:
            watch.tasks = Tasks(group, log)
            await steps(watch, generation)

    asyncio.run(walk())
    return generation


async def _until(check) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


def _a_cell_that_began(watch: CellWatch, generation: StandIn) -> None:
    """A cell run to its end on `generation`, its execute_input seen."""
    watch.sent("earlier", "1", generation, None, None)
    watch.started("earlier")
    watch.began("earlier")
    watch.finished("earlier")


def test_an_interrupt_waits_for_its_cell_to_begin_and_the_grace_counts_from_then():
    """ipykernel ignores SIGINT until it runs the cell (its execute_input): an interrupt asked for
    before goes out then, and the kill comes a grace after that, not after the request."""
    began: list[float] = []

    async def steps(watch: CellWatch, generation: StandIn) -> None:
        _a_cell_that_began(watch, generation)  # its worker is seen to publish execute_input
        watch.sent("cell", "while True: pass", generation, None, None)
        watch.started("cell")  # busy: ipykernel has not installed its handler yet
        await watch.interrupt(generation)
        await watch.interrupt(generation)  # pressed twice: still one interrupt, when it can land
        await asyncio.sleep(0.3)  # within the grace: nothing goes before the cell begins
        assert generation.interrupts == [] and generation.stopped == []
        began.append(time.monotonic())
        watch.began("cell")

    generation = _walk(steps)
    assert len(generation.interrupts) == 1 and generation.interrupts[0] >= began[0]
    assert [reason for reason, _ in generation.stopped] == [EndReason.KILLED]
    assert generation.stopped[0][1] - generation.interrupts[0] >= 0.5


def test_a_cell_that_never_begins_gets_its_interrupt_a_grace_after_the_request_and_is_killed():
    """A worker that hung as the cell began, holding the GIL, publishes nothing more (not even the
    execute_input the interrupt waits for): it goes a grace after the request, and the kill a grace later."""
    asked: list[float] = []

    async def steps(watch: CellWatch, generation: StandIn) -> None:
        _a_cell_that_began(watch, generation)  # its worker is seen to publish execute_input
        watch.sent("cell", "hang()", generation, None, None)
        watch.started("cell")
        asked.append(time.monotonic())
        await watch.interrupt(generation)

    generation = _walk(steps)
    assert len(generation.interrupts) == 1 and generation.interrupts[0] - asked[0] >= 0.5
    assert [reason for reason, _ in generation.stopped] == [EndReason.KILLED]
    assert generation.stopped[0][1] - generation.interrupts[0] >= 0.5


def test_on_a_worker_never_seen_to_publish_execute_input_an_interrupt_goes_a_grace_after_busy():
    """A kernelspec's kernel may publish no execute_input: its interrupt still goes, late."""
    busy: list[float] = []

    async def steps(watch: CellWatch, generation: StandIn) -> None:
        watch.sent("cell", "while True: pass", generation, None, None)
        await watch.interrupt(generation)
        busy.append(time.monotonic())
        watch.started("cell")

    generation = _walk(steps)
    assert len(generation.interrupts) == 1 and generation.interrupts[0] - busy[0] >= 0.5
    assert [reason for reason, _ in generation.stopped] == [EndReason.KILLED]


def test_an_interrupt_for_a_cell_that_ends_before_it_begins_does_nothing_to_the_next():
    async def steps(watch: CellWatch, generation: StandIn) -> None:
        watch.sent("first", "1", generation, None, None)
        await watch.interrupt(generation)
        watch.finished("first")  # aborted, say: it never began
        watch.sent("second", "2", generation, None, None)
        watch.started("second")
        watch.began("second")
        watch.finished("second")

    generation = _walk(steps)
    assert generation.interrupts == [] and generation.stopped == []


def test_a_silent_cells_interrupt_goes_at_its_busy_and_once_more_unless_it_ended():
    """A silent execute publishes no execute_input: its interrupt goes at its busy (ipykernel installs
    its handler right after) and again `RESEND` later if the cell is still running."""
    async def runs_on(watch: CellWatch, generation: StandIn) -> None:
        watch.sent("cell", "while True: pass", generation, None, None, silent=True)
        await watch.interrupt(generation)
        assert generation.interrupts == []
        watch.started("cell")

    generation = _walk(runs_on)
    assert len(generation.interrupts) == 2 and generation.interrupts[1] - generation.interrupts[0] >= RESEND
    assert [reason for reason, _ in generation.stopped] == [EndReason.KILLED]

    async def ends(watch: CellWatch, generation: StandIn) -> None:
        watch.sent("cell", "while True: pass", generation, None, None, silent=True)
        await watch.interrupt(generation)
        watch.started("cell")
        await _until(lambda: generation.interrupts)
        watch.finished("cell")  # the first landed

    generation = _walk(ends)
    assert len(generation.interrupts) == 1 and generation.stopped == []


def test_restart_budget_is_per_window():
    clock = FakeClock()
    p = Policy(restart_limit=2, restart_window=60, clock=clock)
    assert p.may_restart()
    p.note_restart()
    clock.now += 10
    p.note_restart()
    assert not p.may_restart() and p.restarts_in_window() == 2
    clock.now += 51  # the first restart leaves the window
    assert p.may_restart() and p.restarts_in_window() == 1
    p.note_restart()
    p.reset_restarts()
    assert p.may_restart()


def test_poison_refuses_the_third_try_of_the_same_code():
    p = Policy(poison_after=2, clock=FakeClock())
    code = "import os; os._exit(1)"
    p.note_outcome(code, lost=True)
    assert not p.is_poisoned(code)
    p.note_outcome(code, lost=True)
    assert p.is_poisoned(code)
    assert not p.is_poisoned(code + " ")  # changed code runs
    p.clear_poison()  # %klbr restart
    assert not p.is_poisoned(code)


def test_poison_counts_only_losses_in_a_row():
    p = Policy(poison_after=2, clock=FakeClock())
    code = "crash()"
    p.note_outcome(code, lost=True)
    p.note_outcome("fine()", lost=True)  # another cell lost in between
    p.note_outcome(code, lost=True)
    assert not p.is_poisoned(code)
    p.note_outcome(code, lost=True)
    assert p.is_poisoned(code)
    p.note_outcome("x = 1", lost=False)  # a cell that ended normally clears it
    assert not p.is_poisoned(code)
