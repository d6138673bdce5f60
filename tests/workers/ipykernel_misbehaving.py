"""A real ipykernel whose worker misbehaves on purpose, for the supervisor's fault tests.

    python ipykernel_misbehaving.py BEHAVIOUR [MARKER] -f CONNECTION_FILE

The kernel runs cells normally; the cell `misbehave()` triggers BEHAVIOUR (for "complete", the first
complete_request does, once per MARKER file). Each behaviour is a way real workers die or hang.
"late-stdin" misbehaves at start-up instead: stdin is bound last, just before the kernel serves,
as a slow machine can make any worker do (the supervisor's connection to it is then still waiting
on its retry timer when shell already answers).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp

BEHAVIOUR = sys.argv.pop(1)
MARKER = sys.argv.pop(1) if BEHAVIOUR == "complete" else None


def misbehave() -> None:
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


class MisbehavingKernel(IPythonKernel):
    implementation = "ipykernel-misbehaving"

    def do_execute(self, code, *args, **kwargs):
        if code.strip() == "misbehave()":
            misbehave()
            if BEHAVIOUR == "exit-after-reply":
                code = "'replied'"
        return super().do_execute(code, *args, **kwargs)

    async def execute_request(self, stream, ident, parent):
        await super().execute_request(stream, ident, parent)
        if BEHAVIOUR == "exit-after-reply" and parent["content"].get("code", "").strip() == "misbehave()":
            time.sleep(0.3)  # the reply is on the wire; the idle that would follow it never is
            os._exit(0)

    def do_complete(self, code, cursor_pos):
        if BEHAVIOUR == "complete" and not Path(MARKER).exists():
            Path(MARKER).touch()
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().do_complete(code, cursor_pos)


class MisbehavingApp(IPKernelApp):
    def init_sockets(self):
        super().init_sockets()
        if BEHAVIOUR == "late-stdin":
            self._stdin_url = self.stdin_socket.last_endpoint
            self.stdin_socket.unbind(self._stdin_url)

    def start(self):
        if BEHAVIOUR == "late-stdin":
            time.sleep(0.3)  # the supervisor's stdin is now between connection attempts
            self.stdin_socket.bind(self._stdin_url)
        super().start()


if __name__ == "__main__":
    if BEHAVIOUR == "ignore-sigint":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    MisbehavingApp.launch_instance(kernel_class=MisbehavingKernel)
