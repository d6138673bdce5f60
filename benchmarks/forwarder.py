"""The floor of any proxy kernel on this machine: plain ipykernel behind a C-level ZMQ forwarder.

`compare.py` runs it as a kernel (`python benchmarks/forwarder.py -f CONNECTION_FILE`). It binds
the frontend's channels, starts ipykernel on ipc sockets with the same key, and moves every message
with `zmq.proxy` in C threads: no Python runs per message, nothing is parsed, queued or recorded.
What it costs over ipykernel is what the extra process and hop alone cost; klbr's ratio is read
against it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

import zmq

CHANNELS = {"shell": 1, "control": 2, "stdin": 3, "iopub": 4, "hb": 5}


def url(info: dict, channel: str) -> str:
    if info.get("transport") == "ipc":
        return f"ipc://{info['ip']}-{info[channel + '_port']}"
    return f"tcp://{info['ip']}:{info[channel + '_port']}"


def main() -> None:
    with open(sys.argv[sys.argv.index("-f") + 1]) as f:
        front = json.load(f)
    runtime = tempfile.mkdtemp(prefix="klbr-bench-fwd-")
    back = dict(front, transport="ipc", ip=os.path.join(runtime, "k"),
                **{f"{name}_port": port for name, port in CHANNELS.items()})
    connection_file = os.path.join(runtime, "kernel.json")
    with open(connection_file, "w") as f:
        json.dump(back, f)
    worker = subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])
    context = zmq.Context()
    for name in CHANNELS:
        outer = context.socket(zmq.XPUB if name == "iopub" else zmq.ROUTER)
        outer.bind(url(front, name))
        # XSUB passes the frontend's subscriptions on (a plain SUB cannot, and its proxy spins).
        inner = context.socket(zmq.XSUB if name == "iopub" else zmq.DEALER)
        inner.connect(url(back, name))
        threading.Thread(target=zmq.proxy, args=(outer, inner), daemon=True).start()

    def stop(*_) -> None:
        worker.kill()
        worker.wait()
        for name in os.listdir(runtime):
            os.unlink(os.path.join(runtime, name))
        os.rmdir(runtime)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts go to the worker by message
    worker.wait()
    stop()


if __name__ == "__main__":
    main()
