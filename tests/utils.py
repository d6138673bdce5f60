"""What the tests import: a klbr kernel and a client for it (`start_kernel`, `misbehaving`), a raw socket
on one of its channels, a request's reply and messages, `%klbr status`, the processes it leaves, a wait
for an event no message announces, a loaded machine. `conftest.py` holds the run's environment and the fixtures."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

import pytest
import zmq
from jupyter_client.manager import KernelManager
from jupyter_client.session import Session

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
THOROUGH = os.environ.get("KLBR_THOROUGH") == "1"


def thorough(test):
    """A test at a scale `make test` does not pay for: run only with KLBR_THOROUGH=1 (`-m thorough`
    selects just those)."""
    skip = pytest.mark.skipif(not THOROUGH, reason="opt-in: KLBR_THOROUGH=1 pytest -m thorough")
    return pytest.mark.thorough(skip(test))


@contextmanager
def cpu_burners(count: int = 2):
    """`count` processes that burn a core each while the block runs: the loaded machine a test must
    pass on (CI on a busy host, a laptop compiling)."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def benchmark(name: str):
    """`benchmarks/NAME.py` as a module: the driver of a measure that a test runs at a small size."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # a dataclass looks it up
    spec.loader.exec_module(module)
    return module


def misbehaving(behaviour: str, *options: str, env: dict | None = None, log: Path | None = None):
    """A klbr kernel whose workers are the misbehaving ipykernel of tests/workers."""
    return start_kernel(extra_arguments=[f"--Supervisor.worker_kernel=misbehaving-{behaviour}", *options],
                        env=env, log=log)


@contextmanager
def start_kernel(name: str = "klbr", extra_arguments: list[str] | None = None, env: dict | None = None,
                 stdin: bool = True, log: Path | None = None, manager: dict | None = None, cwd: Path | None = None):
    """A kernel and a client for it; `log` is a file for the kernel's stderr (its log), `manager`
    options for its `KernelManager` (transport, a session), `cwd` where it runs."""
    km = KernelManager(kernel_name=name, **(manager or {}))
    kw = {}
    if cwd is not None:
        kw["cwd"] = str(cwd)
    if env is not None:
        kw["env"] = {**os.environ, **env}
    if log is not None:
        kw["stderr"] = open(log, "w")  # noqa: SIM115 — the kernel's stderr for as long as it runs
    km.start_kernel(extra_arguments=extra_arguments or [], **kw)
    kc = km.client()
    kc.start_channels(stdin=stdin)
    try:
        kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel()
        if log is not None:
            kw["stderr"].close()


@contextmanager
def raw_socket(km, channel: str, identity: bytes | None = None, options: dict | None = None):
    """A socket of the test's own on one of the kernel's channels, and a Session signing with the
    kernel's key: for messages no jupyter_client call sends (hostile, resent, late). `options` are
    set before it connects (libzmq gives a pipe the high-water marks set when it is made)."""
    info = km.get_connection_info()
    sock = zmq.Context.instance().socket(zmq.SUB if channel == "iopub" else zmq.DEALER)
    sock.linger = 0
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if channel == "iopub":
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    port = info[f"{channel}_port"]
    sock.connect(f"ipc://{info['ip']}-{port}" if info["transport"] == "ipc" else f"tcp://{info['ip']}:{port}")
    try:
        yield sock, Session(key=info["key"].encode() if isinstance(info["key"], str) else info["key"],
                            signature_scheme=info["signature_scheme"])
    finally:
        sock.close()


def receive(sock, session, timeout: float = 10) -> dict:
    """The next message on a raw socket, deserialized (fails when none comes within `timeout`)."""
    assert sock.poll(int(timeout * 1000)), f"no message within {timeout} s"
    _, frames = session.feed_identities(sock.recv_multipart())
    return session.deserialize(frames)


def send_raw(sock, session, kind: str, content: dict | None = None, **header) -> dict:
    """Send a signed message whose header carries `header` on top of the usual fields; returns it."""
    msg = session.msg(kind, content if content is not None else {})
    msg["header"].update(header)
    sock.send_multipart(session.serialize(msg))
    return msg


def execute(kc, code: str, timeout: float = 30, seen: list | None = None, **kw) -> tuple[dict, list[dict]]:
    """Run `code`; return its execute_reply and the iopub messages of that request, busy to idle.
    `seen`, if given, receives every message read meanwhile (iopub and shell), whatever it is about."""
    msg_id = kc.execute(code, **kw)
    return collect(kc, msg_id, timeout, seen)


def collect(kc, msg_id: str, timeout: float = 30, seen: list | None = None) -> tuple[dict, list[dict]]:
    deadline = time.monotonic() + timeout
    outputs: list[dict] = []
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if seen is not None:
            seen.append(msg)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        outputs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:
        reply = kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if seen is not None:
            seen.append(reply)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply, outputs


def drain(channel, quiet: float = 0.5) -> list[dict]:
    """Every message a client channel still receives until it has been quiet for `quiet` seconds."""
    msgs = []
    while True:
        try:
            msgs.append(channel.get_msg(timeout=quiet))
        except Empty:
            return msgs


def worker_pid(kc) -> int:
    reply, outputs = execute(kc, "import os; os.getpid()")
    return int(next(m for m in outputs if m["msg_type"] == "execute_result")["content"]["data"]["text/plain"])


# A process that starts a kernel as Jupyter does (its own pid in the kernel's JPY_PARENT_PID), runs a
# cell whose value is a tuple of pids, prints the kernel's pid and those, and waits to be killed.
LAUNCHER = """
import sys
from jupyter_client import KernelManager
km = KernelManager(kernel_name=sys.argv[1])
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
msg_id = kc.execute(sys.argv[2])
while True:
    msg = kc.get_iopub_msg(timeout=30)
    if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
        break
print(km.provisioner.process.pid, *eval(msg["content"]["data"]["text/plain"]), flush=True)
sys.stdin.read()  # until the test kills this process
"""


@contextmanager
def launched(kernel: str, code: str, env: dict | None = None):
    """A launcher (`LAUNCHER`) of `kernel` that ran `code`: it, and the kernel's pid and the pids `code`
    gave; whatever of them is left is killed at the end."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, kernel, code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
    pids: list[int] = []
    try:
        pids = [int(word) for word in launcher.stdout.readline().split()]
        assert pids, "the launcher did not run its cell"
        yield launcher, pids
    finally:
        launcher.kill()
        launcher.wait()
        for pid in pids:
            kill_quietly(pid)


def hung_in_c(kc, where: Path) -> tuple[int, int]:
    """The worker's pid and a child it started, once a cell holds the GIL in C with SIGINT and SIGTERM
    blocked: ipykernel's parent poller cannot run. (No output can announce it: output needs the GIL.
    A file in `where` does.)"""
    pid = worker_pid(kc)
    _, outputs = execute(kc, "import subprocess\nchild = subprocess.Popen(['sleep', '600'])\nchild.pid")
    child = int(results(outputs)[0])
    hung = where / "hung"
    kc.execute("import ctypes, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
               f"open({str(hung)!r}, 'w').close()\nctypes.PyDLL(None).sleep(600)")
    until(hung.exists, 10, "the cell holds the GIL in C")
    return pid, child


def processes(match) -> list[int]:
    """The live processes whose command line (a list of its words, bytes) `match` accepts."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if match(words):
            found.append(int(pid))
    return found


def process_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once `pid` no longer exists (or is a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def results(outputs: list[dict]) -> list[str]:
    """The text/plain of each execute_result among a request's iopub messages."""
    return [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"]


def said(evalue: str) -> tuple[str, str]:
    """A klbr error's text as the cell shows it, in its two parts: the user's words (its first line:
    what happened, what was kept, what to do) and what follows (the way back, the operator's detail)."""
    user, _, rest = evalue.partition("\n")
    return user, rest


def stream_text(outputs: list[dict], name: str | None = None) -> str:
    """All the stream text (of one stream, if `name` is given) among a request's iopub messages."""
    return "".join(m["content"]["text"] for m in outputs
                   if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name))


def until(check, timeout: float, what: str):
    """Wait for `check()` to return something true (an event this test cannot subscribe to: a line
    in a log, a state in `%klbr status`); its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def interrupt_keeps_the_namespace(km, kc) -> None:
    """A cell that sleeps, interrupted once it has printed: KeyboardInterrupt, and the namespace as it was."""
    execute(kc, "kept = 41")
    msg_id = kc.execute("print('asleep', flush=True); import time; time.sleep(60)")
    wait_for_stream(kc, msg_id)
    km.interrupt_kernel()
    assert collect(kc, msg_id)[0]["content"]["ename"] == "KeyboardInterrupt"
    assert value(kc, "kept + 1") == 42


def status_row(kc, row: str, seen: list | None = None) -> str:
    """One row of `%klbr status` (a cell the proxy answers: no worker sees it); `seen` as for `execute`."""
    _, outputs = execute(kc, "%klbr status", seen=seen)
    for line in stream_text(outputs).splitlines():
        name, _, value = line.partition("  ")
        if name.strip() == row:
            return value.strip()
    raise AssertionError(f"no {row!r} in %klbr status")


def value(kc, expression: str, timeout: float = 30, seen: list | None = None):
    """The value of a Python `expression` in the worker, from the repr of its result (`seen` as
    `execute`'s)."""
    reply, outputs = execute(kc, expression, timeout=timeout, seen=seen)
    assert reply["content"]["status"] == "ok", reply["content"]
    (text,) = results(outputs)
    return eval(text)  # noqa: S307 — the repr of a value the test's own cell computed


def status_rows(kc) -> dict[str, str]:
    """All of `%klbr status`, row by row."""
    reply, outputs = execute(kc, "%klbr status")
    assert reply["content"]["status"] == "ok"
    return status_table(stream_text(outputs))


def status_table(text: str) -> dict[str, str]:
    """What `%klbr status` printed, row by row."""
    rows = [line.split(None, 1) for line in text.splitlines()]
    return dict(r if len(r) == 2 else (r[0], "") for r in rows)


def wait_for_stream(kc, msg_id: str) -> str:
    """Until the cell `msg_id` has printed something (it runs); what it printed."""
    while not ((m := kc.get_iopub_msg(timeout=30))["parent_header"].get("msg_id") == msg_id
               and m["msg_type"] == "stream"):
        pass
    return m["content"]["text"]


def standby(kc, seen: list | None = None) -> str:
    """The warm spare's state."""
    return status_row(kc, "standby", seen)


# -- host callbacks, as a cell makes them ---------------------------------------------------------

SPEND_THE_BUDGET = ("codes = []\nfor _ in range(129):\n    try:\n        host.keys(); codes.append('ok')\n"
                    "    except host.HostError as e:\n        codes.append(e.code)\n")


def host_call_codes(kc) -> list[str]:
    """What each of 129 host calls of one cell (one past the budget) ended with, in order."""
    execute(kc, SPEND_THE_BUDGET, timeout=60)
    return value(kc, "codes")


def notes_shown(kc, text: str) -> list[str]:
    """The markdown of what `host.notify(text)` displayed in its cell."""
    _, outputs = execute(kc, f"host.notify({text!r})")
    return [m["content"]["data"]["text/markdown"] for m in outputs if m["msg_type"] == "display_data"]


# -- the debugger (`Supervisor.debugger`) -----------------------------------------------------------

# The worker's modules of debugpy's (pydevd's come with it), loaded ones only: the bootstrap's
# `sys.modules["debugpy"] = None` is what keeps them out, and by default they load when first used.
DEBUGPY_LOADED = ("sorted(name for name, module in __import__('sys').modules.items() if module is not None "
                  "and name.split('.')[0] in ('debugpy', 'pydevd', '_pydevd_bundle', '_pydev_bundle'))")


def kernel_info(kc) -> dict:
    kc.kernel_info()
    return kc.get_shell_msg(timeout=10)["content"]


# What JupyterLab's debugger sends with its `initialize`.
DEBUG_INIT_ARGS = {"clientID": "test", "clientName": "klbr tests", "adapterID": "python", "pathFormat": "path",
                   "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True}


def debug_request(kc, command: str = "initialize", arguments: dict | None = None) -> dict:
    """A frontend's debug_request (by default JupyterLab's first, `initialize`), on control; its reply."""
    kc._debug_seq = getattr(kc, "_debug_seq", 0) + 1
    msg = kc.session.msg("debug_request", {
        "type": "request", "seq": kc._debug_seq, "command": command,
        "arguments": DEBUG_INIT_ARGS if command == "initialize" and arguments is None else arguments or {}})
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=20)
    assert reply["msg_type"] == "debug_reply" and reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    return reply["content"]


def assert_no_debugger(kc) -> None:
    """The worker behind `kc` has no debugpy, says so, answers a debug_request and runs cells."""
    assert value(kc, DEBUGPY_LOADED) == []
    info = kernel_info(kc)
    assert info["debugger"] is False and "debugger" not in info["supported_features"]
    assert debug_request(kc) == {}  # answered as ipykernel answers without debugpy: no content
    assert value(kc, "6 * 7") == 42
    reply, _ = execute(kc, "import debugpy")
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] in ("ImportError",
                                                                                   "ModuleNotFoundError")
    assert status_row(kc, "debugger") == "off (Supervisor.debugger=False)"
