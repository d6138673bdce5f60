"""The agent a generation runs where its kernel runs (an ``ssh://`` remote, a ``docker://`` container,
a ``slurm://`` job step): standard library only.

Its source is sent over the stdin of what starts it (ssh, ``docker run -i``, ``srun``), as one line the
command executes (see `agent_launch`), so nothing of klbr needs to be installed there and nothing
secret is in any command line. Then, on stdin, JSON lines: ``{"start_z": ...}`` (its directory, the
fresh key, the worker's bootstrap and arguments, the channels' ports, the lease, the memory limit or
none, the kernel's working directory or none for the home directory, and for a kernel reached over TCP
the address to listen on and its CurveZMQ keys: JSON, zlib-compressed and base64,
`agent_launch.start_line`), later ``{"lease": 1}`` (renewed every second) and
``{"signal": N}``. On stdout: ``{"started": PID}`` once the kernel's sockets exist (over TCP, with the
ports it bound, read from the connection file ipykernel writes again once it has them), and ``{"exited": STATUS, "oom_killed": BOOL}`` if it exits (whether the kernel
of its memory cgroup counted an OOM kill meanwhile: a container's limit); ``{"failed": TEXT}`` instead
when the interpreter has no ipykernel, or no CurveZMQ for TCP.

The start may carry the host channel: its credentials (the endpoint a Unix socket forwarded or
mounted from the supervisor's, or its TCP endpoint), which go into the kernel's environment, and the
host client's files, which go into ``client`` in its directory, last on the kernel's PYTHONPATH (a
klbr installed there still wins); both go with the directory, and a forwarded socket's path with them.

It makes a 0700 directory with the connection file (0600; ipc sockets beside it, which ssh forwards
to the kernel's own runtime directory, or which a container shares through a mount), starts
ipykernel in its own process group and relays signals to that group. It kills the group and removes
the directory when the kernel exits, when stdin ends (what started it is gone), when the lease runs
out (a link that stalled), or when SIGTERM or SIGHUP ends the agent itself (a cancelled job step,
``docker stop``), after which it dies of that signal: a lost link never leaves a kernel running past
its lease, and an agent ended from outside leaves no directory behind.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any

# What ends the agent from outside: a job step's cancel, time limit or preemption (SIGTERM, then
# SIGKILL once the scheduler's grace is over), ``docker stop``, a terminal's hangup. Its handler only
# queues it, for the agent to end as at stdin's end where it waits: a cleanup under way is never cut
# short, nor a kernel left half started.
if sys.platform == "win32":  # no agent runs there; this is for type checks of that platform
    ENDING: tuple[int, ...] = (signal.SIGTERM,)
else:
    ENDING = (signal.SIGTERM, signal.SIGHUP)
if TYPE_CHECKING:  # a remote's Python may be older than klbr's: no `X | Y` at run time
    # ("line", a line of stdin), ("eof", None) once it ends, ("exit", the kernel's exit status),
    # ("ended", the signal of ENDING that came): a SimpleQueue, whose put a signal handler may call.
    Events = queue.SimpleQueue[tuple[str, str | int | None]]


# A kernel that dies of these, and not by the supervisor's hand (a generation's stop relays SIGTERM),
# may have had them with the agent (a job step's cancel signals every process of the step): its exit
# is reported only if none comes for the agent within `ENDED_TOO`.
# Reported, it would be a WorkerLost, and the next cell a new job, where a cancelled step is a lost
# placement for the user to take up again.
OUTSIDE = tuple(-sig for sig in ENDING)
ENDED_TOO = 1.0


def _ended_too(events: Events) -> bool:
    """Whether the agent is ended too (a signal of `ENDING`, or stdin's end) within `ENDED_TOO`."""
    deadline = time.monotonic() + ENDED_TOO
    while True:
        try:
            kind, _ = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return False
        if kind in ("ended", "eof"):
            return True


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


def _oom_kills() -> int:
    """The OOM kills the memory cgroup this agent is in has counted (cgroup v2's memory.events, or
    v1's memory.oom_control); 0 where neither can be read."""
    for path, in_v2 in (("/sys/fs/cgroup/memory.events", True), ("/sys/fs/cgroup/memory/memory.oom_control", False)):
        try:
            with open(path) as f:
                for line in f:
                    name, _, count = line.partition(" ")
                    if name == "oom_kill":
                        return int(count)
        except (OSError, ValueError):
            continue
        if in_v2:
            return 0
    return 0


def _serves_curve() -> bool:
    """Whether this ipykernel takes CurveZMQ keys from its connection file (7.x does; 6.x would
    ignore them and serve in the clear, where no client of ours could connect). Read from its
    source, not imported: importing it costs the start as much as the kernel's own import."""
    spec = importlib.util.find_spec("ipykernel.kernelapp")
    try:
        with open(spec.origin if spec is not None and spec.origin else "", encoding="utf-8") as f:
            return "curve_secretkey" in f.read()
    except OSError:
        return False


def _bound(connection: str, channels: dict[str, int]) -> dict[str, int] | None:
    """The TCP ports the kernel bound, once it has written them into its connection file (ipykernel
    binds ports of the system's choosing for those given as 0, then writes the file again with them:
    no port is chosen before it is bound, so none is taken by another process in between)."""
    try:
        with open(connection, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):  # not written again yet, or being written
        return None
    ports = {name: int(info.get(f"{name}_port") or 0) for name in channels}
    return ports if all(ports.values()) else None


def _connection(start: dict[str, Any], where: str) -> dict[str, Any]:
    """The kernel's connection file: ipc sockets in `where`, or TCP ports on the start's address,
    served with CurveZMQ (a node's kernel is reached over a network)."""
    info: dict[str, Any] = {"key": start["key"], "signature_scheme": start["signature_scheme"],
                            "kernel_name": "klbr-agent"}
    if start.get("transport") == "tcp":
        # The node's address as the cluster knows it (its slurmd's node name), else its host name's.
        ip = start["ip"] or socket.gethostbyname(os.environ.get("SLURMD_NODENAME") or socket.gethostname())
        info.update({"transport": "tcp", "ip": ip, "curve_publickey": start["curve_publickey"],
                     "curve_secretkey": start["curve_secretkey"]})
        info.update({f"{name}_port": 0 for name in start["channels"]})  # the kernel's choice: `_bound`
    else:
        info.update({"transport": "ipc", "ip": os.path.join(where, "k")})
        info.update({f"{name}_port": port for name, port in start["channels"].items()})
    return info


def main() -> int | None:
    """Serve the start that comes first on stdin; the signal of `ENDING` that ended it, if one did."""
    events: Events = queue.SimpleQueue()
    ended: list[int] = []

    def end(signum: int, _frame: object) -> None:
        for sig in ENDING:
            signal.signal(sig, signal.SIG_IGN)  # the first one ends it
        ended.append(signum)
        events.put(("ended", signum))

    def read() -> None:
        for line in sys.stdin:
            events.put(("line", line))
        events.put(("eof", None))

    for sig in ENDING:
        signal.signal(sig, end)
    threading.Thread(target=read, daemon=True).start()
    kind, line = events.get()
    if kind == "line":
        assert isinstance(line, str)  # a "line" event carries its line
        start = json.loads(zlib.decompress(base64.b64decode(json.loads(line)["start_z"])))
        try:
            _serve(start, events)
        finally:
            if start.get("host_socket"):
                try:
                    os.unlink(start["host_socket"])  # sshd binds it as ssh connects, and leaves it behind
                except OSError:
                    pass
    return ended[0] if ended else None


def _serve(start: dict[str, Any], events: Events) -> None:
    """Run the kernel `start` asks for until it exits, stdin ends or the lease runs out, or say
    why it cannot start; its directory goes with it."""
    if start.get("memory_limit"):  # the bootstrap sets it, as a local one does (`worker.MEMORY_LIMIT`)
        os.environ["KLBR_MEMORY_LIMIT"] = str(start["memory_limit"])
    where = start["dir"]
    if importlib.util.find_spec("ipykernel_launcher") is None:
        _say(failed=f"{sys.executable} has no ipykernel; install it there ({sys.executable} -m pip install ipykernel)")
        return
    if start.get("transport") == "tcp" and not _serves_curve():
        _say(failed=f"the ipykernel of {sys.executable} cannot serve CurveZMQ, which a kernel reached over a "
                    f"network needs: install ipykernel 7 or later there ({sys.executable} -m pip install -U ipykernel)")
        return
    os.mkdir(where, 0o700)  # fails if it exists: a directory of its own, never someone else's
    proc = None
    try:
        connection = os.path.join(where, "kernel.json")
        info = _connection(start, where)
        oom_kills = _oom_kills()
        fd = os.open(connection, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        proc = subprocess.Popen(  # noqa: S603 — this interpreter and klbr's worker bootstrap, no shell
            [sys.executable, "-c", start["bootstrap"], "-f", connection, *start["args"]],
            stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
            start_new_session=True, cwd=start.get("cwd") or os.path.expanduser("~"),
            # its parent poller ends it if the agent is gone, as a frontend's would
            env={**os.environ, "JPY_PARENT_PID": str(os.getpid()), **_host_channel(start, where)})
        threading.Thread(target=lambda: events.put(("exit", proc.wait())), daemon=True).start()
        sockets = [f"{info['ip']}-{port}" for port in start["channels"].values()]
        ports: dict[str, int] | None = dict(start["channels"])
        lease = float(start["lease"])
        deadline = time.monotonic() + lease
        started = False
        relayed: set[int] = set()  # the supervisor's signals: a kernel that dies of one is its doing (a stop)
        while True:
            if not started and info["transport"] == "tcp":
                ports = _bound(connection, start["channels"])
            if not started and ports is not None and (info["transport"] == "tcp" or all(map(os.path.exists, sockets))):
                started = True
                _say(started=proc.pid, ports=ports, ip=info["ip"])
            wait = deadline - time.monotonic() if started else min(0.02, deadline - time.monotonic())
            try:
                kind, value = events.get(timeout=max(0.0, wait))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    sys.stderr.write("klbr agent: no word from the kernel for its lease: ending it\n")
                    return
                continue
            if kind == "exit":
                assert isinstance(value, int)  # an "exit" event carries the kernel's exit status
                if not (value in OUTSIDE and -value not in relayed and _ended_too(events)):
                    _say(exited=value, oom_killed=_oom_kills() > oom_kills)
                return
            if kind in ("eof", "ended"):
                return
            assert isinstance(value, str)  # a "line" event carries its line
            try:
                message = json.loads(value)
            except ValueError:
                continue
            if "lease" in message:
                deadline = time.monotonic() + lease
            if "signal" in message:
                relayed.add(int(message["signal"]))
                _killpg(proc.pid, int(message["signal"]))
    finally:
        if proc is not None:
            _killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ending = main()
    if ending is not None:  # its kernel, directory and host socket are gone: now the agent, by that signal
        sys.stderr.write(f"klbr agent: ended by {signal.Signals(ending).name}; its kernel, if it had one, with it\n")
        signal.signal(ending, signal.SIG_DFL)
        os.kill(os.getpid(), ending)
        sys.exit(128 + ending)  # as PID 1 of a container (`--init=false`), which its own signal does not end
