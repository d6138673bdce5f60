"""A real ipykernel whose worker misbehaves on purpose, for the supervisor's fault tests.

    python ipykernel_misbehaving.py BEHAVIOUR [MARKER] -f CONNECTION_FILE

The kernel runs cells normally; the cell `misbehave()` triggers BEHAVIOUR (for "complete", the first
complete_request does, once per MARKER file; for "drops-is-complete", every is_complete_request does:
ipykernel logs the handler's exception and never replies; for "drops-idle", every is_complete_request
is replied to and its idle never published, as by a worker whose iopub lost it; for "small-iopub-queue", the
cell runs normally, on a worker whose iopub queue holds 20 messages: past it, while no one reads, it
drops what it publishes, as any ipykernel does past its 1000). ("exit-after-reply" also does so
after replying to a complete_request for the code `misbehave`.) Each behaviour is a way real workers die,
hang or fail. "noisy" prints to stderr as it starts, about no request at all.
"late-stdin" misbehaves at start-up instead: its stdin is bound once, half a second after the kernel
serves shell. That is what a slow machine can make of any worker as the supervisor sees it (its
connection to stdin is still waiting on a retry timer when shell already answers), made certain:
shell answers kernel_info while stdin cannot be connected at all.

With KLBR_TEST_START_GATE naming a file, a worker that starts while that file exists waits until it
is gone: a test holds the next generation back while it makes something happen between two.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import zmq
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp

BEHAVIOUR = sys.argv.pop(1)
MARKER = sys.argv.pop(1) if BEHAVIOUR == "complete" else None


def misbehave(go: str | None = None, lines: int = 2000, announce: str | None = None) -> None:
    """`announce`, if given, is a file touched just before the misbehaviour starts (for a test to wait on:
    output is no sign, since a worker that hangs holding the GIL never gets it out)."""
    if announce is not None and BEHAVIOUR != "hang-in-c":
        Path(announce).touch()
    if BEHAVIOUR == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif BEHAVIOUR == "exit":
        os._exit(3)
    elif BEHAVIOUR == "segfault":
        ctypes.string_at(0)
    elif BEHAVIOUR == "ignore-sigint":
        while True:  # SIGINT is ignored by this worker: only a kill ends this
            time.sleep(0.01)
    elif BEHAVIOUR == "hang-in-c":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        if announce is not None:
            Path(announce).touch()  # now an interrupt can only be ignored
        ctypes.PyDLL(None).sleep(600)  # holds the GIL: no Python thread runs again
    elif BEHAVIOUR == "die-in-output":
        chunk = "y" * 65536
        for _ in range(20):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        time.sleep(0.3)  # on the wire by now: the supervisor must deliver it
        for _ in range(20):
            sys.stdout.write("z" * 65536)  # still buffered when the worker dies: lost with it
        os.kill(os.getpid(), signal.SIGKILL)
    elif BEHAVIOUR == "output-then-die":
        # Output, and death the instant all of it is on the wire: the IOPub thread stops and its own
        # context is destroyed, which returns once every queued message is written to the socket.
        # With `go`, first wait for that file (so a test can stop the kernel process meanwhile).
        while go is not None and not os.path.exists(go):
            time.sleep(0.01)
        for i in range(lines):
            print(f"line {i}", flush=True)
        app = MisbehavingApp.instance()
        app.iopub_thread.stop()
        app.iopub_context.destroy(linger=10_000)
        os.kill(os.getpid(), signal.SIGKILL)


class MisbehavingKernel(IPythonKernel):
    implementation = "ipykernel-misbehaving"

    def do_execute(self, code, *args, **kwargs):
        if code.strip().startswith("misbehave("):
            eval(code, {"misbehave": misbehave})  # noqa: S307 — the test's own `misbehave(...)` call
            if BEHAVIOUR == "exit-after-reply":
                code = "'replied'"
        return super().do_execute(code, *args, **kwargs)

    def _publish_status(self, status, channel, parent=None):
        parent = parent or self.get_parent(channel)
        if BEHAVIOUR == "drops-idle" and status == "idle" and parent["header"]["msg_type"] == "is_complete_request":
            return
        super()._publish_status(status, channel, parent)

    def do_is_complete(self, code):
        if BEHAVIOUR == "drops-is-complete":
            raise RuntimeError("this worker drops is_complete_request")
        return super().do_is_complete(code)

    async def execute_request(self, stream, ident, parent):
        await super().execute_request(stream, ident, parent)
        if BEHAVIOUR == "exit-after-reply" and parent["content"].get("code", "").strip() == "misbehave()":
            time.sleep(0.3)  # the reply is on the wire; the idle that would follow it never is
            os._exit(0)

    async def complete_request(self, stream, ident, parent):
        await super().complete_request(stream, ident, parent)
        if BEHAVIOUR == "exit-after-reply" and parent["content"].get("code", "") == "misbehave":
            time.sleep(0.3)  # the reply is on the wire; the idle that would follow it never is
            os._exit(0)

    def do_complete(self, code, cursor_pos):
        if BEHAVIOUR == "complete" and not Path(MARKER).exists():
            Path(MARKER).touch()
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().do_complete(code, cursor_pos)


class _SmallQueues:
    """A context whose PUB and XPUB sockets queue 20 messages for a subscriber (set before the bind)."""

    def __init__(self, context):
        self._context = context

    def socket(self, socket_type, *args, **kwargs):
        sock = self._context.socket(socket_type, *args, **kwargs)
        if socket_type in (zmq.PUB, zmq.XPUB):
            sock.setsockopt(zmq.SNDHWM, 20)
        return sock

    def __getattr__(self, name):
        return getattr(self._context, name)


class MisbehavingApp(IPKernelApp):
    def init_iopub(self, context):
        if BEHAVIOUR == "small-iopub-queue":
            context = _SmallQueues(context)
        if BEHAVIOUR == "output-then-die":
            context = self.iopub_context = zmq.Context()  # its own, to be destroyed alone
            # Lossless toward the proxy, as klbr's own workers are (`boot.bootstrap` lifts iopub's
            # high-water mark): a worker started from a kernelspec keeps ipykernel's PUB mark of
            # 1000, past which it drops the newest outputs itself while a busy machine slows the
            # proxy, and the test is of what the proxy does with everything the worker sent.
            context.sndhwm = 0
        super().init_iopub(context)

    def _bind_socket(self, s, port):
        if BEHAVIOUR == "late-stdin" and s is getattr(self, "stdin_socket", None):
            self._late_stdin_port = port
            return port  # bound in `start`, and only once (never bound, unbound and bound again)
        return super()._bind_socket(s, port)

    def start(self):
        if BEHAVIOUR == "late-stdin":
            threading.Timer(0.5, self._try_bind_socket, (self.stdin_socket, self._late_stdin_port)).start()
        elif BEHAVIOUR == "noisy":
            # As debugpy's warnings are written: on the main thread, before any request has come.
            print(NOISE, file=sys.stderr)
        super().start()


NOISE = "klbr-test: a worker's news about no request at all"


if __name__ == "__main__":
    gate = os.environ.get("KLBR_TEST_START_GATE")
    while gate and Path(gate).exists():
        time.sleep(0.02)
    if BEHAVIOUR == "ignore-sigint":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    MisbehavingApp.launch_instance(kernel_class=MisbehavingKernel)
