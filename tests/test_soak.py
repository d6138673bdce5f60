"""A long session with worker losses and interrupts: every request answered once, and the kernel
process ends it as lean as it started (issue I, defect 12: each generation used to leave 6 fds,
2 threads and ~0.9 MiB behind)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import execute, standby, start_kernel, until

LOSSES = 30
CELLS_PER_ROUND = 10


def _footprint(pid: int) -> tuple[int, int, float]:
    """Open fds, threads and RSS (MiB) of a process."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    rss = int(status["VmRSS"].split()[0]) / 1024
    return len(os.listdir(f"/proc/{pid}/fd")), int(status["Threads"]), rss


def _answered(kc, ids: list[str], replies: dict[str, list[dict]], timeout: float = 120) -> None:
    """Read replies into `replies` until every one of `ids` has one (and whatever else arrives)."""
    deadline = time.monotonic() + timeout
    while any(i not in replies for i in ids):
        try:
            msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            missing = [i for i in ids if i not in replies]
            raise AssertionError(f"{len(missing)} of {len(ids)} requests unanswered, from #{ids.index(missing[0])}")
        replies.setdefault(msg["parent_header"]["msg_id"], []).append(msg)


def test_a_soak_of_cells_losses_and_interrupts_leaves_the_kernel_as_it_was():
    options = ["--Supervisor.restart_limit=1000", "--Supervisor.poison_after=0"]
    with start_kernel(extra_arguments=options) as (km, kc):
        proxy = km.provisioner.process.pid
        for code in ("1", "import os; os._exit(1)", "2", "import os; os.kill(os.getpid(), 9)", "3"):
            execute(kc, code)  # warm up: what every later generation reuses is in place
        # Measured with the same generations alive each time: the current one and a ready spare.
        until(lambda: standby(kc) == "ready", 60, "the spare is ready")
        before = _footprint(proxy)
        ids: list[str] = []
        replies: dict[str, list[dict]] = {}
        for round_ in range(LOSSES):
            ids += [kc.execute(f"{round_} * {i}") for i in range(CELLS_PER_ROUND)]
            if round_ % 3 == 0:  # an interrupt of a cell that runs
                msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(30)", stop_on_error=False)
                ids.append(msg_id)
                while True:
                    msg = kc.get_iopub_msg(timeout=30)
                    if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                        break
                km.interrupt_kernel()
            loss = "import os; os._exit(3)" if round_ % 2 else "import os; os.kill(os.getpid(), 9)"
            ids.append(kc.execute(loss, stop_on_error=False))
            _answered(kc, ids, replies)
        ids.append(kc.execute("'the end'"))
        _answered(kc, ids, replies)
        assert all(len(replies[i]) == 1 for i in ids), "a request answered more than once"
        statuses = [replies[i][0]["content"]["status"] for i in ids[:-1]]
        assert statuses.count("error") == LOSSES + len(range(0, LOSSES, 3))  # every loss and interrupt
        assert replies[ids[-1]][0]["content"]["status"] == "ok"
        while not (msg := kc.get_iopub_msg(timeout=60))["parent_header"].get("msg_id") == ids[-1] \
                or msg["msg_type"] != "status" or msg["content"]["execution_state"] != "idle":
            pass  # every request's iopub has been read: the kernel is idle
        until(lambda: standby(kc) == "ready", 60, "the spare is ready")
        after = _footprint(proxy)
    fds, threads, rss = (a - b for a, b in zip(after, before))
    print(f"kernel process after {LOSSES} losses: +{fds} fds, +{threads} threads, +{rss:.1f} MiB")
    assert fds <= 10 and threads <= 2 and rss <= 50, f"+{fds} fds, +{threads} threads, +{rss:.1f} MiB"
