"""What workers forked from a template would share: `python benchmarks/template_share.py [--workers 2]`.

The measurement behind the template paragraph of docs/decisions/65-memory-per-kernel.md, not part
of `make bench`. Two ways to have N idle ipykernel processes (a worker and a warm spare: N = 2)
from this venv:

- *fresh*: N processes started as klbr starts its workers today, each importing everything itself;
- *template*: one process imports what ipykernel's start imports (`ipykernel.kernelapp`, and
  IPython's shell through it), with no thread and no ZMQ context yet, calls `gc.freeze()`, and
  forks N children, each of which then starts its kernel (`IPKernelApp.launch_instance`): the
  imported pages stay shared copy-on-write until a child writes to them.

Each kernel then runs 5 trivial cells and everything settles 4 s; the figure is the PSS sum of every
process (the template included), from /proc/PID/smaps_rollup. The kinds take turns by round.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from jupyter_client.blocking import BlockingKernelClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from footprint import smaps
from measures import run_cell, scratch_dir

TEMPLATE = """
import gc, importlib, json, os, sys, threading
from ipykernel import kernelapp
for name in json.loads(os.environ.get("PRELOAD", "[]")):
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert threading.active_count() == 1, threading.enumerate()
gc.collect()
gc.freeze()
for path in sys.argv[1:]:
    if os.fork() == 0:
        kernelapp.IPKernelApp.launch_instance(argv=["-f", path, "--HistoryManager.enabled=False"])
        os._exit(0)
os.wait()
"""


def connection_file(root: Path, n: int) -> str:
    ports = []
    for _ in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    info = dict(zip(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"), ports, strict=True))
    info.update(ip="127.0.0.1", transport="tcp", key=secrets.token_hex(16), signature_scheme="hmac-sha256")
    path = root / f"kernel-{n}.json"
    path.write_text(json.dumps(info))
    return str(path)


def one(kind: str, workers: int, preload: list[str]) -> dict[str, float]:
    root = Path(scratch_dir(prefix="klbr-template-"))
    files = [connection_file(root, n) for n in range(workers)]
    if kind == "template":
        started = [subprocess.Popen([sys.executable, "-c", TEMPLATE, *files], start_new_session=True,  # noqa: S603 — this interpreter, our script
                                    env={**os.environ, "PRELOAD": json.dumps(preload)})]
    else:
        started = [subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f", path,  # noqa: S603 — this interpreter
                                     "--HistoryManager.enabled=False"], start_new_session=True) for path in files]
    try:
        for path in files:
            kc = BlockingKernelClient(connection_file=path)
            kc.load_connection_file()
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            for _ in range(5):
                run_cell(kc, "pass")
            kc.stop_channels()
        time.sleep(4)
        figures = {}
        for process in started:
            for p in [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]:
                role = "template" if kind == "template" and p.pid == process.pid else f"kernel {len(figures)}"
                figures[role] = smaps(p.pid)["PSS"]
        figures["total"] = sum(figures.values())
        return figures
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preload", help="a JSON list of modules the template imports too (a started kernel's "
                                      "sys.modules, say); else only ipykernel.kernelapp's")
    args = ap.parse_args()
    preload = json.loads(Path(args.preload).read_text()) if args.preload else []
    results: dict[str, list[dict[str, float]]] = {"fresh": [], "template": []}
    for r in range(args.rounds):
        for kind in (["fresh", "template"] if r % 2 == 0 else ["template", "fresh"]):
            results[kind].append(one(kind, args.workers, preload))
    for kind, rounds in results.items():
        print(f"{args.workers} idle kernels, {kind}, PSS (MiB): " + ", ".join(
            f"{role} {statistics.median(r[role] for r in rounds):.1f}" for role in rounds[0]))


if __name__ == "__main__":
    main()
