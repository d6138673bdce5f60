"""`python -m klbr_supervisor.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

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
BOOTSTRAP = """\
import runpy
import zmq
from ipykernel.kernelapp import IPKernelApp
_init_iopub = getattr(IPKernelApp, "init_iopub", None)
if _init_iopub is not None:
    def _lossless_iopub(self, context):
        context.setsockopt(zmq.SNDHWM, 0)  # the sockets made from here on: iopub's, before it binds
        _init_iopub(self, context)
    IPKernelApp.init_iopub = _lossless_iopub
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    exec(compile(BOOTSTRAP, "<klbr worker>", "exec"), {"__name__": "klbr_worker"})
