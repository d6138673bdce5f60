"""What the proxy process itself costs per trivial cell.

CPU of the kernel process alone (every thread of it, from
/proc/PID/task/*/schedstat, nanoseconds), over thousands of trivial cells, klbr and plain ipykernel
taking turns in blocks so drift on the machine hits both alike; plain ipykernel's CPU per cell (its
kernel process is the whole kernel) beside it, and the proxy's as a share of it.

A deterministic mode under valgrind's callgrind is not here: valgrind 3.19 (Debian's) does not
implement pidfd_open, which the supervisor watches every worker with, so no generation starts.

    .venv/bin/python benchmarks/proxy_cost.py [--cells 3000] [--repeat N]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
from pathlib import Path

from measures import kernel, rotated, run_cell


def process_cpu_ns(pid: int) -> int:
    """CPU nanoseconds used so far by every live thread of `pid` (not its children)."""
    total = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(Path(stat).read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def proc_mode(cells: int, block: int) -> dict[str, float]:
    """Kernel-process CPU per trivial cell (ms), klbr's and plain ipykernel's, taking turns."""
    kernels = {"klbr": "klbr", "ipykernel": "python3"}
    spent = dict.fromkeys(kernels, 0)
    done = dict.fromkeys(kernels, 0)
    with kernel("klbr") as klbr, kernel("python3") as plain:
        running = {"klbr": klbr, "ipykernel": plain}
        for b in range(max(1, cells // block)):
            for label in rotated(dict.fromkeys(kernels, ""), b):
                km, kc = running[label]
                pid = km.provisioner.process.pid
                run_cell(kc, "pass")  # the previous turn's background work settles first
                before = process_cpu_ns(pid)
                for _ in range(block):
                    run_cell(kc, "pass")
                spent[label] += process_cpu_ns(pid) - before
                done[label] += block
    per_cell = {label: spent[label] / done[label] / 1e6 for label in kernels}
    return {"cells per kernel": done["klbr"],
            "klbr proxy process CPU per trivial cell (ms)": per_cell["klbr"],
            "ipykernel CPU per trivial cell (ms)": per_cell["ipykernel"],
            "proxy share of ipykernel's CPU per cell": per_cell["klbr"] / per_cell["ipykernel"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=3000, help="trivial cells measured per kernel")
    ap.add_argument("--block", type=int, default=100, help="cells per turn")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the median of each figure is printed too")
    args = ap.parse_args()
    # A cell log of its own: the default file may be another klbr's, of a schema this one cannot
    # write, and an unrecorded kernel would leave the store's cost out of the figure.
    os.environ.setdefault("KLBR_DB", os.path.join(tempfile.mkdtemp(prefix="klbr-proxy-cost-"), "klbr.sqlite3"))
    runs = []
    for _ in range(args.repeat):
        runs.append(proc_mode(args.cells, args.block))
        print(json.dumps(runs[-1]), flush=True)
    if args.repeat > 1:
        print("median:", json.dumps({k: statistics.median(r[k] for r in runs) for k in runs[0]}))


if __name__ == "__main__":
    main()
