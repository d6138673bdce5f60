"""How many of klbr's modules one message passes through, and how often control enters each.

The kernel runs under a profile hook on its loop thread (the thread everything of the proxy and the
supervisor runs on), switched on and off by signals around one piece of work, and every call made
in the window is recorded with the module it was made from and the module it enters. Two walks:

- `execute`: a trivial cell, from the execute_request's arrival to the idle after its reply (and
  what those set off on the loop before the window closes: the next request's pump, the grace timer);
- `death`: a worker SIGKILLed under a running cell, from the kill to the cell's error reply and idle
  (the exit seen, the drain, the end recorded, the handover, the answer, the spare taking over and
  the next spare's launch begun; its start goes on after the window).

For each it prints the modules visited, the entries into a module from another (a hop), the entries
of each module (how often one walk re-enters it), and the crossings between `klbr_kernel` and
`klbr_supervisor`. A call that only reads a property (a `Request`'s msg_type, a generation's pid) is
data, not a hop: it is counted apart. A module is named by its path, so the tool measures any layout
of the packages. The median of `--repeat` walks is printed; `--walk` prints one walk's hops in order.

    .venv/bin/python benchmarks/hops.py [--repeat 5] [--walk execute|death]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("klbr_kernel", "klbr_supervisor")


# -- inside the kernel process ------------------------------------------------------------------------

def _module_of(filename: str, cache: dict[str, str | None]) -> str | None:
    """The dotted name of a module of ours at `filename`, or None."""
    found = cache.get(filename, "")
    if found != "":
        return found
    parts = Path(filename).with_suffix("").parts
    name = None
    for i in range(len(parts) - 1, -1, -1):  # the source tree, or the strict install's link tree
        if parts[i] in PACKAGES:
            name = ".".join(parts[i:-1] if parts[-1] == "__init__" else parts[i:])
            break
    cache[filename] = name
    return name


def trace(out: str, argv: list[str]) -> None:
    """Run `python -m klbr_kernel ARGV` with the hook: SIGUSR1 starts a window, SIGUSR2 writes it to `out`."""
    cache: dict[str, str | None] = {}
    calls: list[tuple[str | None, str, str]] = []

    def hook(frame, event, _arg):
        if event != "call":
            return
        callee = _module_of(frame.f_code.co_filename, cache)
        if callee is None:
            return
        caller = None
        back = frame.f_back
        while back is not None:
            caller = _module_of(back.f_code.co_filename, cache)
            if caller is not None:
                break
            back = back.f_back
        calls.append((caller, callee, frame.f_code.co_qualname))

    def begin(_signum, _frame):
        calls.clear()
        sys.setprofile(hook)

    def end(_signum, _frame):
        sys.setprofile(None)
        Path(out + ".part").write_text(json.dumps(calls))
        os.replace(out + ".part", out)

    signal.signal(signal.SIGUSR1, begin)
    signal.signal(signal.SIGUSR2, end)
    sys.argv = ["klbr_kernel", *argv]
    runpy.run_module("klbr_kernel", run_name="__main__", alter_sys=True)


# -- the driver ------------------------------------------------------------------------------------------

def _accessor(module: str, qualname: str, known: dict[tuple[str, str], bool]) -> bool:
    """Whether `module`'s `qualname` is a property's getter: a read of data, not a hop."""
    key = (module, qualname)
    if key not in known:
        owner, _, name = qualname.rpartition(".")
        found = False
        if owner and "<" not in owner:
            try:
                cls = importlib.import_module(module)
                for part in owner.split("."):
                    cls = getattr(cls, part)
                found = isinstance(vars(cls).get(name), property)
            except (ImportError, AttributeError):
                found = False
        known[key] = found
    return known[key]


def summary(calls: list[list[str | None]], known: dict[tuple[str, str], bool]) -> dict[str, object]:
    """What one window's calls say: modules visited, hops, re-entries, kernel<->supervisor crossings."""
    visited = {callee for _, callee, _ in calls}
    entries: Counter[str] = Counter()
    reads = crossings = 0
    walk = []
    for caller, callee, qualname in calls:
        if caller == callee:
            continue
        if caller is not None and _accessor(callee, qualname, known):
            reads += 1
            continue
        entries[callee] += 1
        walk.append(f"{caller or '(loop)'} -> {callee}.{qualname}")
        if caller is not None and caller.split(".")[0] != callee.split(".")[0]:
            crossings += 1
    return {"modules": len(visited), "hops": sum(entries.values()), "crossings": crossings, "reads": reads,
            "entries": entries, "walk": walk, "visited": sorted(visited)}


def _kernelspec() -> str:
    root = Path(tempfile.mkdtemp(prefix="klbr-hops-"))
    out = root / "window.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--trace", str(out), "-f", "{connection_file}"]
    (root / "kernels" / "klbr-hops").mkdir(parents=True)
    (root / "kernels" / "klbr-hops" / "kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": "klbr-hops", "language": "python", "interrupt_mode": "message"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("JUPYTER_PATH")])])
    return str(out)


def _window(pid: int, out: str, work, after: float) -> list[list[str | None]]:
    """The calls the kernel `pid` made while `work()` ran, and for `after` seconds more."""
    Path(out).unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.05)  # the handler runs between two bytecodes of the loop: let it
    work()
    time.sleep(after)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not Path(out).exists():
        if time.monotonic() > deadline:
            msg = "the kernel wrote no window"
            raise TimeoutError(msg)
        time.sleep(0.05)
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--walk", choices=["execute", "death"], help="print one walk's hops in order")
    args = parser.parse_args()
    from measures import kernel, run_cell  # noqa: PLC0415 — never in the traced kernel's start

    sys.path.insert(0, str(ROOT))
    out = _kernelspec()
    known: dict[tuple[str, str], bool] = {}
    results: dict[str, list[dict[str, object]]] = {"execute": [], "death": []}
    with kernel("klbr-hops") as (km, kc):  # started, and settled: its spare runs
        pid = km.provisioner.process.pid
        for _ in range(10):
            run_cell(kc, "1")
        for _ in range(args.repeat):
            calls = _window(pid, out, lambda: run_cell(kc, "1"), 0.3)  # and what reply and idle set off
            results["execute"].append(summary(calls, known))
        for _ in range(args.repeat):
            msg_id = kc.execute("import os, time; print(os.getpid(), flush=True); time.sleep(60)")
            worker = None
            while worker is None:
                msg = kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                    worker = int(msg["content"]["text"].split()[0])

            def kill(worker: int = worker) -> None:
                os.kill(worker, signal.SIGKILL)
                _drain_until_error(kc)

            results["death"].append(summary(_window(pid, out, kill, 0.0), known))  # the spare's start goes on
            time.sleep(3)  # the next spare starts a moment after the new generation serves
            run_cell(kc, "1")
    for name, runs in results.items():
        print(f"{name}: modules {_median(runs, 'modules')}, hops {_median(runs, 'hops')}, kernel<->supervisor "
              f"crossings {_median(runs, 'crossings')}, property reads {_median(runs, 'reads')} "
              f"(median of {len(runs)})")
        typical = sorted(runs, key=lambda r: r["hops"])[len(runs) // 2]
        busiest = ", ".join(f"{m} {n}" for m, n in typical["entries"].most_common(6))
        print(f"  entries, most: {busiest}")
        print(f"  visited: {' '.join(typical['visited'])}")
        if args.walk == name:
            print("\n".join(f"    {hop}" for hop in typical["walk"]))


def _drain_until_error(kc) -> None:
    """Until the running cell's error reply and its idle."""
    reply = None
    while reply is None:
        msg = kc.get_shell_msg(timeout=60)
        if msg["msg_type"] == "execute_reply":
            reply = msg
    parent = reply["parent_header"]["msg_id"]
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if (msg["parent_header"].get("msg_id") == parent and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return


def _median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(run[key] for run in runs)  # type: ignore[misc]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--trace":
        trace(sys.argv[2], sys.argv[3:])
    else:
        main()
