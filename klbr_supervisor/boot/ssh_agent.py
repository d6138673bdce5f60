"""The agent an ``ssh://`` generation runs on the remote host: standard library only.

Its source is sent over ssh's stdin, as one line the remote command executes (see
`ssh_launch.REMOTE`), so nothing of klbr needs to be installed there and nothing secret is in any
command line. Then, on stdin, JSON lines: ``{"start": {...}}`` (its directory, the fresh key, the
worker's bootstrap and arguments, the channels' ports, the lease, the memory limit or none), later ``{"lease": 1}``
(renewed every second) and ``{"signal": N}``. On stdout:
``{"started": PID}`` once the kernel's sockets exist, and ``{"exited": STATUS}`` if it exits;
``{"failed": TEXT}`` instead when the interpreter has no ipykernel.

The start may carry the host channel: its credentials (the endpoint a Unix socket ssh forwards back
to the supervisor's), which go into the kernel's environment, and the host client's files, which
go into ``client`` in its directory, last on the kernel's PYTHONPATH (a klbr installed there still
wins); both go with the directory, and the forwarded socket's path with them.

It makes a 0700 directory with the connection file (0600, ipc sockets beside it, which ssh forwards
to the kernel's own runtime directory), starts ipykernel in its own process group and relays signals
to that group. It kills the group and removes the directory when the kernel exits, when stdin ends
(ssh gone), or when the lease runs out (a link that stalled): a lost link never leaves a kernel
running past its lease.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any


def _say(**message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _host_channel(start: dict[str, Any], where: str) -> dict[str, str]:
    """What the kernel's environment gets of the host channel: its credentials (the endpoint the
    socket ssh forwards back) and the host client, placed in `where`, last on its path."""
    if "host" not in start:
        return {}
    placed = os.path.join(where, "client")
    for name, text in start["client"].items():
        path = os.path.join(placed, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    env = dict(start["host"])
    if start["client"]:
        before = os.environ.get("PYTHONPATH", "")
        env["PYTHONPATH"] = before + os.pathsep + placed if before else placed
    return env


def main() -> None:
    # ("line", a line of stdin), ("eof", None) once it ends, ("exit", the kernel's exit status)
    events: queue.Queue[tuple[str, str | int | None]] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            events.put(("line", line))
        events.put(("eof", None))

    threading.Thread(target=read, daemon=True).start()
    kind, line = events.get()
    if kind != "line":
        return
    assert isinstance(line, str)  # a "line" event carries its line
    start = json.loads(line)["start"]
    if start.get("memory_limit"):  # the bootstrap sets it, as a local one does (`worker.MEMORY_LIMIT`)
        os.environ["KLBR_MEMORY_LIMIT"] = str(start["memory_limit"])
    where = start["dir"]
    if importlib.util.find_spec("ipykernel_launcher") is None:
        _say(failed=f"{sys.executable} has no ipykernel; install it there ({sys.executable} -m pip install ipykernel)")
        return
    os.mkdir(where, 0o700)  # fails if it exists: a directory of its own, never someone else's
    proc = None
    try:
        connection = os.path.join(where, "kernel.json")
        info = {"transport": "ipc", "ip": os.path.join(where, "k"), "key": start["key"],
                "signature_scheme": start["signature_scheme"], "kernel_name": "klbr-ssh"}
        info.update({f"{name}_port": port for name, port in start["channels"].items()})
        fd = os.open(connection, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        proc = subprocess.Popen(  # noqa: S603 — this interpreter and klbr's worker bootstrap, no shell
            [sys.executable, "-c", start["bootstrap"], "-f", connection, *start["args"]],
            stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
            start_new_session=True, cwd=os.path.expanduser("~"),
            # its parent poller ends it if the agent is gone, as a frontend's would
            env={**os.environ, "JPY_PARENT_PID": str(os.getpid()), **_host_channel(start, where)})
        threading.Thread(target=lambda: events.put(("exit", proc.wait())), daemon=True).start()
        sockets = [f"{info['ip']}-{port}" for port in start["channels"].values()]
        lease = float(start["lease"])
        deadline = time.monotonic() + lease
        started = False
        while True:
            if not started and all(os.path.exists(s) for s in sockets):
                started = True
                _say(started=proc.pid)
            wait = deadline - time.monotonic() if started else min(0.02, deadline - time.monotonic())
            try:
                kind, value = events.get(timeout=max(0.0, wait))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    sys.stderr.write("klbr agent: no word from the kernel for its lease: ending it\n")
                    return
                continue
            if kind == "exit":
                _say(exited=value)
                return
            if kind == "eof":
                return
            assert isinstance(value, str)  # a "line" event carries its line
            try:
                message = json.loads(value)
            except ValueError:
                continue
            if "lease" in message:
                deadline = time.monotonic() + lease
            if "signal" in message:
                _killpg(proc.pid, int(message["signal"]))
    finally:
        if proc is not None:
            _killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)
        if start.get("host_socket"):
            try:
                os.unlink(start["host_socket"])  # sshd may leave its listener's path behind
            except OSError:
                pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main()
