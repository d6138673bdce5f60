"""Many kernels, one file: `python benchmarks/many_kernels.py [--kernels 50 --cells 200]`.

N klbr kernels record into one SQLite file, each running C trivial cells at once, while a third
process (`lock_holder`) takes the file's write lock (BEGIN IMMEDIATE) for 2 s at random moments.
Prints, and writes to `benchmarks/results/many_kernels.json`: cells lost (a reply missing, or a
row that is not `ok` with its output), error replies (a locked file must make a cell wait, never
fail it), the store's cost per cell and the cell latency seen by the client.

The store's cost per cell is what a cell waits for on the store in the kernel itself: from the
call of `Store.cell_started` to its row being durable (the call returns True after a direct commit
on the loop, or its `done` runs once the writer thread committed it), plus the same for
`Store.cell_finished` (the outcome with every output). Nothing in the store times itself, so each
kernel loads a `jupyter_klbr_config.py` (the kernel's own config mechanism) that wraps those two
methods with a clock and writes the figures when the store closes; the product code is unchanged.

Each kernel runs with `--Supervisor.standby=False` (a worker each, no warm spare) unless
`--standby` is given. `run` is what `tests/test_many_kernels.py` calls, with a small count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from jupyter_client.manager import KernelManager

HERE = Path(__file__).resolve().parent
TIMINGS = "KLBR_BENCH_STORE_TIMINGS"  # the directory each kernel writes its store timings to

# Loaded by every kernel of the run as its jupyter_klbr_config.py. Per cell, for its running row and
# its outcome: when the write was asked for (time.monotonic(): CLOCK_MONOTONIC, one clock for every
# process here), the seconds until it was durable, and whether the loop committed it itself (direct).
TIMED_STORE = f"""
import json, os, time
from klbr_supervisor.store.store import Store

_spent = {{}}  # msg_id -> [row asked at, its s, direct, outcome asked at, its s, direct]


def _timed(index, call):
    def timed(cell, done):
        times = _spent.setdefault(cell.msg_id, [None] * 6)
        times[index] = start = time.monotonic()

        def timed_done(error):
            times[index + 1:index + 3] = time.monotonic() - start, False
            done(error)

        if call(cell, timed_done):
            times[index + 1:index + 3] = time.monotonic() - start, True
            return True
        return False
    return timed


_started, _finished, _close = Store.cell_started, Store.cell_finished, Store.close
Store.cell_started = lambda self, cell, done: _timed(0, lambda c, d: _started(self, c, d))(cell, done)
Store.cell_finished = lambda self, cell, *, done, **kw: _timed(3, lambda c, d: _finished(self, c, done=d, **kw))(cell, done)


def _close_and_write(self):
    _close(self)
    path = os.path.join(os.environ[{TIMINGS!r}], f"{{os.getpid()}}.json")
    with open(path, "w") as f:
        json.dump(_spent, f)


Store.close = _close_and_write
"""

# The third process: takes the write lock for `hold` seconds at random moments until its stdin
# closes. Each wait is a select on stdin, so it stops the moment the run ends. A line per hold:
# when it asked for the lock, got it and let it go (time.monotonic()).
LOCK_HOLDER = r"""
import json, random, select, sqlite3, sys, time
db, hold, gap_min, gap_max, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
conn = sqlite3.connect(db, timeout=60, isolation_level=None)
gap = 0.0  # the first hold at once: the cells start behind it
while not select.select([sys.stdin], [], [], gap)[0]:
    asked = time.monotonic()
    conn.execute("BEGIN IMMEDIATE")
    got = time.monotonic()
    print("holding", flush=True)
    stop = select.select([sys.stdin], [], [], hold)[0]
    conn.execute("ROLLBACK")
    print(json.dumps({"asked": asked, "got": got, "released": time.monotonic()}), flush=True)
    if stop:
        break
    gap = rng.uniform(gap_min, gap_max)
"""


@dataclass
class Result:
    kernels: int
    cells: int
    wall_s: float = 0.0  # the cell phase: every kernel running its cells at once
    start_s: float = 0.0  # starting every kernel, each until its first cell is done
    holds: list[tuple[float, float]] = field(default_factory=list)  # the lock holder's (got, released)
    replies: int = 0
    error_replies: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # what is missing or wrong, per kernel
    log_errors: list[str] = field(default_factory=list)
    # Per cell, from the kernels: [row asked at, its s, direct, outcome asked at, its s, direct].
    writes: list[list] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)  # per cell, request to reply and idle

    @property
    def store_ms(self) -> list[float]:
        """Per cell: seconds until its running row was durable, plus until its outcome was (ms)."""
        return [(w[1] + w[4]) * 1000 for w in self.writes]

    def behind_a_hold(self, w: list) -> bool:
        """Whether one of the cell's two writes waited while the lock holder had the lock."""
        return any(start < released and start + seconds > got
                   for start, seconds in ((w[0], w[1]), (w[3], w[4])) for got, released in self.holds)

    def figures(self) -> dict:
        free = [(w[1] + w[4]) * 1000 for w in self.writes if not self.behind_a_hold(w)]
        direct = sum(w[2] for w in self.writes) + sum(w[5] for w in self.writes)
        return {
            "kernels": self.kernels, "cells per kernel": self.cells,
            "start of every kernel (s)": round(self.start_s, 1), "cell phase (s)": round(self.wall_s, 1),
            "lock holds": len(self.holds), "lock held (s)": round(sum(r - g for g, r in self.holds), 1),
            "cells lost": len(self.lost), "error replies": len(self.error_replies),
            "errors in kernel logs": len(self.log_errors),
            **{f"store cost per cell p{p} (ms)": _round(pct(self.store_ms, p)) for p in (50, 90, 99)},
            "store cost per cell max (ms)": _round(max(self.store_ms, default=None)),
            "cells with a write behind a hold": len(self.writes) - len(free),
            **{f"store cost per cell behind no hold p{p} (ms)": _round(pct(free, p)) for p in (50, 99)},
            "writes committed on the loop (direct)": f"{direct / max(1, 2 * len(self.writes)):.1%}",
            **{f"cell latency p{p} (ms)": _round(pct(self.latency_ms, p)) for p in (50, 99)},
        }


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _run_cell(kc, code: str, timeout: float) -> tuple[dict, float]:
    """The reply content and the seconds from the request to having both its reply and its idle."""
    start = time.perf_counter()
    msg_id = kc.execute(code)
    reply = idle = None
    deadline = time.monotonic() + timeout
    while reply is None or idle is None:
        left = max(0.01, deadline - time.monotonic())
        if idle is None:
            msg = kc.get_iopub_msg(timeout=left)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"]["execution_state"] == "idle":
                idle = msg
        elif reply is None:
            msg = kc.get_shell_msg(timeout=left)
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg
        if reply is None and kc.shell_channel.msg_ready():
            msg = kc.get_shell_msg(timeout=0)
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg
    return reply["content"], time.perf_counter() - start


def run(kernels: int, cells: int, *, db: Path, workdir: Path, hold: float = 2.0, gap: tuple[float, float] = (0.5, 5.0),
        standby: bool = False, seed: int | None = None, timeout: float = 600) -> Result:
    """Start `kernels` kernels on `db`, run `cells` cells on each at once with the lock holder
    beside them, shut them down, and check the file."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    result = Result(kernels, cells)
    config, timings = workdir / "config", workdir / "timings"
    config.mkdir(parents=True, exist_ok=True)
    timings.mkdir(exist_ok=True)
    (config / "jupyter_klbr_config.py").write_text(TIMED_STORE)
    env = {**os.environ, "KLBR_DB": str(db), "JUPYTER_CONFIG_DIR": str(config), TIMINGS: str(timings)}
    options = [] if standby else ["--Supervisor.standby=False"]
    ready = threading.Barrier(kernels + 1)
    go = threading.Event()
    finished = threading.Barrier(kernels + 1)
    replies: dict[int, list[dict]] = {k: [] for k in range(kernels)}
    failures: list[str] = []

    def one(k: int) -> None:
        """A kernel: started, then its cells once every kernel is up and the lock is held, then shut
        down. A failure is recorded and the thread still meets the others at each barrier."""
        km, kc = KernelManager(kernel_name="klbr"), None
        log = open(workdir / f"kernel{k}.log", "w")  # noqa: SIM115 — closed in the finally, after its kernel
        try:
            try:
                km.start_kernel(extra_arguments=options, env=env, stderr=log)
                kc = km.client()
                kc.start_channels()
                kc.wait_for_ready(timeout=timeout)
                _run_cell(kc, f"'kernel {k}'", timeout)
            except Exception as e:
                failures.append(f"kernel {k} did not start: {e!r}")
                kc = None
            ready.wait()
            go.wait()
            try:
                for i in range(cells if kc is not None else 0):
                    content, seconds = _run_cell(kc, f"{k} * 100000 + {i}", timeout)
                    replies[k].append(content)
                    result.latency_ms.append(seconds * 1000)
            except Exception as e:
                failures.append(f"kernel {k}, cell {len(replies[k])}: {e!r}")
            finished.wait()
        except threading.BrokenBarrierError:
            pass  # the run itself failed (see the main thread)
        finally:
            if kc is not None:
                kc.stop_channels()
            if km.has_kernel:
                km.shutdown_kernel()
            log.close()

    threads = [threading.Thread(target=one, args=(k,), name=f"kernel {k}") for k in range(kernels)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    holder = None
    try:
        ready.wait()
        result.start_s = time.perf_counter() - start
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER,  # noqa: S603 — our script and arguments
                                   str(db), str(hold), str(gap[0]), str(gap[1]),
                                   str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = holder.stdout.readline()  # the lock is held: the cells start behind it
        if first != "holding\n":
            msg = f"the lock holder did not take the lock: {first!r}"
            raise RuntimeError(msg)
        start = time.perf_counter()
        go.set()
        finished.wait()
        result.wall_s = time.perf_counter() - start
    finally:
        go.set()
        finished.abort()  # no effect once every thread has passed it; else they stop waiting
        if holder is not None:
            holder.stdin.close()
            for line in holder.stdout:
                if line.startswith("{"):
                    hold_ = json.loads(line)
                    result.holds.append((hold_["got"], hold_["released"]))
            holder.wait()
        for t in threads:
            t.join()
    result.lost += failures
    _check(result, db, replies, workdir, timings)
    return result


def _check(result: Result, db: Path, replies: dict[int, list[dict]], workdir: Path, timings: Path) -> None:
    """No cell lost, no error reply, the kernels' logs clean; the store's figures collected."""
    for k, contents in replies.items():
        result.replies += len(contents)
        if len(contents) != result.cells:
            result.lost.append(f"kernel {k}: {len(contents)} replies of {result.cells}")
        for content in contents:
            if content.get("status") != "ok":
                result.error_replies.append(f"kernel {k}: {content.get('ename')}: {content.get('evalue')}")
    conn = sqlite3.connect(db)
    try:
        sessions, open_ = conn.execute("SELECT count(*), count(*) - count(ended) FROM sessions").fetchone()
        if (sessions, open_) != (result.kernels, 0):
            result.lost.append(f"{sessions} sessions recorded, {open_} not ended, for {result.kernels} kernels")
        for k in range(result.kernels):
            like = f"{k} * 100000 + %"
            rows = conn.execute(
                "SELECT c.status, c.execution_count, (SELECT count(*) FROM outputs o WHERE o.cell_id = c.id)"
                " FROM cells c WHERE c.code LIKE ? ORDER BY c.id", (like,)).fetchall()
            good = [r for r in rows if r[0] == "ok" and r[2] == 1]
            if len(good) != result.cells or len(rows) != result.cells:
                result.lost.append(f"kernel {k}: {len(good)} complete rows of {result.cells} ({len(rows)} rows)")
    finally:
        conn.close()
    for log in sorted(workdir.glob("kernel*.log")):
        for line in log.read_text().splitlines():
            if "ERROR" in line or "Traceback" in line:
                result.log_errors.append(f"{log.name}: {line}")
    for path in timings.glob("*.json"):
        for writes in json.loads(path.read_text()).values():
            if None not in writes:
                result.writes.append(writes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=50)
    ap.add_argument("--cells", type=int, default=200, help="trivial cells per kernel")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds the third process holds the write lock")
    ap.add_argument("--gap", type=float, nargs=2, default=(0.5, 5.0), metavar=("MIN", "MAX"),
                    help="seconds between two holds, drawn uniformly")
    ap.add_argument("--standby", action="store_true", help="a warm spare per kernel too (the default config)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--out", default=str(HERE / "results" / "many_kernels.json"))
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="klbr-many-"))
    result = run(args.kernels, args.cells, db=workdir / "shared.sqlite3", workdir=workdir, hold=args.hold,
                 gap=tuple(args.gap), standby=args.standby, seed=args.seed)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    figures = result.figures()
    print(f"\nmany kernels, one file — {when} — {machine}\n")
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name.ljust(width)}  {value}")
    for what in (result.lost, result.error_replies, result.log_errors):
        for line in what[:20]:
            print("  " + line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": when, "machine": machine, "args": vars(args), "figures": figures,
                               "lost": result.lost, "error_replies": result.error_replies,
                               "log_errors": result.log_errors}, indent=1))
    if result.lost or result.error_replies:
        sys.exit(1)


if __name__ == "__main__":
    main()
