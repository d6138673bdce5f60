"""Interrupts sent as soon as the worker says busy: `python benchmarks/interrupt_at_busy.py [--cells 300]`.

A klbr kernel (`local`) on a machine with two CPU-burning loops runs `time.sleep(30)` cells; as soon
as the worker's busy for one arrives, an `interrupt_request` goes. ipykernel publishes busy before it
installs its SIGINT handler, so a signal sent then may come while the worker still ignores it; klbr
sends it once the cell has begun (decision 68). Prints how the cells ended: `KeyboardInterrupt`
(namespace kept) or `WorkerKilled` (an interrupt that was lost), and how long the run took.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from utils import collect, cpu_burners, start_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    cells = parser.parse_args().cells
    ended: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as scratch, cpu_burners(2), \
            start_kernel(env={"KLBR_DB": str(Path(scratch, "log.sqlite3"))}) as (_, kc):
        started = time.monotonic()
        for _ in range(cells):
            msg_id = kc.execute("import time\ntime.sleep(30)")
            while True:
                msg = kc.get_iopub_msg(timeout=30)
                if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                        and msg["content"]["execution_state"] == "busy"):
                    break
            kc.control_channel.send(kc.session.msg("interrupt_request", {}))
            kc.control_channel.get_msg(timeout=30)
            reply, _ = collect(kc, msg_id, timeout=60)
            ended[reply["content"].get("ename", reply["content"]["status"])] += 1
        took = time.monotonic() - started
    print(f"{cells} cells interrupted at busy, beside two CPU burners: {dict(ended)} in {took:.1f} s")


if __name__ == "__main__":
    main()
