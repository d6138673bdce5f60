"""`python -m klbr_supervisor.boot.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`), and an iopub that does not drop (see `BOOTSTRAP`). Standard library,
pyzmq and ipykernel only.
"""

from __future__ import annotations

import sys

from .deathsig import die_with

# ipykernel, with an iopub that never drops: its queue toward a subscriber holds 1000 messages and
# then loses what comes next, the cell's idle included. Its only subscriber is the proxy, which reads
# everything (and bounds what it keeps for slow frontends, see `klbr_kernel.outbox`), so when the
# proxy is starved of CPU while a cell floods, the worker keeps what it published instead. Code for
# `python -c`, so that it runs on interpreters without klbr too (`python:` placements).
#
# Its stdout and stderr also flush by size: ipykernel buffers everything written between its 0.2 s
# flushes and sends it as one message, so a cell printing 1 GiB in 64 KiB writes made one 1 GiB
# message (the worker held three copies, the proxy one). Past FLUSH_AT bytes buffered, the writing
# thread flushes and waits for the send, which also paces a flood to what the proxy takes.
FLUSH_AT = 1 << 20
BOOTSTRAP = f"""\
import runpy
import zmq
from ipykernel.kernelapp import IPKernelApp
_init_iopub = getattr(IPKernelApp, "init_iopub", None)
if _init_iopub is not None:
    def _lossless_iopub(self, context):
        context.setsockopt(zmq.SNDHWM, 0)  # the sockets made from here on: iopub's, before it binds
        _init_iopub(self, context)
    IPKernelApp.init_iopub = _lossless_iopub
try:
    from ipykernel.iostream import OutStream
    _write = OutStream.write
    def _write_bounded(self, string):
        written = _write(self, string)
        buffers = getattr(self, "_buffers", None)
        if buffers is not None and sum(b.tell() for b in list(buffers.values())) >= {FLUSH_AT}:
            self.flush()
        return written
    OutStream.write = _write_bounded
except Exception:
    pass
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    exec(compile(BOOTSTRAP, "<klbr worker>", "exec"), {"__name__": "klbr_worker"})
