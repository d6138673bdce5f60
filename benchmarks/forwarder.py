"""The floor of any proxy kernel on this machine: plain ipykernel behind a C-level ZMQ forwarder.

`compare.py` runs it as a kernel (`python benchmarks/forwarder.py -f CONNECTION_FILE`). It binds
the frontend's channels, starts ipykernel on ipc sockets with the same key, and moves every message
with `zmq.proxy` in C threads: no Python runs per message, nothing is parsed, queued or recorded.
What it costs over ipykernel is what the extra process and hop alone cost; klbr's ratio is read
against it.

With ``--ssh CONFIG HOST PYTHON``, the ipykernel runs behind ssh instead, reached through the same
kind of Unix socket forwards klbr's `ssh://` placement uses (one ssh process, ``-L`` per channel):
the floor of any ssh-placed kernel. With ``--docker DOCKER IMAGE`` (DOCKER: the client's words,
comma-separated), in a container of IMAGE on ``--network none``, its ipc sockets in a mounted
directory, as klbr's `docker://` runs it; with ``--srun SRUN PYTHON``, as a Slurm job step on TCP with
CurveZMQ, as klbr's `slurm://` runs it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

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
    server_key = b""
    stop_also: list[str] = []
    if "--ssh" in sys.argv:
        config, host, python = sys.argv[sys.argv.index("--ssh") + 1:][:3]
        worker = _over_ssh(config, host, python, back, runtime)
    elif "--docker" in sys.argv:
        docker, image = sys.argv[sys.argv.index("--docker") + 1:][:2]
        container = f"klbr-floor-{secrets.token_hex(4)}"
        stop_also = [*docker.split(","), "rm", "-f", container]
        worker = subprocess.Popen([*docker.split(","), "run", "--rm", "-i", "--init", "--pull=never", "--network=none",  # noqa: S603 — our argv
                                   f"--name={container}", f"--volume={runtime}:{runtime}", image, "python3", "-m",
                                   "ipykernel_launcher", "-f", connection_file], stdin=subprocess.PIPE)
        _wait(lambda: all(os.path.exists(url(back, name)[len("ipc://"):]) for name in CHANNELS))
    elif "--srun" in sys.argv:
        srun, python = sys.argv[sys.argv.index("--srun") + 1:][:2]
        public, secret = zmq.curve_keypair()
        server_key = public
        # ports 0: ipykernel binds ports of its choosing and writes them into the file, as klbr's agent has it
        back = dict(back, transport="tcp", ip="127.0.0.1", curve_publickey=public.decode(),
                    curve_secretkey=secret.decode(), **{f"{name}_port": 0 for name in CHANNELS})
        with open(connection_file, "w") as f:
            json.dump(back, f)
        worker = subprocess.Popen([*srun.split(","), "--quiet", python, "-m", "ipykernel_launcher",  # noqa: S603 — our argv
                                   "-f", connection_file], stdin=subprocess.DEVNULL)
        _wait(lambda: _bound(connection_file))  # the job has started, its kernel bound its ports
        with open(connection_file) as f:
            bound = json.load(f)
        back = dict(back, **{f"{name}_port": bound[f"{name}_port"] for name in CHANNELS})
    else:
        worker = subprocess.Popen(  # noqa: S603 — our argv
            [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])
    context = zmq.Context()
    for name in CHANNELS:
        outer = context.socket(zmq.XPUB if name == "iopub" else zmq.ROUTER)
        outer.bind(url(front, name))
        # XSUB passes the frontend's subscriptions on (a plain SUB cannot, and its proxy spins).
        inner = context.socket(zmq.XSUB if name == "iopub" else zmq.DEALER)
        inner.setsockopt(zmq.RECONNECT_IVL, 10)  # as klbr's worker sockets: no 100 ms waits at start
        if server_key:
            public, secret = zmq.curve_keypair()
            inner.curve_publickey, inner.curve_secretkey, inner.curve_serverkey = public, secret, server_key
        inner.connect(url(back, name))
        threading.Thread(target=zmq.proxy, args=(outer, inner), daemon=True).start()

    def stop(*_) -> None:
        worker.kill()
        worker.wait()
        if stop_also:  # a container outlives its docker run
            subprocess.run(stop_also, capture_output=True, check=False)  # noqa: S603 — our argv
        shutil.rmtree(runtime, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts go to the worker by message
    worker.wait()
    stop()


def _wait(ready) -> None:
    """Until `ready()`: the kernel's sockets exist (a benchmark's own poll, as the ssh floor's script's)."""
    deadline = time.monotonic() + 120
    while not ready():
        assert time.monotonic() < deadline, "the floor's kernel did not start within 120 s"
        time.sleep(0.01)


def _bound(connection_file: str) -> bool:
    try:
        with open(connection_file) as f:
            info = json.load(f)
    except (ValueError, FileNotFoundError):  # being written (jupyter_core's secure_write removes it first)
        return False
    return all(info.get(f"{name}_port") for name in CHANNELS)


def _over_ssh(config: str, host: str, python: str, back: dict, runtime: str) -> subprocess.Popen:
    """ipykernel on HOST with `back`'s key, its channels forwarded to `back`'s local ipc paths."""
    # On the ssh host: a random name, which os.mkdir makes 0700 or fails on.
    remote = f"/tmp/klbr-floor-{secrets.token_hex(8)}"  # noqa: S108
    forwards = []
    for port in CHANNELS.values():
        forwards += ["-L", f"{back['ip']}-{port}:{remote}/k-{port}"]
    info = dict(back, ip=f"{remote}/k")
    # As klbr's agent does: ipykernel in a child, and word on stdout once its sockets exist, so that
    # no message goes into a forward whose far end is not there yet.
    script = (f"import atexit, json, os, shutil, subprocess, sys, time\nos.mkdir({remote!r}, 0o700)\n"
              f"atexit.register(shutil.rmtree, {remote!r}, True)\n"
              f"open({remote + '/kernel.json'!r}, 'w').write(json.dumps({info!r}))\n"
              "env = dict(os.environ, JPY_PARENT_PID=str(os.getpid()))\n"
              f"k = subprocess.Popen([sys.executable, '-m', 'ipykernel_launcher', '-f', {remote + '/kernel.json'!r}], env=env)\n"
              f"while not all(os.path.exists({remote!r} + f'/k-{{p}}') for p in range(1, 6)):\n"
              "    time.sleep(0.01)\n"
              "print('ready', flush=True)\n"
              "import threading  # ssh's end (stdin's) ends the floor's kernel too\n"
              "threading.Thread(target=lambda: (sys.stdin.read(), k.kill()), daemon=True).start()\n"
              "k.wait()\n")
    # The ssh on PATH, as klbr runs it, with our argv.
    ssh = subprocess.Popen(["ssh", "-F", config, "-T",  # noqa: S603, S607
                            "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
                            "-o", "StreamLocalBindMask=0177", "-o", "StreamLocalBindUnlink=yes", *forwards, host,
                            f'{python} -c "import sys;exec(sys.stdin.readline())"'],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ssh.stdin.write(f"exec({script!r})\n".encode())
    ssh.stdin.flush()
    ssh.stdout.readline()  # its sockets exist
    return ssh


if __name__ == "__main__":
    main()
