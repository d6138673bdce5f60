"""`python -m klbr_supervisor.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`), and an iopub that does not drop (see `lossless_iopub`). Standard library,
pyzmq and ipykernel only.
"""

from __future__ import annotations

import runpy
import sys

from .deathsig import die_with

def lossless_iopub() -> None:
    """ipykernel's iopub queues 1000 messages for a subscriber, then drops what comes next, the
    cell's idle included. Its only subscriber here is the proxy, which reads everything (and bounds
    what it keeps for slow frontends, see `klbr_kernel.outbox`): when the proxy is starved of CPU
    while a cell floods, the worker keeps what it published instead of losing it."""
    import zmq
    from ipykernel.kernelapp import IPKernelApp

    init_iopub = IPKernelApp.init_iopub

    def init_lossless_iopub(self, context):
        context.setsockopt(zmq.SNDHWM, 0)  # for the sockets made from here on: iopub's, before it binds
        init_iopub(self, context)

    IPKernelApp.init_iopub = init_lossless_iopub


if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    lossless_iopub()
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
