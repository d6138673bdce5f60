"""The measures of `make bench`, each on one kernel (or a few at once); `compare.py` runs them in
rounds, interleaved, and makes the tables."""

from __future__ import annotations

import asyncio
import atexit
import glob
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from klbr_supervisor.memory import MemoryWatch
from klbr_supervisor.store import queries
from klbr_supervisor.store.schema import migrate

# klbr with its cell log unavailable: the difference to "klbr" is what the store costs per cell.
UNRECORDED = {"KLBR_DB": "/proc/klbr-benchmark-no-store/klbr.sqlite3"}


def scratch_dir(prefix: str) -> str:
    """A temporary directory for this run (kernelspecs, cell logs of thousands of cells), removed as
    the run ends: `make bench` left ~200 MiB in /tmp a run."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


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


def process_cpu_ns(pid: int) -> int:
    """CPU nanoseconds used so far by every live thread of `pid` (not its children), from
    /proc/PID/task/*/schedstat: finer than the clock ticks of /proc/PID/stat."""
    total = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(Path(stat).read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by `pid` and its live descendants (a kernel and its workers), from
    each thread's schedstat (nanoseconds: a trivial cell costs a few clock ticks of /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += process_cpu_ns(p)
        todo.extend(children.get(p, []))
    return total / 1e9


# The kernel process alone: klbr's proxy (its workers are its children), all of plain ipykernel.
PROCESS_CPU = "kernel process CPU per trivial cell (ms)"


def trivial_cells(kernels: dict[str, str | tuple[str, dict]], cells: int, add, block: int = 20) -> None:
    """Latency and CPU of trivial cells, every kernel (a kernelspec name, or a name and environment)
    running at once and taking turns in blocks of `block` cells, so drift hits all alike. A warm-up
    cell after each turn lets the previous kernel's background work (a history thread, a writer)
    settle before the clock runs. CPU is the kernel's and its workers', and the kernel process's alone."""
    with ExitStack() as stack:
        running = {label: stack.enter_context(kernel(*([spec] if isinstance(spec, str) else spec)))
                   for label, spec in kernels.items()}
        cpu = dict.fromkeys(kernels, 0.0)
        own = dict.fromkeys(kernels, 0)
        blocks = max(1, cells // block)
        for b in range(blocks):
            for label in rotated(dict.fromkeys(kernels, ""), b):
                km, kc = running[label]
                run_cell(kc, "pass")
                pid = km.provisioner.process.pid
                before, before_own = tree_cpu_s(pid), process_cpu_ns(pid)
                for _ in range(block):
                    add(label, "trivial cell (ms)", run_cell(kc, "pass") * 1000)
                cpu[label] += tree_cpu_s(pid) - before
                own[label] += process_cpu_ns(pid) - before_own
        for label in kernels:
            add(label, "CPU per trivial cell, kernel and workers (ms)", cpu[label] / (blocks * block) * 1000)
            add(label, PROCESS_CPU, own[label] / (blocks * block) / 1e6)


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
        if (not reply and kc.shell_channel.msg_ready()) or (idle and not reply):
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
        # A PUB drops what nobody has subscribed to yet: if iopub's subscription were still on its
        # way, the first cell's idle would be lost (a bench run once hung on plain ipykernel so).
        # Wait, as wait_for_ready does, for the first iopub message: kernel_info's status or the
        # iopub_welcome, asking again while none comes (an ipykernel without the welcome, behind a
        # hop, publishes the first status before the subscription has reached it).
        deadline = time.perf_counter() + 60
        while not kc.iopub_channel.msg_ready():
            assert time.perf_counter() < deadline, f"{name}: no iopub message within 60 s"
            kc.kernel_info()
            if kc.iopub_channel.socket.poll(1000):
                break
        kc.get_iopub_msg(timeout=1)
        run_cell(kc, "pass")
        first = time.perf_counter() - start
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    return info, first


def pid_of_worker(kc) -> int:
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
        pid = pid_of_worker(kc)
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


# Host calls timed inside a cell, each cell within the default budget of 128 calls.
HOST_CALLS = """
import json, time
from klbr_kernel import host
spent = []
for _ in range({n}):
    start = time.perf_counter(); {call}; spent.append(time.perf_counter() - start)
print(json.dumps(spent))
"""


def printed(kc, code: str, timeout: float = 120) -> str:
    """What the cell `code` printed, once it has its idle and its reply."""
    msg_id = kc.execute(code)
    text = ""
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    _reply_to(kc, msg_id, timeout)
    return text


def _timed_in_cell(kc, call: str, n: int) -> list[float]:
    return json.loads(printed(kc, HOST_CALLS.format(n=n, call=call)))


def host_calls(kc, cells: int = 3) -> dict[str, float]:
    """Round trips of host calls made from cells: `inspect()`, and a `put` followed by a `get`."""
    inspect, kv = [], []
    for _ in range(cells):
        inspect += _timed_in_cell(kc, "host.inspect()", 120)
        kv += _timed_in_cell(kc, "host.put('bench', {'n': 1}); host.get('bench')", 60)
    inspect.sort()
    kv.sort()

    def ms(values: list[float], p: float) -> float:
        return values[int(p * (len(values) - 1))] * 1000

    return {"host.inspect() p50 (ms)": ms(inspect, 0.5), "host.inspect() p99 (ms)": ms(inspect, 0.99),
            "host.put + host.get p50 (ms)": ms(kv, 0.5), "host.put + host.get p99 (ms)": ms(kv, 0.99)}


def replay_10k(kc) -> float:
    """`%klbr replay` of a cell that made 10 000 outputs: seconds from the request to its reply and idle."""
    run_cell(kc, "for i in range(10_000):\n    print(i, flush=True)")
    return run_cell(kc, "%klbr replay")


def placement_first_cell(kc, python: str) -> float:
    """`%klbr placement python:PATH` -> the first cell done on the new generation, in seconds."""
    start = time.perf_counter()
    run_cell(kc, f"%klbr placement python:{python}")
    run_cell(kc, "pass")
    elapsed = time.perf_counter() - start
    run_cell(kc, "%klbr placement local")
    return elapsed


def memory_sample_us(pid: int, samples: int = 2000) -> float:
    """What the memory watch adds to each cell: the quick sample of the worker's processes from
    /proc taken as the cell's outcome is recorded (`MemoryWatch.sample(quick=True)`; its timer's
    once-a-second sample also reads /proc/meminfo), median microseconds, on a running worker."""
    async def timed() -> float:
        watch = MemoryWatch(pid, None)
        try:
            times = []
            for _ in range(samples):
                start = time.perf_counter()
                watch.sample(quick=True)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e6
        finally:
            watch.close()

    return asyncio.run(timed())


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


def cell_log(path: str, cells: int) -> None:
    """A cell log at `path` of `cells` finished cells, 1 000 per session."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO sessions (id, uuid, notebook, host, pid, started, ended) VALUES (?, ?, ?, 'h', 1, '2026', '2026')",
                     ((s, f"u{s}", f"nb{s % 50}.ipynb") for s in range(1, 1 + (cells + 999) // 1000)))
    conn.executemany("INSERT INTO cells (session_id, msg_id, execution_count, code, status, started) VALUES (?, ?, ?, ?, 'ok', '2026')",
                     ((1 + i // 1000, f"m{i}", 1 + i % 1000, f"x = {i}") for i in range(cells)))
    conn.execute("COMMIT")
    conn.close()


def million_cell_listing(tmpdir: str) -> dict[str, float]:
    """A cell log of 1 000 000 cells in 1 000 sessions: how long the CLI's listings take."""
    path = os.path.join(tmpdir, "million.sqlite3")
    cell_log(path, 1_000_000)
    read = queries.connect(path)
    out = {}
    start = time.perf_counter()
    queries.sessions(read, 50)
    out["list sessions, 1M-cell log (ms)"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    rows = queries.cells(read, 500)
    assert len(rows) == 1000
    out["list a session's cells, 1M-cell log (ms)"] = (time.perf_counter() - start) * 1000
    return out


def nbclient_100(name: str, tmpdir: str) -> float:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x{i} = {i}\nprint(x{i})") for i in range(100)])
    start = time.perf_counter()
    NotebookClient(nb, kernel_name=name, timeout=60, resources={"metadata": {"path": tmpdir}}).execute()
    return time.perf_counter() - start


def eight_at_once(name: str) -> float:
    """Seconds for 8 kernels, started together, to each run 200 trivial cells (one shared cell log)."""
    def one() -> None:
        with kernel(name) as (_, kc):
            for i in range(200):
                run_cell(kc, f"{i}")

    start = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start
