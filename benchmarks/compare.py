"""klbr against plain ipykernel, side by side in one run: `make bench`.

Every measure runs interleaved (klbr, ipykernel, ipykernel again as an A/A check of the noise) in
rounds, so drift on the machine hits all alike. Prints medians and the ratio klbr / ipykernel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import footprint
from measures import (
    PROCESS_CPU,
    eight_at_once,
    host_calls,
    kernel,
    memory_sample_us,
    million_cell_listing,
    nbclient_100,
    pid_of_worker,
    placement_first_cell,
    recovery,
    replay_10k,
    rotated,
    rss_mib,
    run_cell,
    scratch_dir,
    startup,
    store_cost,
    trivial_cells,
)
from rebuild_cost import MEASURE as REBUILD
from rebuild_cost import rebuild_cost

KERNELS = {"klbr": "klbr", "ipykernel": "python3", "ipykernel A/A": "python3-aa"}
# Not klbr, for reading its trivial-cell ratio: what a proxy process costs at the least (ipykernel
# behind a C-level forwarder), and ipykernel started as klbr starts its workers (no IPython history db).
EXPLAIN = {"hop floor": "klbr-bench-floor", "ipykernel, no history db": "python3-nohist",
           "klbr, re-signed (kernelspec:)": "klbr-bench-resigned"}
# `python:` placement's other interpreter: a venv with ipykernel only (`make bench` builds it).
OTHER_PYTHON = Path(__file__).resolve().parent.parent / ".venv-ipykernel" / "bin" / "python"
PLACED = "%klbr placement python: → first cell (s)"
# ssh:// to 127.0.0.1 (a throwaway sshd, as the tests start it), against plain ipykernel reached
# through the same kind of ssh Unix socket forwards (`forwarder.py --ssh`): "ipykernel" in those rows.
SSH = {"klbr": "klbr-bench-ssh", "ipykernel": "klbr-bench-ssh-floor", "ipykernel A/A": "klbr-bench-ssh-floor"}
# docker:// (a private dockerd and the test image, as the tests start them) and slurm:// (a one-node
# cluster on 127.0.0.1), each against plain ipykernel run the same way behind the hop floor
# (`forwarder.py --docker`: in a container, ipc sockets in a mount; `--srun`: a job step, TCP + CURVE).
ENGINES = {"docker://": {"klbr": "klbr-bench-docker", "ipykernel": "klbr-bench-docker-floor",
                         "ipykernel A/A": "klbr-bench-docker-floor"},
           "slurm://": {"klbr": "klbr-bench-slurm", "ipykernel": "klbr-bench-slurm-floor",
                        "ipykernel A/A": "klbr-bench-slurm-floor"}}
# What klbr aims at, beside its measure: as fast as plain ipykernel per cell, every cell durable (a
# ratio to plain ipykernel; for the proxy's own CPU, an absolute figure). `run` adds the output rows.
RESIGNED_CELL = "trivial cell p50, klbr re-signed (kernelspec:) (ms)"
TARGETS = {"trivial cell p50 (ms)": 1.00, "trivial cell p99 (ms)": 1.10,
           "CPU per trivial cell, kernel and workers (ms)": 1.00, PROCESS_CPU: "0.4 ms",
           RESIGNED_CELL: 1.10, "ssh:// trivial cell p50 (ms)": 1.10, PLACED: 1.10,
           "docker:// start → first cell (s)": 1.10, "docker:// trivial cell p50 (ms)": 1.10,
           "slurm:// start → first cell (s)": 1.10, "slurm:// trivial cell p50 (ms)": 1.10,
           "8 kernels × 200 cells at once (s)": 1.05, "nbclient, 100-cell notebook (s)": 1.00}  # noqa: RUF001 — the tables' multiplication sign
TARGETS[REBUILD] = 1.05  # the way back after a loss, beside running the same cells by hand
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from dockerd import DOCKER, Dockerd, klbr_image
from slurm import Cluster
from sshd import Sshd


def _engine_kernelspecs(root: str, dockerd: Dockerd, image: str, cluster: Cluster) -> None:
    """klbr on docker:// and slurm://, and the floors it is read against; the engines' addresses in
    the environment every kernel inherits (DOCKER_HOST, SLURM_CONF)."""
    os.environ.update({"DOCKER_HOST": dockerd.host, **cluster.environ})
    klbr = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}", f"--Supervisor.docker_command={DOCKER}"]
    forwarder = [sys.executable, str(Path(__file__).with_name("forwarder.py")), "-f", "{connection_file}"]
    for name, argv in (("klbr-bench-docker", [*klbr, f"--Supervisor.placement=docker://{image}"]),
                       ("klbr-bench-docker-floor", [*forwarder, "--docker", f"{DOCKER},-H,{dockerd.host}", image]),
                       ("klbr-bench-slurm", [*klbr, f"--Supervisor.placement=slurm://?python={sys.executable}",
                                             "--HostService.tcp_ip=127.0.0.1"]),
                       ("klbr-bench-slurm-floor", [*forwarder, "--srun", "srun", sys.executable])):
        spec = Path(root, "kernels", name)
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": name, "language": "python", "interrupt_mode": "message"}))


def engine_round(args, r: int, code: str, add) -> None:
    """One round of the docker:// and slurm:// rows: start → first cell, trivial cells, the big output."""
    for engine, kernels in ENGINES.items():
        placed_round(engine, kernels, args, r, code, add)


def placed_round(prefix: str, kernels: dict[str, str], args, r: int, code: str, add, also=None) -> None:
    """One round of a placement's rows (`prefix`: ssh://, docker://, slurm://): start → first cell,
    trivial cells, the big output; `also(running)` then, with each kernel still running."""
    order = rotated(kernels, r)
    for label, name in order.items():
        add(label, f"{prefix} start → first cell (s)", startup(name)[1])

    def add_cell(label: str, measure: str, value: float) -> None:
        if measure == "trivial cell (ms)":
            add(label, f"{prefix} trivial cell p50 (ms)", value)

    trivial_cells(order, args.cells, add_cell)
    with ExitStack() as stack:
        running = {label: stack.enter_context(kernel(name)) for label, name in order.items()}
        for _, kc in running.values():
            run_cell(kc, "pass")
        for label, (_, kc) in running.items():
            add(label, f"{prefix} {args.output_mib} MiB output (s)", run_cell(kc, code))
        if also is not None:
            also(running)


def _bench_kernelspecs(sshd: Sshd) -> str:
    """A second kernelspec for plain ipykernel (so the A/A line compares two identical kernels), and
    the two of EXPLAIN."""
    root = scratch_dir(prefix="klbr-bench-")
    ipykernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    forwarder = [sys.executable, str(Path(__file__).with_name("forwarder.py")), "-f", "{connection_file}"]
    # klbr whose workers are a kernelspec (plain ipykernel): fresh key per generation, re-signed.
    resigned = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}",
                "--Supervisor.placement=kernelspec:python3-aa"]
    other = [str(OTHER_PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    ssh = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}",
           f"--Supervisor.placement=ssh://klbr-test{OTHER_PYTHON}", f"--Supervisor.ssh_options=-F{sshd.config}"]
    ssh_floor = [sys.executable, str(Path(__file__).with_name("forwarder.py")), "--ssh", str(sshd.config), "klbr-test",
                 str(OTHER_PYTHON), "-f", "{connection_file}"]
    for name, argv in (("klbr-bench-ssh", ssh), ("klbr-bench-ssh-floor", ssh_floor),("python3-aa", ipykernel), ("python3-nohist", [*ipykernel, "--HistoryManager.enabled=False"]),
                       ("klbr-bench-floor", forwarder), ("klbr-bench-resigned", resigned), ("python3-other", other)):
        spec = Path(root, "kernels", name)
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": name, "language": "python", "interrupt_mode": "message",
        }))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [root, os.environ.get("JUPYTER_PATH")]))
    return root


def ssh_round(args, r: int, code: str, add) -> None:
    """One round of the ssh:// rows, and host calls over the channel forwarded back over ssh."""

    def host(running) -> None:
        for measure, value in host_calls(running["klbr"][1]).items():
            add("klbr", f"ssh:// {measure}", value)

    placed_round("ssh://", SSH, args, r, code, add, host)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cells", type=int, default=200, help="trivial cells per kernel per round")
    ap.add_argument("--output-mib", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results/latest.json")
    ap.add_argument("--doc", help="rewrite the tables between the bench markers of this Markdown page "
                                  "(make bench: docs/benchmarks.md)")
    ap.add_argument("--footprint-rounds", type=int, default=3, help="rounds of the memory table (footprint.py)")
    ap.add_argument("--engines-only", action="store_true", help="only the docker:// and slurm:// rows")
    args = ap.parse_args()
    # klbr records every cell, as it does for a user, but into a file of the run's own: never the
    # user's cell log (one another klbr has migrated would leave the bench's kernels unrecorded, and
    # faster than they are).
    os.environ.setdefault("KLBR_DB", os.path.join(scratch_dir(prefix="klbr-bench-log-"), "klbr.sqlite3"))
    with ExitStack() as stack:
        sshd = Sshd(Path(scratch_dir(prefix="klbr-bench-sshd-")))
        stack.callback(sshd.stop)
        dockerd = Dockerd()
        stack.callback(dockerd.stop)
        cluster = Cluster()
        stack.callback(cluster.stop)
        run(args, sshd, dockerd, klbr_image(dockerd), cluster)


def run(args, sshd: Sshd, dockerd: Dockerd, image: str, cluster: Cluster) -> None:
    _engine_kernelspecs(_bench_kernelspecs(sshd), dockerd, image, cluster)
    resigned = f"{args.output_mib} MiB output, klbr re-signed (kernelspec:) (s)"
    TARGETS[resigned] = 1.00
    TARGETS[f"ssh:// {args.output_mib} MiB output (s)"] = 1.00
    for engine in ENGINES:
        TARGETS[f"{engine} {args.output_mib} MiB output (s)"] = 1.00
    results: dict[str, dict[str, list[float]]] = {k: {} for k in [*KERNELS, *EXPLAIN]}

    def add(label: str, measure: str, value: float) -> None:
        results[label].setdefault(measure, []).append(value)

    code = (f"import sys\nchunk = 'x' * 65536\nfor _ in range({args.output_mib * 16}):\n"
            "    sys.stdout.write(chunk)\nsys.stdout.flush()")
    for r in range(args.rounds):
        engine_round(args, r, code, add)
        if args.engines_only:
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
            continue
        order = rotated(KERNELS, r)  # no kernel always goes first (or last) in a round
        for _ in range(3):  # one start is a noisy sample: three per kernel per round, taking turns
            for label, name in order.items():
                info, first = startup(name)
                add(label, "start → kernel_info (s)", info)
                add(label, "start → first cell (s)", first)
        trivial_cells({**order, **EXPLAIN}, args.cells, add)
        with ExitStack() as stack:
            running = {label: stack.enter_context(kernel(name)) for label, name in order.items()}
            for _, kc in running.values():
                run_cell(kc, "pass")
            # One output cell is a noisy sample (the ratio moved by +-0.15 between runs):
            # three per kernel per round, taking turns cell by cell.
            for _ in range(3):
                for label, (_, kc) in running.items():
                    add(label, f"{args.output_mib} MiB output in 64 KiB writes (s)", run_cell(kc, code))
                for label, (_, kc) in running.items():
                    add(label, "100 000 print() calls (s)", run_cell(kc, "for i in range(100_000):\n    print(i)"))
            for label, (km, kc) in running.items():
                if label == "klbr":
                    add(label, "proxy RSS (MiB)", rss_mib(km.provisioner.process.pid))
                    add(label, "replay of a 10 000-output cell → idle (s)", replay_10k(kc))
                    add(label, "memory sample at each cell's end (µs)", memory_sample_us(pid_of_worker(kc)))
                    for measure, value in host_calls(kc).items():
                        add(label, measure, value)
                add(label, "worker RSS (MiB)", rss_mib(pid_of_worker(kc)))
                for measure, value in recovery(label, km, kc).items():
                    add(label, measure, value)
        with kernel("klbr-bench-resigned") as (_, kc):  # the re-signing path, against this round's plain one
            run_cell(kc, "pass")
            for _ in range(3):
                add("klbr", resigned, run_cell(kc, code))
        for label in ("ipykernel", "ipykernel A/A"):
            results[label][resigned] = list(results[label][f"{args.output_mib} MiB output in 64 KiB writes (s)"])
        with kernel("klbr") as (_, kc):  # a move to another interpreter, against its plain ipykernel's start
            for label in rotated({"klbr": "", "ipykernel": "", "ipykernel A/A": ""}, r):
                if label == "klbr":
                    add(label, PLACED, placement_first_cell(kc, str(OTHER_PYTHON)))
                else:
                    add(label, PLACED, startup("python3-other")[1])
        with kernel("klbr") as (_, kc):  # host calls from a worker without klbr, beside local's
            run_cell(kc, f"%klbr placement python:{OTHER_PYTHON}")
            for measure, value in host_calls(kc).items():
                add("klbr", f"python: {measure}", value)
        ssh_round(args, r, code, add)
        for measure, value in store_cost(args.cells).items():
            add("klbr", measure, value)
        for label, name in order.items():  # `%klbr rebuild` on klbr; the same cells run directly on the others
            add(label, REBUILD, rebuild_cost(label, name))
        tmp = scratch_dir(prefix="klbr-bench-nb-")
        for label, name in order.items():
            add(label, "nbclient, 100-cell notebook (s)", nbclient_100(name, tmp))
        # One sample of each, taken one after the other, was as noisy as its A/A line (0.82x-0.87x):
        # a sample per kernel per round, taking turns.
        for label, name in order.items():
            add(label, "8 kernels × 200 cells at once (s)", eight_at_once(name))  # noqa: RUF001 — the tables' multiplication sign, as docs/benchmarks.md shows them
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    memory = ""
    if not args.engines_only:
        for measure, value in million_cell_listing(scratch_dir(prefix="klbr-bench-db-")).items():
            add("klbr", measure, value)
        # What each kernel's processes hold (footprint.py), one kernel at a time so none shares pages with another.
        memory = footprint.table(footprint.measure(args.footprint_rounds))

    rows = []
    measures = list(results["klbr"])
    cell = "trivial cell (ms)"
    for m in measures:
        if m == cell:
            for label, p in (("p50", 50), ("p90", 90), ("p99", 99)):
                rows.append((f"trivial cell {label} (ms)", *(pct(results[k][m], p) for k in KERNELS)))
            # klbr whose worker is plain ipykernel with a key of its own: every message re-signed.
            rows.append((RESIGNED_CELL, pct(results["klbr, re-signed (kernelspec:)"][m], 50),
                         *(pct(results[k][m], 50) for k in list(KERNELS)[1:])))
        else:
            rows.append((m, *(statistics.median(results[k][m]) if m in results[k] else None for k in KERNELS)))
    header = "| measure | klbr | ipykernel | klbr / ipykernel | target | A/A (ipykernel / ipykernel) |"
    lines = [header, "|---|---|---|---|---|---|"]

    def fmt(v):
        return "n/a" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"

    def target(name: str, k: float | None, ip: float | None) -> str:
        goal = TARGETS.get(name)
        if goal is None or k is None:
            return ""
        if isinstance(goal, str):  # an absolute figure, "0.4 ms"
            limit = float(goal.split()[0])
            return f"≤ {goal}: {'met' if k <= limit else 'not met'}"
        met = ip is not None and ip > 0 and k / ip <= goal
        return f"≤ {goal:.2f}×: {'met' if met else 'not met'}"  # noqa: RUF001 — the tables' multiplication sign

    for name, k, ip, aa in rows:
        ratio = f"{k / ip:.2f}×" if k is not None and ip else "n/a"  # noqa: RUF001 — the tables' multiplication sign, as docs/benchmarks.md shows them
        noise = f"{aa / ip:.2f}×" if aa is not None and ip else "n/a"  # noqa: RUF001 — the tables' multiplication sign, as docs/benchmarks.md shows them
        lines.append(f"| {name} | {fmt(k)} | {fmt(ip)} | {ratio} | {target(name, k, ip)} | {noise} |")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    table = "\n".join(lines)
    # Reading the trivial-cell ratio: each kernel's percentiles against ipykernel's, same rounds.
    cpu = "CPU per trivial cell, kernel and workers (ms)"
    explain = ["| trivial cell | p50 (ms) | p99 (ms) | p50 / ipykernel | p99 / ipykernel | CPU per cell (ms) "
               "| kernel process CPU per cell (ms) |",
               "|---|---|---|---|---|---|---|"]
    for label in ("ipykernel", *EXPLAIN, "klbr"):
        if cell not in results["ipykernel"]:  # --engines-only
            break
        p50, p99 = pct(results[label][cell], 50), pct(results[label][cell], 99)
        base50, base99 = pct(results["ipykernel"][cell], 50), pct(results["ipykernel"][cell], 99)
        explain.append(f"| {label} | {fmt(p50)} | {fmt(p99)} | {p50 / base50:.2f}× | {p99 / base99:.2f}× "  # noqa: RUF001 — the tables' multiplication sign, as docs/benchmarks.md shows them
                       f"| {fmt(statistics.median(results[label][cpu]))} "
                       f"| {fmt(statistics.median(results[label][PROCESS_CPU]))} |")
    explain_table = "\n".join(explain)
    print(f"\nklbr vs plain ipykernel — {when} — {machine}\n{args.rounds} rounds, medians (latency percentiles over all cells)\n")
    print(table)
    print("\n" + explain_table)
    print("\n" + memory)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": when, "machine": machine, "rounds": args.rounds, "raw": results, "table": table, "memory": memory,
                                "explain": explain_table}, indent=1))
    if args.doc:
        doc = Path(args.doc)
        text = doc.read_text()
        head, rest = text.split("<!-- bench:start -->", 1)
        _, tail = rest.split("<!-- bench:end -->", 1)
        block = (f"Measured {when} on {machine}; {args.rounds} rounds of {args.cells} trivial cells, medians "
                 "(latency percentiles over all cells). The A/A column is ipykernel against itself: the noise. "
                 "*kernel process CPU* is the proxy's own for klbr (its workers are its children), the whole "
                 "kernel's for ipykernel: its ratio is the proxy's share of a plain kernel's CPU per cell. "
                 "*target* is what klbr aims at, and whether this run met it.\n\n"
                 + table + "\n\n"
                 "Where the trivial-cell ratio comes from, same rounds: *hop floor* is ipykernel behind a C-level "
                 "ZMQ forwarder (`benchmarks/forwarder.py`: what any proxy process costs here, with no Python per "
                 "message; its kernel process CPU is the forwarder's alone); *no history db* is ipykernel "
                 "started as klbr starts its workers (`Supervisor.ipython_history`).\n\n" + explain_table + "\n")
        doc.write_text(f"{head}<!-- bench:start -->\n{block}<!-- bench:end -->{tail}")
        if memory:
            footprint.into_page(doc, memory)
        print(f"\nwrote the tables into {doc}")


if __name__ == "__main__":
    main()
