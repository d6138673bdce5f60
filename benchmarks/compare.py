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
import tempfile
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path

from jupyter_client.manager import KernelManager

KERNELS = {"klbr": "klbr", "ipykernel": "python3", "ipykernel A/A": "python3-aa"}
# Not klbr, for reading its trivial-cell ratio: what a proxy process costs at the least (ipykernel
# behind a C-level forwarder), and ipykernel started as klbr starts its workers (no IPython history db).
EXPLAIN = {"hop floor": "klbr-bench-floor", "ipykernel, no history db": "python3-nohist"}
# klbr with its cell log unavailable: the difference to "klbr" is what the store costs per cell.
UNRECORDED = {"KLBR_DB": "/proc/klbr-benchmark-no-store/klbr.sqlite3"}


def _bench_kernelspecs() -> str:
    """A second kernelspec for plain ipykernel (so the A/A line compares two identical kernels), and
    the two of EXPLAIN."""
    root = tempfile.mkdtemp(prefix="klbr-bench-")
    ipykernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    forwarder = [sys.executable, str(Path(__file__).with_name("forwarder.py")), "-f", "{connection_file}"]
    for name, argv in (("python3-aa", ipykernel), ("python3-nohist", [*ipykernel, "--HistoryManager.enabled=False"]),
                       ("klbr-bench-floor", forwarder)):
        spec = Path(root, "kernels", name)
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": name, "language": "python", "interrupt_mode": "message",
        }))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [root, os.environ.get("JUPYTER_PATH")]))
    return root


@contextmanager
def kernel(name: str, env: dict | None = None):
    km = KernelManager(kernel_name=name)
    km.start_kernel(**({"env": {**os.environ, **env}} if env else {}))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    time.sleep(4)  # settle: klbr warms its standby a second after the first generation is ready
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def rotated(kernels: dict[str, str], by: int) -> dict[str, str]:
    items = list(kernels.items())
    by %= len(items)
    return dict(items[by:] + items[:by])


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by `pid` and its live descendants (a kernel and its workers)."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime + stime
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += ticks.get(p, 0)
        todo.extend(children.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


def trivial_cells(kernels: dict[str, str | tuple[str, dict]], cells: int, add, block: int = 20) -> None:
    """Latency and CPU of trivial cells, every kernel (a kernelspec name, or a name and environment)
    running at once and taking turns in blocks of `block` cells, so drift hits all alike. A warm-up
    cell after each turn lets the previous kernel's background work (a history thread, a writer)
    settle before the clock runs."""
    with ExitStack() as stack:
        running = {label: stack.enter_context(kernel(*([spec] if isinstance(spec, str) else spec)))
                   for label, spec in kernels.items()}
        cpu = dict.fromkeys(kernels, 0.0)
        blocks = max(1, cells // block)
        for b in range(blocks):
            for label in rotated(dict.fromkeys(kernels, ""), b):
                km, kc = running[label]
                run_cell(kc, "pass")
                pid = km.provisioner.process.pid
                before = tree_cpu_s(pid)
                for _ in range(block):
                    add(label, "trivial cell (ms)", run_cell(kc, "pass") * 1000)
                cpu[label] += tree_cpu_s(pid) - before
        for label in kernels:
            add(label, "CPU per trivial cell, kernel and workers (ms)", cpu[label] / (blocks * block) * 1000)


def run_cell(kc, code: str, timeout: float = 300) -> float:
    """Seconds from sending an execute to having both its reply and its idle."""
    start = time.perf_counter()
    msg_id = kc.execute(code)
    idle = reply = False
    while not (idle and reply):
        if not idle:
            msg = kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"]["execution_state"] == "idle":
                idle = True
        if not reply and kc.shell_channel.msg_ready():
            reply = kc.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") == msg_id
        elif idle and not reply:
            reply = kc.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") == msg_id
    return time.perf_counter() - start


def startup(name: str) -> tuple[float, float]:
    """(start -> first kernel_info reply, start -> first trivial cell done), in seconds."""
    km = KernelManager(kernel_name=name)
    start = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        msg_id = kc.kernel_info()
        while kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
            pass
        info = time.perf_counter() - start
        run_cell(kc, "pass")
        first = time.perf_counter() - start
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    return info, first


def _pid_of_worker(kc) -> int:
    msg_id = kc.execute("import os; os.getpid()")
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
            pid = int(msg["content"]["data"]["text/plain"])
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            return pid


def _reply_to(kc, msg_id: str, timeout: float = 60) -> dict:
    while True:
        msg = kc.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def _wait_running(kc, msg_id: str) -> None:
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            time.sleep(0.2)
            return


def recovery(label: str, km, kc) -> dict[str, float]:
    """Loss, restart and interrupt figures for one kernel (ipykernel has no loss answer at all)."""
    out: dict[str, float] = {}
    msg_id = kc.execute("import time; time.sleep(30)")
    _wait_running(kc, msg_id)
    start = time.perf_counter()
    km.interrupt_kernel()
    _reply_to(kc, msg_id)
    out["interrupt → reply (ms)"] = (time.perf_counter() - start) * 1000
    if label == "klbr":
        run_cell(kc, "pass")
        pid = _pid_of_worker(kc)
        time.sleep(0.5)  # let the warm standby finish starting
        msg_id = kc.execute("import time; time.sleep(30)")
        _wait_running(kc, msg_id)
        start = time.perf_counter()
        os.kill(pid, 9)
        _reply_to(kc, msg_id)
        out["loss → error reply (ms)"] = (time.perf_counter() - start) * 1000
        run_cell(kc, "pass")
        out["loss → next cell done (ms)"] = (time.perf_counter() - start) * 1000
        time.sleep(1.0)
        start = time.perf_counter()
        run_cell(kc, "%klbr restart")
        run_cell(kc, "pass")
        out["restart → first cell (ms)"] = (time.perf_counter() - start) * 1000
        time.sleep(1.0)
        msg_id = kc.execute("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass")
        _wait_running(kc, msg_id)
        start = time.perf_counter()
        km.interrupt_kernel()
        reply = _reply_to(kc, msg_id)
        assert reply["content"].get("ename") == "WorkerKilled", reply["content"]
        out["ignored interrupt → WorkerKilled (ms)"] = (time.perf_counter() - start) * 1000
    else:
        # ipykernel never answers a lost cell; what it offers is a restart by the frontend.
        run_cell(kc, "pass")
        start = time.perf_counter()
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        run_cell(kc, "pass")
        out["restart → first cell (ms)"] = (time.perf_counter() - start) * 1000
        out["loss → next cell done (ms)"] = out["restart → first cell (ms)"]
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def store_cost(cells: int) -> dict[str, float]:
    """What recording costs a trivial cell: klbr against klbr with its store unavailable, taking
    turns; median latency and CPU per cell, the difference of the two."""
    results: dict[str, dict[str, list[float]]] = {}

    def add(label: str, measure: str, value: float) -> None:
        results.setdefault(label, {}).setdefault(measure, []).append(value)

    trivial_cells({"recorded": "klbr", "unrecorded": ("klbr", UNRECORDED)}, cells, add)
    rec, unrec = results["recorded"], results["unrecorded"]
    cpu = "CPU per trivial cell, kernel and workers (ms)"
    return {
        "store cost per trivial cell, latency (ms)":
            statistics.median(rec["trivial cell (ms)"]) - statistics.median(unrec["trivial cell (ms)"]),
        "store cost per trivial cell, CPU (ms)": rec[cpu][0] - unrec[cpu][0],
    }


def million_cell_listing(tmpdir: str) -> dict[str, float]:
    """A cell log of 1 000 000 cells in 1 000 sessions: how long the CLI's listings take."""
    import sqlite3

    from klbr_supervisor.store.queries import cells, connect, sessions
    from klbr_supervisor.store.schema import migrate

    path = os.path.join(tmpdir, "million.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO sessions (id, uuid, notebook, host, pid, started, ended) VALUES (?, ?, ?, 'h', 1, '2026', '2026')",
                     ((s, f"u{s}", f"nb{s % 50}.ipynb") for s in range(1, 1001)))
    conn.executemany("INSERT INTO cells (session_id, msg_id, execution_count, code, status, started) VALUES (?, ?, ?, ?, 'ok', '2026')",
                     ((1 + i // 1000, f"m{i}", 1 + i % 1000, f"x = {i}") for i in range(1_000_000)))
    conn.execute("COMMIT")
    conn.close()
    read = connect(path)
    out = {}
    start = time.perf_counter()
    sessions(read, 50)
    out["list sessions, 1M-cell log (ms)"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    rows = cells(read, 500)
    assert len(rows) == 1000
    out["list a session's cells, 1M-cell log (ms)"] = (time.perf_counter() - start) * 1000
    return out


def nbclient_100(name: str, tmpdir: str) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x{i} = {i}\nprint(x{i})") for i in range(100)])
    start = time.perf_counter()
    NotebookClient(nb, kernel_name=name, timeout=60, resources={"metadata": {"path": tmpdir}}).execute()
    return time.perf_counter() - start


def eight_at_once(name: str) -> float:
    """Seconds for 8 kernels, started together, to each run 200 trivial cells (one shared cell log)."""
    import threading

    def one() -> None:
        with kernel(name) as (km, kc):
            for i in range(200):
                run_cell(kc, f"{i}")

    start = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cells", type=int, default=200, help="trivial cells per kernel per round")
    ap.add_argument("--output-mib", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results/latest.json")
    ap.add_argument("--readme", help="rewrite the table between the bench markers of this README")
    args = ap.parse_args()
    _bench_kernelspecs()
    results: dict[str, dict[str, list[float]]] = {k: {} for k in [*KERNELS, *EXPLAIN]}

    def add(label: str, measure: str, value: float) -> None:
        results[label].setdefault(measure, []).append(value)

    for r in range(args.rounds):
        order = rotated(KERNELS, r)  # no kernel always goes first (or last) in a round
        for _ in range(3):  # one start is a noisy sample: three per kernel per round, taking turns
            for label, name in order.items():
                info, first = startup(name)
                add(label, "start → kernel_info (s)", info)
                add(label, "start → first cell (s)", first)
        trivial_cells({**order, **EXPLAIN}, args.cells, add)
        for label, name in order.items():
            with kernel(name) as (km, kc):
                run_cell(kc, "pass")
                code = (f"import sys\nchunk = 'x' * 65536\nfor _ in range({args.output_mib * 16}):\n"
                        "    sys.stdout.write(chunk)\nsys.stdout.flush()")
                add(label, f"{args.output_mib} MiB output in 64 KiB writes (s)", run_cell(kc, code))
                add(label, "100 000 print() calls (s)", run_cell(kc, "for i in range(100_000):\n    print(i)"))
                if label == "klbr":
                    add(label, "proxy RSS (MiB)", rss_mib(km.provisioner.process.pid))
                add(label, "worker RSS (MiB)", rss_mib(_pid_of_worker(kc)))
                for measure, value in recovery(label, km, kc).items():
                    add(label, measure, value)
        for measure, value in store_cost(args.cells).items():
            add("klbr", measure, value)
        tmp = tempfile.mkdtemp(prefix="klbr-bench-nb-")
        for label, name in order.items():
            add(label, "nbclient, 100-cell notebook (s)", nbclient_100(name, tmp))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    for measure, value in million_cell_listing(tempfile.mkdtemp(prefix="klbr-bench-db-")).items():
        add("klbr", measure, value)
    for label, name in KERNELS.items():
        add(label, "8 kernels × 200 cells at once (s)", eight_at_once(name))

    rows = []
    measures = list(results["klbr"])
    for m in measures:
        if m == "trivial cell (ms)":
            for label, p in (("p50", 50), ("p90", 90), ("p99", 99)):
                rows.append((f"trivial cell {label} (ms)", *(pct(results[k][m], p) for k in KERNELS)))
        else:
            rows.append((m, *(statistics.median(results[k][m]) if m in results[k] else None for k in KERNELS)))
    header = "| measure | klbr | ipykernel | klbr / ipykernel | A/A (ipykernel / ipykernel) |"
    lines = [header, "|---|---|---|---|---|"]

    def fmt(v):
        return "n/a" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"

    for name, k, ip, aa in rows:
        ratio = f"{k / ip:.2f}×" if k is not None and ip else "n/a"
        noise = f"{aa / ip:.2f}×" if aa is not None and ip else "n/a"
        lines.append(f"| {name} | {fmt(k)} | {fmt(ip)} | {ratio} | {noise} |")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = "\n".join(lines)
    # Reading the trivial-cell ratio: each kernel's percentiles against ipykernel's, same rounds.
    cell = "trivial cell (ms)"
    cpu = "CPU per trivial cell, kernel and workers (ms)"
    explain = ["| trivial cell | p50 (ms) | p99 (ms) | p50 / ipykernel | p99 / ipykernel | CPU per cell (ms) |",
               "|---|---|---|---|---|---|"]
    for label in ("ipykernel", *EXPLAIN, "klbr"):
        p50, p99 = pct(results[label][cell], 50), pct(results[label][cell], 99)
        base50, base99 = pct(results["ipykernel"][cell], 50), pct(results["ipykernel"][cell], 99)
        explain.append(f"| {label} | {fmt(p50)} | {fmt(p99)} | {p50 / base50:.2f}× | {p99 / base99:.2f}× "
                       f"| {fmt(statistics.median(results[label][cpu]))} |")
    explain_table = "\n".join(explain)
    print(f"\nklbr vs plain ipykernel — {when} — {machine}\n{args.rounds} rounds, medians (latency percentiles over all cells)\n")
    print(table)
    print("\n" + explain_table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": when, "machine": machine, "rounds": args.rounds, "raw": results, "table": table,
                                "explain": explain_table}, indent=1))
    if args.readme:
        readme = Path(args.readme)
        text = readme.read_text()
        head, rest = text.split("<!-- bench:start -->", 1)
        _, tail = rest.split("<!-- bench:end -->", 1)
        block = (f"Measured {when} on {machine}; {args.rounds} rounds of {args.cells} trivial cells, medians "
                 "(latency percentiles over all cells). The A/A column is ipykernel against itself: the noise.\n\n"
                 + table + "\n\n"
                 "Where the trivial-cell ratio comes from, same rounds: *hop floor* is ipykernel behind a C-level "
                 "ZMQ forwarder (`benchmarks/forwarder.py`: what any proxy process costs here, with no Python per "
                 "message); *no history db* is ipykernel started as klbr starts its workers "
                 "(`Supervisor.ipython_history`).\n\n" + explain_table + "\n")
        readme.write_text(f"{head}<!-- bench:start -->\n{block}<!-- bench:end -->{tail}")
        print(f"\nwrote the table into {readme}")


if __name__ == "__main__":
    main()
