"""Many kernels, one file, with a third process taking the write lock, small: the
measure itself is `benchmarks/many_kernels.py` (50 kernels x 200 cells); this runs its code with 6
kernels x 50 cells and asserts what must hold at any size: no cell lost, and no error reply caused by
the lock (a locked file makes a cell wait, never fail)."""

from __future__ import annotations

from utils import benchmark


def test_six_kernels_on_one_file_lose_no_cell_while_another_process_takes_its_write_lock(tmp_path):
    # The first 2 s hold starts before the first cell, the next ones at random moments 0.5-3 s apart.
    result = benchmark("many_kernels").run(6, 50, db=tmp_path / "shared.sqlite3", workdir=tmp_path, gap=(0.5, 3.0))
    print(result.figures())
    assert result.holds
    assert not result.lost, result.lost
    assert not result.error_replies, result.error_replies
    assert not result.log_errors, result.log_errors
    assert result.replies == 6 * 50
    assert len(result.writes) == 6 * 51  # every cell timed: each kernel's first cell, then its 50
