"""CPU per trivial cell as an outside harness sees it: `python benchmarks/cpu_harness.py [--runs 3]`.

Independent of `make bench`'s own measure (`measures.trivial_cells`: blocks of 20 cells, a warm-up
cell before each block, each thread's schedstat): here klbr, plain ipykernel and a second plain
ipykernel (the A/A noise) from the same venv run at once; after `--warmup` cells each, `--cells`
trivial cells go to them taking turns cell by cell (`--block 1`), and the CPU is psutil's
user+system of the kernel process and all its descendants (with what their reaped children used),
from before the first cell to after the last, so everything the tree did meanwhile counts: the
cells, and whatever ran between them (timers, a spare, threads that ended).

Two figures explain what such a harness adds to a kernel's figure beside the cells themselves:
*idle CPU* (each kernel's tree CPU per second over `--idle` seconds with nothing sent) times the
run's wall time, spread over its cells; *per cell, idle taken off* is what is left. `--db PATH`
gives klbr a cell log of its own (a large existing one, say), else a fresh one in a temp directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import psutil
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from footprint import kernelspecs  # benchmarks/ is no package
from measures import cell_log, run_cell, scratch_dir, tree_cpu_s

KINDS = {"klbr": "klbr", "ipykernel": "python3", "ipykernel A/A": "python3-aa"}


def tree_cpu(pid: int) -> float:
    """user+system seconds of `pid` and every live descendant, their reaped children included."""
    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run(cells: int, warmup: int, block: int, idle: float, settle: float, db: str | None,
        as_bench: bool, extra: list[str]) -> dict[str, dict[str, float]]:
    env = {**os.environ, "KLBR_DB": db or str(Path(scratch_dir(prefix="klbr-harness-"), "klbr.sqlite3"))}
    with ExitStack() as stack:
        running = {}
        for label, name in KINDS.items():
            km = KernelManager(kernel_name=name)
            km.start_kernel(env=env, extra_arguments=extra)
            stack.callback(km.shutdown_kernel, now=True)
            kc = km.client()
            kc.start_channels()
            stack.callback(kc.stop_channels)
            kc.wait_for_ready(timeout=60)
            running[label] = (km.provisioner.process.pid, kc)
        for _ in range(warmup):
            for _, kc in running.values():
                run_cell(kc, "pass")
        time.sleep(settle)  # klbr's spare starts a second after its first worker: not part of any cell
        idle_rate = dict.fromkeys(running, 0.0)
        for label, (pid, _) in running.items() if idle else ():  # one at a time: the others idle too, unmeasured
            before = tree_cpu(pid)
            time.sleep(idle)
            idle_rate[label] = (tree_cpu(pid) - before) / idle
        before = {label: tree_cpu(pid) for label, (pid, _) in running.items()}
        counted = dict.fromkeys(running, 0.0)  # with --as-bench: only each block's own cells
        live = dict.fromkeys(running, 0.0)  # the same, as make bench reads it (live threads' schedstat)
        start = time.monotonic()
        order = list(running)
        for i in range(cells // block):
            for label in order[i % len(order):] + order[:i % len(order)]:
                pid, kc = running[label]
                if as_bench:  # make bench's way: an uncounted cell first, then the block counted alone
                    run_cell(kc, "pass")
                    inside, inside_live = tree_cpu(pid), tree_cpu_s(pid)
                for _ in range(block):
                    run_cell(kc, "pass")
                if as_bench:
                    counted[label] += tree_cpu(pid) - inside
                    live[label] += tree_cpu_s(pid) - inside_live
        wall = time.monotonic() - start
        figures = {}
        for label, (pid, _) in running.items():
            spent = counted[label] if as_bench else tree_cpu(pid) - before[label]
            figures[label] = {"CPU per cell (ms)": spent / cells * 1000,
                              "idle CPU (ms per s)": idle_rate[label] * 1000,
                              "per cell, idle taken off (ms)": (spent - idle_rate[label] * wall) / cells * 1000,
                              "wall per cell, all kernels (ms)": wall / cells * 1000}
            if as_bench:
                figures[label]["the same, make bench's schedstat (ms)"] = live[label] / cells * 1000
        return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cells", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--block", type=int, default=1, help="cells in a row per kernel (make bench: 20)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured per kernel")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds between the warm-up and the cells (0: klbr's spare starts during the cells)")
    ap.add_argument("--as-bench", action="store_true",
                    help="count only each block's cells, after an uncounted cell, as make bench does")
    ap.add_argument("--arg", action="append", default=[],
                    help="a command-line option for every kernel (nbclient's --HistoryManager.hist_file=:memory:)")
    ap.add_argument("--db", help="klbr's cell log (default: a fresh one)")
    ap.add_argument("--log-cells", type=int, default=0, help="give klbr a fresh log of this many cells first")
    args = ap.parse_args()
    kernelspecs()
    if args.log_cells:
        args.db = str(Path(scratch_dir(prefix="klbr-harness-log-"), "klbr.sqlite3"))
        cell_log(args.db, args.log_cells)
        print(f"a log of {args.log_cells} cells: {Path(args.db).stat().st_size / 2**20:.0f} MiB", file=sys.stderr)
    runs = [run(args.cells, args.warmup, args.block, args.idle, args.settle, args.db, args.as_bench, args.arg) for _ in range(args.runs)]
    measures = list(runs[0]["klbr"])
    print(f"| measure (median of {args.runs} runs) | " + " | ".join(KINDS) + " | klbr / ipykernel | A/A |")
    print("|---|" + "---|" * (len(KINDS) + 2))
    for m in measures:
        v = {k: statistics.median(r[k][m] for r in runs) for k in KINDS}
        print(f"| {m} | " + " | ".join(f"{v[k]:.3f}" for k in KINDS)
              + f" | {_ratio(v['klbr'], v['ipykernel'])} | {_ratio(v['ipykernel A/A'], v['ipykernel'])} |")
    cpu = "CPU per cell (ms)"
    print(f"\nklbr / ipykernel, {cpu}, each run: " + ", ".join(_ratio(r["klbr"][cpu], r["ipykernel"][cpu]) for r in runs))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"  # noqa: RUF001 — the tables' multiplication sign


if __name__ == "__main__":
    main()
