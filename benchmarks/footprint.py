"""What a kernel costs in memory: `python benchmarks/footprint.py [--rounds 3] [--many 100]`.

Per process of a kernel's tree (the kernel process, the reaper, the worker, the warm spare), its PSS
and RSS from /proc/PID/smaps_rollup, after 5 trivial cells and 4 s of settling, beside plain
ipykernel from the same venv (and a second plain ipykernel kernelspec: the A/A noise); klbr as
installed, and with `--Supervisor.standby=False`, `--Supervisor.debugger=False` and both, and idle: as
installed once its spare has rested (`--Supervisor.standby_idle_timeout=2` here, 600 s by default:
what a kernel nobody has used for ten minutes costs, decision 73). One kernel
runs at a time, taking turns by round, so no kernel shares pages with another of the run. PSS
counts a page shared by N processes as 1/N to each, so a tree's total is what it adds to the
machine; RSS counts every mapped page in full.

`--many N` starts N idle kernels of each kind in `MANY` at once (all of one kind, then all of the
next) and sums every process's PSS: what N kernels cost one machine, where what is shared across
kernels (libpython, the venv's shared libraries) is counted once. Too slow for `make bench`; opt-in.

`compare.py` (make bench) calls `measure` and `table`; run alone, this prints the table (and with
`--doc PAGE` writes it between the page's `footprint:start` and `footprint:end` markers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import psutil
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measures import pid_of_worker, run_cell, scratch_dir  # benchmarks/ is no package

KINDS = {"klbr": "klbr", "klbr, standby off": "klbr-bench-nostandby",
         "klbr, debugger off": "klbr-bench-nodebugger", "klbr, debugger and standby off": "klbr-bench-lean",
         "klbr, idle": "klbr-bench-idle", "ipykernel": "python3", "ipykernel A/A": "python3-aa"}
RESTING = {"klbr-bench-idle"}  # measured once its spare has rested
MANY = ("klbr", "klbr, idle", "klbr, standby off", "ipykernel")  # --many's kinds: the debugger's cost nothing at rest
ROLES = ("kernel process", "reaper", "worker", "warm spare")


def smaps(pid: int) -> dict[str, float]:
    """PSS, its anonymous part, and RSS of `pid`, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) / 1024
    return {"PSS": fields["Pss"], "PSS anon": fields.get("Pss_Anon", float("nan")), "RSS": fields["Rss"]}


def roles(km: KernelManager, kc) -> dict[str, int]:
    """The kernel tree's processes by role: the kernel process; for klbr its reaper, the worker that
    ran the last cell and any other worker (the warm spare). A process of none (a worker's own
    child) would be counted under the kernel process's role name with its pid."""
    kernel = psutil.Process(km.provisioner.process.pid)
    found = {"kernel process": kernel.pid}
    children = kernel.children(recursive=True)
    if not children:
        return found
    worker = pid_of_worker(kc)
    for child in children:
        cmdline = " ".join(child.cmdline())
        role = ("reaper" if "reaper" in cmdline else "worker" if child.pid == worker
                else "warm spare" if "ipykernel" in cmdline or "klbr_supervisor" in cmdline
                else f"other {child.pid}")
        found[role] = child.pid
    return found


def one(name: str) -> dict[str, dict[str, float]]:
    """Start kernelspec `name`, run 5 trivial cells, settle 4 s, and read each process's memory."""
    km = KernelManager(kernel_name=name)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        for _ in range(5):
            run_cell(kc, "pass")
        time.sleep(4)  # settle: a measurement condition (klbr's spare starts a second after the first worker)
        if name in RESTING:
            rested(km, 60)
        return {role: smaps(pid) for role, pid in roles(km, kc).items()}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def tree(km: KernelManager) -> list[int]:
    """The kernel process and every process under it, by pid."""
    kernel = psutil.Process(km.provisioner.process.pid)
    return [kernel.pid, *(c.pid for c in kernel.children(recursive=True))]


def tree_pss(km: KernelManager) -> float:
    """What the kernel's tree adds to the machine: its processes' PSS, MiB."""
    return sum(smaps(pid)["PSS"] for pid in tree(km))


def workers(km: KernelManager) -> int:
    """How many worker processes a klbr kernel has running (the one serving, and a spare); one that
    has ended (a zombie until the kernel reaps it, or gone) is not counted."""
    count = 0
    for child in psutil.Process(km.provisioner.process.pid).children():
        try:
            count += child.status() != psutil.STATUS_ZOMBIE and "klbr_supervisor.boot.worker" in child.cmdline()
        except psutil.NoSuchProcess:  # ZombieProcess too
            continue
    return count


def rested(km: KernelManager, timeout: float) -> None:
    """Until the kernel's spare has rested: one worker left."""
    deadline = time.monotonic() + timeout
    while workers(km) > 1:
        if time.monotonic() > deadline:
            msg = "the spare did not rest"
            raise TimeoutError(msg)
        time.sleep(0.2)


def kernelspecs() -> None:
    """The kernelspecs the run needs beside the installed `klbr` and `python3`, in a temporary
    JUPYTER_PATH entry (compare.py may have made python3-aa already; a second copy does no harm),
    and a cell log of the run's own unless KLBR_DB names one: the user's may be one this klbr
    cannot open (a newer schema), and a kernel without its store holds less."""
    root = Path(scratch_dir(prefix="klbr-footprint-"))
    os.environ.setdefault("KLBR_DB", str(root / "klbr.sqlite3"))
    klbr = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}"]
    specs = {"klbr-bench-nostandby": [*klbr, "--Supervisor.standby=False"],
             "klbr-bench-nodebugger": [*klbr, "--Supervisor.debugger=False"],
             "klbr-bench-lean": [*klbr, "--Supervisor.debugger=False", "--Supervisor.standby=False"],
             "klbr-bench-idle": [*klbr, "--Supervisor.standby_idle_timeout=2"],
             "python3-aa": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]}
    for name, argv in specs.items():
        spec = root / "kernels" / name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("JUPYTER_PATH")]))


def measure(rounds: int) -> dict[str, dict[str, dict[str, list[float]]]]:
    """kind -> role (and "total") -> "PSS" / "PSS anon" / "RSS" -> one figure per round."""
    kernelspecs()
    results: dict[str, dict[str, dict[str, list[float]]]] = {kind: {} for kind in KINDS}
    kinds = list(KINDS.items())
    for r in range(rounds):
        for kind, name in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            tree = one(name)
            tree["total"] = {m: sum(p[m] for p in tree.values()) for m in ("PSS", "PSS anon", "RSS")}
            for role, figures in tree.items():
                for m, v in figures.items():
                    results[kind].setdefault(role, {}).setdefault(m, []).append(v)
        print(f"footprint round {r + 1}/{rounds} done", file=sys.stderr)
    return results


def table(results: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """Per process and total, PSS (its anonymous part) and RSS, medians over the rounds."""

    def cell(kind: str, role: str) -> str:
        figures = results[kind].get(role)
        if not figures:
            return "—"
        pss, anon, rss = (statistics.median(figures[m]) for m in ("PSS", "PSS anon", "RSS"))
        return f"{pss:.1f} ({anon:.1f}) / {rss:.1f}"

    plain = statistics.median(results["ipykernel"]["total"]["PSS"])
    lines = ["| process: PSS (anon) / RSS, MiB | " + " | ".join(KINDS) + " |",
             "|---|" + "---|" * len(KINDS)]
    lines += [f"| {role} | " + " | ".join(cell(k, role) for k in KINDS) + " |" for role in ROLES]
    lines.append("| **total** | " + " | ".join(cell(k, "total") for k in KINDS) + " |")
    ratios = [f"{statistics.median(results[k]['total']['PSS']) / plain:.2f}×" for k in KINDS]  # noqa: RUF001 — the tables' multiplication sign
    lines.append("| total PSS / ipykernel's | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def many(n: int) -> dict[str, float]:
    """Total PSS (MiB) of n idle kernels of each kind, all of a kind running at once."""
    kernelspecs()
    totals = {}
    for kind in MANY:
        with ExitStack() as stack:
            managers = []
            for _ in range(n):
                km = KernelManager(kernel_name=KINDS[kind])
                km.start_kernel()
                stack.callback(km.shutdown_kernel, now=True)
                kc = km.client()
                kc.start_channels()
                stack.callback(kc.stop_channels)
                kc.wait_for_ready(timeout=300)
                run_cell(kc, "pass")
                managers.append(km)
            time.sleep(10)  # settle: the last spares start
            if KINDS[kind] in RESTING:
                for km in managers:
                    rested(km, 120)
            trees = [tree(km) for km in managers]
            totals[kind] = sum(smaps(pid)["PSS"] for pids in trees for pid in pids)
        print(f"{n} idle {kind}: {totals[kind]:.0f} MiB PSS ({sum(map(len, trees))} processes)", file=sys.stderr)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--many", type=int, default=0, help="also N idle kernels of each kind at once")
    ap.add_argument("--doc", help="write the table between this page's footprint markers")
    args = ap.parse_args()
    text = table(measure(args.rounds))
    if args.many:
        totals = many(args.many)
        plain = totals["ipykernel"]
        text += (f"\n\n{args.many} idle kernels at once, total PSS: "
                 + ", ".join(f"{kind} {v:.0f} MiB ({v / plain:.2f}×)" for kind, v in totals.items()))  # noqa: RUF001 — the tables' multiplication sign
    print(text)
    if args.doc:
        into_page(Path(args.doc), text)


def into_page(page: Path, text: str) -> None:
    """`text` between the page's footprint markers, with when and where it was measured."""
    head, rest = page.read_text().split("<!-- footprint:start -->", 1)
    _, tail = rest.split("<!-- footprint:end -->", 1)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    page.write_text(f"{head}<!-- footprint:start -->\nMeasured {when} on {machine}; medians.\n\n{text}\n"
                    f"<!-- footprint:end -->{tail}")


if __name__ == "__main__":
    main()
