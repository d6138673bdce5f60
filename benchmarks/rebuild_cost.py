"""A rebuild's cost beside running the same cells directly: `make bench`'s `%klbr rebuild` row.

klbr: the cells run, the worker is killed, the next generation serves one trivial cell, then
`%klbr rebuild` is timed from its send to its reply and idle: every cell of the plan sent, recorded
(`running` before the worker sees it, its outcome committed) and reported by a progress line.
ipykernel: a fresh kernel serves one trivial cell, then the same cells are timed one after
another, each from its send to its reply and idle, as a person (or nbclient) runs them.
Run alone: `python benchmarks/rebuild_cost.py [ROUNDS]`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from measures import kernel, pid_of_worker, run_cell

PID = "import os; os.getpid()"  # the first cell: what `pid_of_worker` runs, on klbr the one the loss takes
# A notebook's setup: imports, data built, a few functions; a few milliseconds each.
CELLS = [PID, "import json, math, re, collections"] + [
    f"data{i} = [{{'k': j, 'v': math.sqrt(j), 's': str(j)}} for j in range(5000)]\n"
    f"index{i} = collections.Counter(len(d['s']) for d in data{i})" for i in range(16)
] + ["def total(rows):\n    return sum(r['v'] for r in rows)", "sizes = [total(globals()[f'data{i}']) for i in range(16)]"]
MEASURE = f"%klbr rebuild of {len(CELLS)} cells vs running them (s)"


def _gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    msg = f"worker {pid} did not end"
    raise RuntimeError(msg)


def rebuild_cost(label: str, name: str) -> float:
    """Seconds: klbr's rebuild of `CELLS`, or (any other label) running them directly on `name`."""
    if label != "klbr":
        with kernel(name) as (_, kc):
            run_cell(kc, "pass")
            return sum(run_cell(kc, code) for code in CELLS)
    with tempfile.TemporaryDirectory(prefix="klbr-bench-rebuild-") as tmp, \
            kernel(name, env={"KLBR_DB": os.path.join(tmp, "log.sqlite3")}) as (_, kc):
        pid = pid_of_worker(kc)  # runs CELLS[0]
        for code in CELLS[1:]:
            run_cell(kc, code)
        os.kill(pid, 9)
        _gone(pid)
        run_cell(kc, "pass")  # the next generation serves, as the other kernel does
        seconds = run_cell(kc, "%klbr rebuild")
        _rebuilt(kc)
        return seconds


def _rebuilt(kc) -> None:
    """The rebuild did what it is timed for: the last cell's result is in the namespace."""
    msg_id = kc.execute("len(sizes)")
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    if reply["content"]["status"] != "ok":
        msg = f"the rebuild did not rebuild: {reply['content'].get('evalue')}"
        raise RuntimeError(msg)


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    got: dict[str, list[float]] = {"klbr": [], "ipykernel": []}
    for r in range(rounds):
        for label, name in ([("klbr", "klbr"), ("ipykernel", "python3")][:: 1 if r % 2 == 0 else -1]):
            got[label].append(rebuild_cost(label, name))
    k, ip = statistics.median(got["klbr"]), statistics.median(got["ipykernel"])
    print(f"{MEASURE}: klbr {k:.3f}, ipykernel {ip:.3f}, {k / ip:.2f}x ({rounds} rounds; {got})")
