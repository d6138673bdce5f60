"""What an idle kernel's resting spare costs when the kernel is used again (decision 73):
`python benchmarks/resting_spare.py [--rounds 5]`.

Each round, taking turns, on kernels that have run a cell and settled:
- *spare ready* (klbr as installed): a cell ends its worker (`os._exit(1)`), and the time from that
  cell's send to the next trivial cell's reply is taken: a lost worker -> next cell done;
- *spare resting* (klbr with `--Supervisor.standby_idle_timeout=5`, its spare rested before any
  cell): the same, the fatal cell being the first after the rest, the worst case (its spare has not
  started: a cold start replaces the worker);
- *plain ipykernel*: its restart by the frontend -> first cell (it never answers a lost cell; a
  restart is what a user does then).
Then, on the resting kernel, what a wake costs: the CPU seconds of the kernel's tree from the cell
after a rest until its new spare is ready, and its PSS before the rest, at rest and after the wake.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from footprint import kernelspecs, rested, tree_pss, workers  # benchmarks/ is no package
from measures import kernel, printed, run_cell, tree_cpu_s

FATAL = "import os; os._exit(1)"
# klbr whose spare rests after 5 s with no cell (long enough for a spare to be ready between the
# cells of a round on a busy machine), started 0.2 s after the cell that ends a rest.
RESTING = "klbr-bench-rest5"


def resting_kernelspec() -> None:
    """`RESTING`, beside the kernelspecs `footprint.kernelspecs` made (its JUPYTER_PATH entry)."""
    root = Path(os.environ["JUPYTER_PATH"].split(os.pathsep)[0]) / "kernels" / RESTING
    root.mkdir(parents=True)
    argv = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}", "--Supervisor.standby_idle_timeout=5",
            "--Supervisor.standby_delay=0.2"]
    (root / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": RESTING, "language": "python"}))


def _loss_to_next_cell(kc) -> float:
    start = time.perf_counter()
    msg_id = kc.execute(FATAL)
    while True:
        msg = kc.get_shell_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id:
            assert msg["content"].get("ename") == "WorkerLost", msg["content"]
            break
    run_cell(kc, "pass")
    return (time.perf_counter() - start) * 1000


def _standby(kc) -> str:
    """The `standby` row of `%klbr status` (a cell the proxy answers: it does not end a rest)."""
    return next(line.split(None, 1)[1] for line in printed(kc, "%klbr status").splitlines()
                if line.startswith("standby"))


def _until(kc, state: str, timeout: float = 60) -> None:
    """Until the `standby` row begins with `state`."""
    deadline = time.monotonic() + timeout
    while not _standby(kc).startswith(state):
        if time.monotonic() > deadline:
            msg = f"the spare is not {state}"
            raise TimeoutError(msg)
        time.sleep(0.05)


def round_of(figures: dict[str, list[float]]) -> None:
    with kernel("klbr") as (km, kc):
        run_cell(kc, "pass")
        _until(kc, "ready")
        figures["spare ready: loss → next cell done (ms)"].append(_loss_to_next_cell(kc))
    with kernel(RESTING) as (km, kc):
        _until(kc, "resting")  # no cell yet: idle since the start
        rested(km, 60)
        figures["spare resting: loss → next cell done (ms)"].append(_loss_to_next_cell(kc))  # the first cell
    with kernel(RESTING) as (km, kc):
        run_cell(kc, "pass")
        _until(kc, "ready")
        figures["kernel tree PSS, spare ready (MiB)"].append(tree_pss(km))
        _until(kc, "resting")
        rested(km, 60)
        figures["kernel tree PSS, spare resting (MiB)"].append(tree_pss(km))
        before = tree_cpu_s(km.provisioner.process.pid)
        run_cell(kc, "pass")
        _until(kc, "ready")
        figures["a wake: CPU until the spare is ready (s)"].append(tree_cpu_s(km.provisioner.process.pid) - before)
        assert workers(km) == 2
    with kernel("python3") as (km, kc):
        run_cell(kc, "pass")
        start = time.perf_counter()
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        run_cell(kc, "pass")
        figures["plain ipykernel: restart → first cell (ms)"].append((time.perf_counter() - start) * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    kernelspecs()
    resting_kernelspec()
    figures: dict[str, list[float]] = {name: [] for name in (
        "spare ready: loss → next cell done (ms)", "spare resting: loss → next cell done (ms)",
        "plain ipykernel: restart → first cell (ms)", "kernel tree PSS, spare ready (MiB)",
        "kernel tree PSS, spare resting (MiB)", "a wake: CPU until the spare is ready (s)")}
    for r in range(args.rounds):
        round_of(figures)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{args.rounds} rounds, medians (min-max):")
    for name, values in figures.items():
        print(f"- {name}: {statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})")


if __name__ == "__main__":
    main()
