"""What the proxy process itself costs per trivial cell.

CPU of the kernel process alone (every thread of it, from /proc/PID/task/*/schedstat, nanoseconds),
over thousands of trivial cells, klbr, plain ipykernel and the hop floor (ipykernel behind
`forwarder.py`, a C-level ZMQ forwarder: what any proxy process costs here, with no Python per
message) taking turns in blocks so drift on the machine hits all alike. Plain ipykernel's CPU per
cell (its kernel process is the whole kernel) is beside them, and the proxy's and the forwarder's
as a share of it.

With --callgrind, the deterministic figure for an A/B of one change: instructions the proxy process
executes per trivial cell (every thread of it; the workers, its children, run natively and are not
counted), the kernel run under valgrind's callgrind. After warm-up cells and a pause for the
standby worker to start, the counters are zeroed (`callgrind_control -z`), a fixed number of
trivial cells run, and the counters are dumped (`callgrind_control -d`): load on the machine slows
the run but does not change the count. (valgrind answers ENOSYS for pidfd_open; the kernel then
takes the portable way, `klbr_supervisor.system.watch`: a thread in each worker's wait, which costs
nothing per cell, and its parent's pid asked five times a second, a timer and a system call, not a
cell's.) `make bench-deps` installs valgrind.

--placement SPEC runs klbr's workers there (`--Supervisor.placement=SPEC`); `kernelspec:python3-aa`
names a copy of plain ipykernel's kernelspec that this script provides: the re-signing path.

    .venv/bin/python benchmarks/proxy_cost.py [--cells 3000] [--repeat N] [--placement SPEC]
    .venv/bin/python benchmarks/proxy_cost.py --callgrind [--cells 200] [--repeat N] [--placement SPEC]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from jupyter_client.manager import KernelManager

from measures import kernel, process_cpu_ns, rotated, run_cell, scratch_dir


def kernelspecs(placement: str | None) -> None:
    """On JUPYTER_PATH: klbr as this run asks for it (`klbr-cost`), a copy of plain ipykernel
    (`python3-aa`, for `kernelspec:python3-aa`) and the hop floor (`klbr-cost-floor`)."""
    root = Path(scratch_dir(prefix="klbr-proxy-cost-specs-"))
    klbr = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}"]
    for name, argv in (("klbr-cost", klbr + ([f"--Supervisor.placement={placement}"] if placement else [])),
                       ("python3-aa", [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]),
                       ("klbr-cost-floor", [sys.executable, str(Path(__file__).with_name("forwarder.py")),
                                            "-f", "{connection_file}"])):
        (root / "kernels" / name).mkdir(parents=True)
        (root / "kernels" / name / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": name, "language": "python", "interrupt_mode": "message"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("JUPYTER_PATH")])])


def proc_mode(cells: int, block: int) -> dict[str, float]:
    """Kernel-process CPU per trivial cell (ms), klbr's, plain ipykernel's and the hop floor's,
    taking turns."""
    kernels = {"klbr": "klbr-cost", "ipykernel": "python3", "hop floor": "klbr-cost-floor"}
    spent = dict.fromkeys(kernels, 0)
    done = dict.fromkeys(kernels, 0)
    with kernel("klbr-cost") as klbr, kernel("python3") as plain, kernel("klbr-cost-floor") as floor:
        running = {"klbr": klbr, "ipykernel": plain, "hop floor": floor}
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
            "hop floor process CPU per trivial cell (ms)": per_cell["hop floor"],
            "proxy share of ipykernel's CPU per cell": per_cell["klbr"] / per_cell["ipykernel"],
            "hop floor share of ipykernel's CPU per cell": per_cell["hop floor"] / per_cell["ipykernel"]}


@contextmanager
def under_callgrind(workdir: Path, placement: str | None):
    """A klbr kernel whose proxy process runs under callgrind (its children natively), and the
    directory its dumps are written to."""
    spec = workdir / "kernels" / "klbr-callgrind"
    spec.mkdir(parents=True)
    placed = [f"--Supervisor.placement={placement}"] if placement else []
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["valgrind", "--quiet", "--tool=callgrind", "--trace-children=no", "--vgdb=yes",
                 f"--callgrind-out-file={workdir}/callgrind.out.%p",
                 sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}", *placed],
        "display_name": "klbr under callgrind", "language": "python", "interrupt_mode": "message",
    }))
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(workdir), *filter(None, [os.environ.get("JUPYTER_PATH")])])
    km = KernelManager(kernel_name="klbr-callgrind")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=600)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def dumped_instructions(workdir: Path, pid: int) -> int:
    """Instructions counted since the last zeroing, from the dump `callgrind_control -d` just wrote."""
    dumps = sorted(workdir.glob(f"callgrind.out.{pid}.*"), key=lambda p: p.stat().st_mtime)
    text = dumps[-1].read_text()
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        msg = f"no instruction total in {dumps[-1]}"
        raise RuntimeError(msg)
    return int(found.group(1))


def callgrind_mode(cells: int, warmup: int, placement: str | None) -> dict[str, float]:
    """Instructions of the proxy process per trivial cell over `cells` cells."""
    control = shutil.which("callgrind_control")
    if shutil.which("valgrind") is None or control is None:
        msg = "valgrind is not installed: make bench-deps"
        raise SystemExit(msg)
    workdir = Path(scratch_dir(prefix="klbr-callgrind-"))
    try:
        with under_callgrind(workdir, placement) as (km, kc):
            pid = km.provisioner.process.pid
            for _ in range(warmup):
                run_cell(kc, "pass")
            time.sleep(10)  # the standby worker starts a second after the first generation is ready
            run_cell(kc, "pass")
            subprocess.run([control, "-z", str(pid)], check=True, capture_output=True)  # noqa: S603 — valgrind's tool, our kernel's pid
            for _ in range(cells):
                run_cell(kc, "pass")
            subprocess.run([control, "-d", str(pid)], check=True, capture_output=True)  # noqa: S603 — valgrind's tool, our kernel's pid
            total = dumped_instructions(workdir, pid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"cells": cells, "klbr proxy process instructions per trivial cell": round(total / cells)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per cell of the proxy process under callgrind, instead of CPU time")
    ap.add_argument("--cells", type=int, help="trivial cells measured per kernel (3000; 200 with --callgrind)")
    ap.add_argument("--warmup", type=int, default=50, help="with --callgrind: cells run before counting")
    ap.add_argument("--block", type=int, default=100, help="cells per turn")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the median of each figure is printed too")
    ap.add_argument("--placement", help="klbr's workers there (kernelspec:python3-aa: plain ipykernel, re-signed)")
    args = ap.parse_args()
    kernelspecs(args.placement)
    # A cell log of its own: the default file may be another klbr's, of a schema this one cannot
    # write, and an unrecorded kernel would leave the store's cost out of the figure.
    os.environ.setdefault("KLBR_DB", os.path.join(scratch_dir(prefix="klbr-proxy-cost-"), "klbr.sqlite3"))
    runs = []
    for _ in range(args.repeat):
        if args.callgrind:
            runs.append(callgrind_mode(args.cells or 200, args.warmup, args.placement))
        else:
            runs.append(proc_mode(args.cells or 3000, args.block))
        print(json.dumps(runs[-1]), flush=True)
    if args.repeat > 1:
        print("median:", json.dumps({k: statistics.median(r[k] for r in runs) for k in runs[0]}))


if __name__ == "__main__":
    main()
