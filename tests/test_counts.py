"""Execution counts (semantics 4): no two cells of a session share an `In[n]`."""

from __future__ import annotations

from klbr_kernel.requests.counts import ExecutionCounts


def test_a_cell_answered_while_another_runs_takes_the_count_after_it():
    counts = ExecutionCounts()
    counts.from_worker(1)
    counts.reserve("running")  # sent to the worker, which will number it 2; it has not said so yet
    assert counts.answered("%klbr replay") == 3  # a replay answered meanwhile
    counts.from_worker(2)  # the worker's execute_input for the running cell
    assert counts.last == 3 and counts.catch_up() == {3: "%klbr replay"}


def test_a_cell_the_worker_never_numbered_keeps_its_reserved_count():
    counts = ExecutionCounts()
    counts.reserve("lost")  # the worker died before its execute_input
    assert counts.answered("%klbr replay") == 2
    assert counts.answered("crash()", msg_id="lost") == 1  # answered WorkerLost with its own count
    assert counts.answered("next") == 3
