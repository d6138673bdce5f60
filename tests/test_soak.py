"""The soak: trivial cells, worker losses (alternately `os._exit` and SIGKILL) and
interrupts of sleeping cells (alone, and beside four threads that keep the GIL busy) in one session,
on a loaded machine (two CPU-burning loops beside it). Every request gets exactly one reply and one
busy/idle pair, every interrupt ends its cell with a KeyboardInterrupt (none missed, so no worker
killed after the grace), every cell one row in the store with the status it ended with, and the
kernel process ends the session as lean as it was after its first 50 cells (each generation once
left 6 fds, 2 threads and ~0.9 MiB behind), with no process left but its two workers and the reaper.

`make test` runs it at a smaller size; at full size (2,000 cells, 100 losses, 200 interrupts; its
figures are in docs/benchmarks.md, from `benchmarks/soak.py`, which is the driver):

    KLBR_THOROUGH=1 .venv/bin/python -m pytest -m thorough tests/test_soak.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from utils import benchmark, cpu_burners, thorough


def _soak_holds(tmp_path: Path, cells: int, losses: int, interrupts: int) -> None:
    with cpu_burners(2):
        soak = benchmark("soak").run(cells, losses, interrupts, db=tmp_path / "soak.sqlite3")
    print(soak.figures())
    executes = cells + losses + interrupts
    assert soak.steps == executes
    assert not soak.wrong_answers(), soak.wrong_answers()
    assert not soak.strays, soak.strays[:5]
    assert soak.shown == "idle", "a frontend would show the kernel busy with nothing running"
    assert sum(r.kind == "interrupt" for r in soak.requests.values()) == interrupts
    assert not soak.wrong_rows(), soak.wrong_rows()
    assert soak.endings == {"lost": losses, "shutdown": 1}, soak.endings  # each loss a generation's end
    fds, threads = soak.end.fds - soak.baseline.fds, soak.end.threads - soak.baseline.threads
    rss = soak.end.rss_mib - soak.baseline.rss_mib
    assert fds <= 10 and threads <= 2 and rss <= 50, f"+{fds} fds, +{threads} threads, +{rss:.1f} MiB"
    reapers = [c for c in soak.descendants if "klbr_supervisor/boot/reaper.py" in c]
    workers = [c for c in soak.descendants if "ipykernel" in c or "klbr_supervisor.boot.worker" in c]
    assert len(reapers) == 1 and len(workers) <= 2 and len(soak.descendants) == 1 + len(workers), soak.descendants


def test_a_soak_of_cells_losses_and_interrupts_answers_everything_once_and_leaves_the_kernel_as_it_was(tmp_path):
    _soak_holds(tmp_path, cells=300, losses=30, interrupts=100)


@thorough
@pytest.mark.timeout(1800)
def test_the_full_soak_of_2000_cells_100_losses_and_200_interrupts(tmp_path):
    _soak_holds(tmp_path, cells=2000, losses=100, interrupts=200)
