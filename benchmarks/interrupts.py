"""Interrupts that land as the main thread goes to sleep: `python benchmarks/interrupts.py [--signals 1000]`.

A process whose main thread says it is about to sleep (a line on a pipe), then sleeps for a minute,
beside threads that keep the GIL busy, on a machine with two CPU-burning loops. Right after each
line comes a process-directed SIGINT, as jupyter_client interrupts a kernel; a sleep it has not ended
within 2 s is missed (then signalled again, so the run goes on). Side by side, interleaved in rounds:
SIGINT's handler as ipykernel installs it for a cell, and as a klbr worker installs it (the
bootstrap's `interrupts_land`, which sends a signal the main thread has not taken again; see
klbr_supervisor/boot/bootstrap.py). Prints what each missed and how long a signal took to end a sleep.
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from utils import cpu_burners

SLEEPER = """\
import os, signal, sys, threading, time
if sys.argv[1] == "klbr":
    from klbr_supervisor.boot.bootstrap import interrupts_land
    interrupts_land()
signal.signal(signal.SIGINT, signal.default_int_handler)  # ipykernel's pre_handler_hook, for a cell
def spin():
    while True:
        pass
for _ in range(int(sys.argv[2])):
    threading.Thread(target=spin, daemon=True).start()
said = os.fdopen(int(sys.argv[3]), "w", buffering=1)
interrupted = 0
while True:
    try:
        said.write(f"ready {interrupted}\\n")
        time.sleep(60)
    except KeyboardInterrupt:
        interrupted += 1
"""


def signals(handler: str, count: int, spinners: int) -> tuple[int, list[float]]:
    """(sleeps missed, seconds from each signal to its KeyboardInterrupt) for `count` signals."""
    read, write = os.pipe()
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER, handler, str(spinners), str(write)],  # noqa: S603 — our own argv
                               pass_fds=(write,), start_new_session=True, cwd=ROOT)
    os.close(write)
    missed, took = 0, []
    with os.fdopen(read) as said:
        try:
            assert said.readline() == "ready 0\n"
            for sent in range(1, count + 1):
                os.killpg(sleeper.pid, signal.SIGINT)
                started, interrupted, limit = time.monotonic(), 0, 2.0
                while interrupted < sent:
                    if not select.select([said], [], [], limit)[0]:
                        missed += 1
                        os.killpg(sleeper.pid, signal.SIGINT)  # and again, for the run to go on
                        limit = 60.0
                        continue
                    interrupted = int(said.readline().split()[1])
                assert interrupted == sent, f"{interrupted} KeyboardInterrupts for {sent} signals"
                took.append(time.monotonic() - started)
        finally:
            sleeper.kill()
            sleeper.wait()
    return missed, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--signals", type=int, default=1000, help="per handler")
    ap.add_argument("--spinners", type=int, default=4, help="threads that keep the GIL busy")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; {args.signals} "
          f"signals per handler in {args.rounds} rounds, {args.spinners} busy threads, two CPU burners")
    totals: dict[str, tuple[int, list[float]]] = {"ipykernel": (0, []), "klbr": (0, [])}
    with cpu_burners(2):
        for _ in range(args.rounds):
            for handler in totals:
                missed, took = signals(handler, args.signals // args.rounds, args.spinners)
                totals[handler] = (totals[handler][0] + missed, totals[handler][1] + took)
    for handler, (missed, took) in totals.items():
        took.sort()
        print(f"  {handler:9}  missed {missed:3d} of {len(took)}; signal -> KeyboardInterrupt p50 "
              f"{took[len(took) // 2] * 1000:.2f} ms, p99 {took[len(took) * 99 // 100] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
