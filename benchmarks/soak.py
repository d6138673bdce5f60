"""The soak: `python benchmarks/soak.py [--cells 2000 --losses 100 --interrupts 200]`.

One klbr kernel runs trivial cells in rounds; rounds begin with a worker loss (alternately
`os._exit` and SIGKILL) and some end with a cell that prints that it sleeps and is interrupted once
it has (every other one sleeps beside four threads that keep the GIL busy). The client reads every message the kernel sends and counts them by the request they answer
(the parent header's msg_id): replies, busy and idle. The kernel process's fds, threads and RSS are
taken after the first 50 cells and at the end, each time with the same generations alive (all
answered, the warm spare ready); then its live descendants, and, once the kernel has shut down,
each cell's row in the store.

Prints the figures, and with `--ipykernel` the part that applies to plain ipykernel beside them (its
cells and interrupts; a lost ipykernel is a dead kernel). `run` is what `tests/test_soak.py` calls
and asserts on, at `make test` size and at full size.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from utils import start_kernel, status_table, until

MARKER = "klbr-soak: sleeping"
# A sleep beside threads that keep the GIL busy: an interrupt that lands on the main thread just
# before its sleep begins (the GIL's hand-over holds that moment open), or on one of these threads,
# used to leave the sleep running (see klbr_supervisor/boot/bootstrap.py, `interrupts_land`).
BUSY_SLEEP = f"""\
import threading, time
stop = threading.Event()
def spin():
    while not stop.is_set():
        pass
spinners = [threading.Thread(target=spin, daemon=True) for _ in range(4)]
for spinner in spinners:
    spinner.start()
try:
    print({MARKER!r}, flush=True)
    time.sleep(60)
finally:
    stop.set()
    for spinner in spinners:
        spinner.join()
"""
CODE = {
    "cell": "{n}",
    "sleep": f"import time\nprint({MARKER!r}, flush=True)\ntime.sleep(60)  # {{n}}",
    "busy sleep": BUSY_SLEEP.replace("{", "{{").replace("}", "}}") + "# {n}",
    "loss": "import os; os._exit(3)  # {n}",
    "kill": "import os; os.kill(os.getpid(), 9)  # {n}",
    "status": "%klbr status",
}
# A soak's losses are its point, not a crash loop: the restart budget must not end it.
OPTIONS = ["--Supervisor.restart_limit=100000"]
# What each kind of request is answered with, and the status of its row in the store (docs/errors.md, docs/store-schema.md).
EXPECTED = {
    "cell": ("ok", None, "ok"),
    "status": ("ok", None, "ok"),
    "sleep": ("error", "KeyboardInterrupt", "interrupted"),
    "busy sleep": ("error", "KeyboardInterrupt", "interrupted"),
    "loss": ("error", "WorkerLost", "lost"),
    "kill": ("error", "WorkerLost", "lost"),
    "interrupt": ("ok", None, None),  # a control request: no row
}


@dataclass
class Request:
    """One request of the soak, and everything the client received about it."""
    kind: str
    sent: float
    replies: list[tuple[float, dict]] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # busy / idle, in the order they came
    text: str = ""  # its stream output

    @property
    def done(self) -> bool:
        return bool(self.replies) and "idle" in self.states

    def wrong(self) -> str | None:
        """What is wrong with how this request was answered, or None."""
        if len(self.replies) != 1:
            return f"{len(self.replies)} replies"
        if self.states != ["busy", "idle"]:
            return f"status {self.states}"
        content = self.replies[0][1]["content"]
        status, ename, _ = EXPECTED[self.kind]
        if (content["status"], content.get("ename")) != (status, ename):
            return f"answered {content['status']} {content.get('ename')}, not {status} {ename}"
        return None


@dataclass(frozen=True)
class Footprint:
    fds: int
    threads: int
    rss_mib: float

    @classmethod
    def of(cls, pid: int) -> Footprint:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return cls(len(os.listdir(f"/proc/{pid}/fd")), int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024)

    def __str__(self) -> str:
        return f"{self.fds} fds, {self.threads} threads, {self.rss_mib:.1f} MiB"


def descendants(pid: int) -> list[str]:
    """The command lines of `pid`'s live descendants (zombies are not), read from /proc."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                for child in Path(f"/proc/{parent}/task/{task}/children").read_text().split():
                    stat = Path(f"/proc/{child}/stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
                        todo.append(int(child))
        except FileNotFoundError:  # ended meanwhile: not live
            continue
    return found


class Wire:
    """The soak's client: sends through a jupyter_client `KernelClient` and reads every message
    on shell, control and iopub, filed under the request it is about."""

    def __init__(self, kc):
        self.kc = kc
        self.requests: dict[str, Request] = {}
        self.strays: list[dict] = []  # messages about no request of this wire's
        self.shown = "unknown"  # the last status on iopub, whatever it is about: what a frontend shows
        self._open: set[str] = set()  # the requests without their reply or their idle yet
        self._channels = [kc.shell_channel, kc.control_channel, kc.iopub_channel]
        self._poller = zmq.Poller()
        for channel in self._channels:
            self._poller.register(channel.socket, zmq.POLLIN)

    def execute(self, kind: str, n: int) -> str:
        msg_id = self.kc.execute(CODE[kind].format(n=n), stop_on_error=False)
        self.requests[msg_id] = Request(kind, time.monotonic())
        self._open.add(msg_id)
        return msg_id

    def interrupt(self) -> str:
        msg = self.kc.session.msg("interrupt_request", {})
        self.requests[msg["header"]["msg_id"]] = Request("interrupt", time.monotonic())
        self._open.add(msg["header"]["msg_id"])
        self.kc.control_channel.send(msg)
        return msg["header"]["msg_id"]

    def until(self, check, what: str, timeout: float = 120) -> None:
        """Read messages until `check()` holds; fails after `timeout` s of it not holding."""
        deadline = time.monotonic() + timeout
        while not check():
            left = deadline - time.monotonic()
            assert left > 0, f"{what}: not within {timeout} s ({len(self.pending())} requests unanswered)"
            ready = dict(self._poller.poll(int(left * 1000) + 1))
            for channel in self._channels:
                while channel.socket in ready and channel.msg_ready():
                    self._file(channel.get_msg(), channel is self.kc.iopub_channel)

    def _file(self, msg: dict, iopub: bool) -> None:
        msg_id = msg["parent_header"].get("msg_id")
        req = self.requests.get(msg_id)
        if iopub and msg["msg_type"] == "status":
            self.shown = msg["content"]["execution_state"]
            if msg_id is None and self.shown == "busy":
                return  # klbr's busy after an answer given while a cell runs: no request's (semantics 1)
        if req is None:
            if msg["msg_type"] != "iopub_welcome" and msg["parent_header"].get("msg_type") != "kernel_info_request":
                self.strays.append(msg)  # (wait_for_ready's kernel_info may still be in flight)
        elif not iopub:
            req.replies.append((time.monotonic(), msg))
        elif msg["msg_type"] == "status":
            req.states.append(msg["content"]["execution_state"])
        elif msg["msg_type"] == "stream":
            req.text += msg["content"]["text"]
        if req is not None and req.done:
            self._open.discard(msg_id)

    def pending(self) -> list[str]:
        return list(self._open)

    def answered(self, msg_id: str | None = None) -> None:
        """Until `msg_id` (or every request so far) has its reply and its idle."""
        self.until(lambda: msg_id not in self._open if msg_id else not self._open, "answered")

    def spare_ready(self) -> bool:
        msg_id = self.execute("status", 0)
        self.answered(msg_id)
        return status_table(self.requests[msg_id].text).get("standby") == "ready"


def schedule(cells: int, losses: int, interrupts: int) -> list[str]:
    """The soak's executes in order: rounds of trivial cells, a round's loss first and its
    interrupted cell last, both spread evenly over the rounds."""
    rounds = max(losses, interrupts, 1)
    steps: list[str] = []
    for r in range(rounds):
        if losses * (r + 1) // rounds > losses * r // rounds:
            steps.append(("loss", "kill")[(losses * r // rounds) % 2])
        steps += ["cell"] * (cells * (r + 1) // rounds - cells * r // rounds)
        if interrupts * (r + 1) // rounds > interrupts * r // rounds:
            steps.append(("sleep", "busy sleep")[(interrupts * r // rounds) % 2])
    return steps


@dataclass
class Soak:
    """What a soak saw: every request as answered, the footprints, the store's rows."""
    kernel: str
    steps: int
    wall_s: float
    requests: dict[str, Request]
    strays: list[dict]
    shown: str  # the last status read, once everything was answered: what a frontend then shows
    baseline: Footprint
    end: Footprint
    descendants: list[str]
    rows: dict[str, list[str]] | None  # msg_id -> statuses of the session's rows for it (None: no store)
    endings: dict[str, int]  # the session's generations in the store, by how they ended ("lost", ...)
    recoveries: list[float]  # s from a loss sent to the reply of the next cell sent
    interrupts: list[float]  # s from an interrupt_request sent to the interrupted cell's reply

    def wrong_answers(self) -> dict[str, str]:
        return {f"{r.kind} {i}": w for i, r in self.requests.items() if (w := r.wrong())}

    def wrong_rows(self) -> dict[str, str]:
        """Requests whose rows in the store are not exactly one with the right status (and rows of
        the session that are no request's)."""
        expected = {i: EXPECTED[r.kind][2] for i, r in self.requests.items() if EXPECTED[r.kind][2]}
        wrong = {f"{self.requests[i].kind} {i}": f"rows {self.rows.get(i, [])}, not [{s!r}]"
                 for i, s in expected.items() if self.rows.get(i) != [s]}
        wrong.update({f"row {i}": f"{s} is no request's" for i, s in self.rows.items() if i not in expected})
        return wrong

    def figures(self) -> str:
        cells = sum(r.kind != "interrupt" for r in self.requests.values())
        replies = sum(len(r.replies) for r in self.requests.values())
        pairs = sum(r.states == ["busy", "idle"] for r in self.requests.values())
        lines = [f"{self.kernel}: {self.steps} cells of the soak in {self.wall_s:.1f} s ({self.steps / self.wall_s:.1f} "
                 f"cells/s); {len(self.requests)} requests ({cells} executes), {replies} replies, {pairs} busy/idle pairs, "
                 f"{len(self.strays)} stray messages",
                 f"  after the first 50 cells: {self.baseline}",
                 f"  at the end:               {self.end}  ({self.end.fds - self.baseline.fds:+d} fds, "
                 f"{self.end.threads - self.baseline.threads:+d} threads, {self.end.rss_mib - self.baseline.rss_mib:+.1f} MiB)",
                 f"  live descendants at the end: {len(self.descendants)}"]
        for what, values in (("loss sent -> next cell's reply", self.recoveries),
                             ("interrupt -> reply", self.interrupts)):
            if values:
                lines.append(f"  {what}: p50 {pct(values, 50) * 1000:.0f} ms, p95 {pct(values, 95) * 1000:.0f} ms "
                             f"({len(values)})")
        if self.rows is not None:
            lines.append(f"  store: {sum(map(len, self.rows.values()))} rows, {len(self.wrong_rows())} wrong; "
                         f"generations by how they ended: {self.endings}")
        return "\n".join(lines)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def run(cells: int, losses: int, interrupts: int, db: Path, kernel: str = "klbr", baseline_after: int = 50) -> Soak:
    """The soak on one kernel (`kernel`: a kernelspec; anything but klbr gets no losses, no spare
    to wait for, no store to read), recording into `db`."""
    klbr = kernel == "klbr"
    steps = schedule(cells, losses if klbr else 0, interrupts)
    recoveries, interrupted = [], []
    with start_kernel(kernel, extra_arguments=OPTIONS if klbr else [], env={"KLBR_DB": str(db)}) as (km, kc):
        pid = km.provisioner.process.pid
        wire = Wire(kc)

        def quiet() -> Footprint:
            wire.answered()
            if klbr:  # the same generations alive at each measure: the current one and a ready spare
                until(wire.spare_ready, 120, "the spare is ready")
            return Footprint.of(pid)

        started, loss_sent, baseline = time.monotonic(), None, None
        for n, kind in enumerate(steps, 1):
            if kind in ("loss", "kill"):
                wire.answered()  # a loss meets an idle kernel: its recovery is the loss's alone
            msg_id = wire.execute(kind, n)
            if kind in ("loss", "kill"):
                loss_sent = wire.requests[msg_id].sent
            elif loss_sent is not None:
                wire.answered(msg_id)
                recoveries.append(wire.requests[msg_id].replies[0][0] - loss_sent)
                loss_sent = None
            if kind in ("sleep", "busy sleep"):
                sleeping = wire.requests[msg_id]
                wire.until(lambda cell=sleeping: MARKER in cell.text, "the cell prints that it sleeps")
                interrupt = wire.interrupt()
                wire.answered(msg_id)
                wire.answered(interrupt)
                interrupted.append(sleeping.replies[0][0] - wire.requests[interrupt].sent)
            if n == baseline_after:
                baseline, loss_sent = quiet(), None
        end = quiet()
        wall = time.monotonic() - started
        family = descendants(pid)
        session = next(iter(wire.requests.values())).replies[0][1]["header"]["session"]
    rows, endings = None, {}
    if klbr:
        with sqlite3.connect(db) as con:
            rows = {}
            (sid,) = con.execute("SELECT id FROM sessions WHERE uuid = ?", (session,)).fetchone()
            for msg_id, status in con.execute("SELECT msg_id, status FROM cells WHERE session_id = ? ORDER BY id", (sid,)):
                rows.setdefault(msg_id, []).append(status)
            for (reason,) in con.execute("SELECT end_reason FROM generations WHERE session_id = ?", (sid,)):
                how = (reason or "not ended").split(":")[0]
                endings[how] = endings.get(how, 0) + 1
        con.close()
    return Soak(kernel, len(steps), wall, wire.requests, wire.strays, wire.shown, baseline or end, end, family, rows,
                endings, recoveries, interrupted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=2000)
    ap.add_argument("--losses", type=int, default=100)
    ap.add_argument("--interrupts", type=int, default=200)
    ap.add_argument("--ipykernel", action="store_true", help="run plain ipykernel's part beside it")
    args = ap.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="klbr-soak-") as tmp:
        for kernel in ("klbr", "python3") if args.ipykernel else ("klbr",):
            soak = run(args.cells, args.losses, args.interrupts, Path(tmp, f"{kernel}.sqlite3"), kernel)
            print(soak.figures())
            wrong = {**soak.wrong_answers(), **(soak.wrong_rows() if soak.rows is not None else {})}
            for what, how in wrong.items():
                print(f"  WRONG {what}: {how}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
