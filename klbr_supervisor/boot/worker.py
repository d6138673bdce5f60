"""`python -m klbr_supervisor.boot.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`), an iopub that does not drop, flushes that wait only when something waits,
a shell served on the main thread and a loop that signals wake (see `BOOTSTRAP`). Standard library,
pyzmq and ipykernel only.
"""

from __future__ import annotations

import sys

from .deathsig import die_with

# What the bootstrap says on its stderr when this ipykernel does not let it do its part, one line
# per missing behaviour. The worker's stderr is copied to the kernel's (its log); `StderrTail`
# copies each such line once per kernel, however many generations say it.
NOTICE = "klbr worker: "

# ipykernel, with an iopub that never drops: its queue toward a subscriber holds 1000 messages and
# then loses what comes next, the cell's idle included. Its only subscriber is the proxy, which reads
# everything (and bounds what it keeps for slow frontends, see `klbr_kernel.frontend.outbox`), so when the
# proxy is starved of CPU while a cell floods, the worker keeps what it published instead. Code for
# `python -c`, so that it runs on interpreters without klbr too (`python:` placements).
#
# Only the iopub socket loses its high-water mark: `IPKernelApp.init_iopub(context)` makes it from
# the context it is handed (ipykernel 6.29 to 7.x: a PUB, or an XPUB), so that call is handed a
# context whose PUB and XPUB sockets get SNDHWM 0 before they bind (libzmq copies a socket's options
# into its listener at bind: set later, the option would not reach the proxy's connection). The
# sockets IOPubThread makes for itself and the subshells' pairs keep ipykernel's marks.
#
# Its stdout and stderr also flush by size: ipykernel buffers everything written between its 0.2 s
# flushes and sends it as one message, so a cell printing 1 GiB in 64 KiB writes made one 1 GiB
# message (the worker held three copies, the proxy one). Once FLUSH_AT characters were written to a
# stream since the bootstrap last flushed it, the writing thread flushes and waits for the send
# (the hand-over to the iopub socket, which has no mark: it paces the worker to its own sending,
# not to the proxy's reading). The count is the bootstrap's own, over the public
# `write` and `flush`: ipykernel's timed flushes in between only make a flush come early.
FLUSH_AT = 1 << 20
# A flush with nothing to send returns at once: ipykernel's hands the send to its iopub thread and
# waits for that thread to have run it, a round trip between two threads (a wake-up each way), and
# it flushes stdout and stderr before and after each request: four round trips for a trivial cell
# that had nothing to send, about 0.6 ms of the worker's CPU and of its time here (2026-12-03).
# Nothing needs waiting for when neither stream holds text, no send of the stream's is under way
# (its timed flush empties the buffers first and queues the message after: counted around
# `OutStream._flush`) and the iopub thread has nothing queued; otherwise ipykernel's flush waits as
# before, so a print still goes out before what comes after it. On ipykernel 6.29 to 7.x, whose
# `OutStream` buffers by parent under `_buffer_lock` and whose iopub thread queues in `_events`
# (where one is missing, or the stream echoes, ipykernel's flush runs as it is).
# And its shell is served on the main thread, as ipykernel 6 serves it: ipykernel 7 reads shell on a
# thread of its own for kernel subshells, and hands every request to the main thread and every reply
# back over inproc sockets, decoding each header twice. klbr offers no subshells (the proxy refuses
# their requests), so on ipykernel 7 the bootstrap drops that thread before it starts (`init_sockets`
# made it, `init_kernel` starts it), and ipykernel takes the path it keeps for no thread: the shell
# stream on the main loop. It says "no subshells" (`_supports_kernel_subshells`) and finds, where it
# asks for the thread, a stand-in that is false where it checks for one and whose `parent_thread` is
# the main thread: a cell with a top-level await asks which thread reads shell, to cancel itself on
# SIGINT (`tests/test_placement.py` runs such cells, interrupted too, and comms during one). A
# trivial cell then costs the worker about 0.4 ms less CPU and 0.3 ms less time here (2026-12-03).
# Only on ipykernel 7, whose uses of the thread were read for this: 6.x has none, and another major
# version is left as it is.
# And a signal wakes its loop while a cell awaits. An interrupt of such a cell reaches ipykernel's
# SIGINT handler while the loop waits in epoll; the handler schedules the cancel with the loop's
# plain `call_soon` (it runs on the loop's own thread), and the wait goes on until its timeout:
# `await asyncio.sleep(60)` was cancelled only when the sleep ended (plain ipykernel too), and klbr,
# hearing no reply, killed the worker after its grace (WorkerKilled, the namespace lost). Python
# writes each signal's number to the wakeup fd it is given, from its C handler, so while ipykernel
# watches SIGINT for an awaiting cell (`_cancel_on_sigint`, in 6.29 and 7) the bootstrap gives it
# one the loop watches and drains, and takes it away after (unless the cell set its own): armed for
# each such cell, as the cell's code may take it away (asyncio's last `remove_signal_handler` sets
# none), and not between cells, where trio would warn of a collision. Where one is set already
# (asyncio's, for a handler a cell added), it stays: it wakes the loop too, and asyncio reads its
# handlers' signals from it.
# `Supervisor.memory_limit`, in bytes, comes in the worker's environment under this name and is set
# as RLIMIT_DATA before ipykernel is imported: an allocation past it fails in the worker (a Python
# one raises MemoryError in the cell), and the processes the worker starts inherit it. RLIMIT_DATA
# counts private writable mappings (Linux 4.7 and later), what "memory a cell allocated" means;
# RLIMIT_AS would count address space too, which libraries reserve in large areas they never use.
MEMORY_LIMIT = "KLBR_MEMORY_LIMIT"
BOOTSTRAP = f"""\
import os
import runpy
import sys
_limit = int(os.environ.pop("{MEMORY_LIMIT}", "") or 0)
if _limit:
    import resource
    _hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    _limit = _limit if _hard == resource.RLIM_INFINITY else min(_limit, _hard)
    resource.setrlimit(resource.RLIMIT_DATA, (_limit, _limit))
import zmq
def _absent(behaviour):
    import ipykernel
    sys.stderr.write(f"{NOTICE}ipykernel {{ipykernel.__version__}} on {{sys.executable}}: {{behaviour}}\\n")
    sys.stderr.flush()
class _IopubContext:
    def __init__(self, context):
        self._context = context
        self.made = False
    def socket(self, socket_type, *args, **kwargs):
        socket = self._context.socket(socket_type, *args, **kwargs)
        if socket_type in (zmq.PUB, zmq.XPUB):
            socket.setsockopt(zmq.SNDHWM, 0)
            self.made = True
        return socket
    def __getattr__(self, name):
        return getattr(self._context, name)
_KEEPS_HWM = ("iopub keeps ipykernel's high-water mark ({{}}): a cell that floods while the kernel is "
              "starved of CPU may lose outputs, its idle included")
from ipykernel.kernelapp import IPKernelApp
_init_iopub = getattr(IPKernelApp, "init_iopub", None)
if callable(_init_iopub):
    def _lossless_iopub(self, context):
        handed = _IopubContext(context)
        _init_iopub(self, handed)
        if not handed.made:
            _absent(_KEEPS_HWM.format("IPKernelApp.init_iopub made no PUB socket from the context it was handed"))
    IPKernelApp.init_iopub = _lossless_iopub
else:
    _absent(_KEEPS_HWM.format("IPKernelApp has no init_iopub"))
from ipykernel import iostream
_write = getattr(getattr(iostream, "OutStream", None), "write", None)
if callable(_write):
    _unflushed = {{}}
    def _write_bounded(self, string):
        written = _write(self, string)
        count = _unflushed.get(id(self), 0) + len(string)
        if count >= {FLUSH_AT}:
            count = 0
            self.flush()
        _unflushed[id(self)] = count
        return written
    iostream.OutStream.write = _write_bounded
else:
    _absent("stdout and stderr flush every 0.2 s only (ipykernel.iostream has no OutStream.write): "
            "a cell that prints a flood sends it as one message")
import ipykernel
_OutStream = getattr(iostream, "OutStream", None)
_flush = getattr(_OutStream, "flush", None)
_send_buffers = getattr(_OutStream, "_flush", None)
if (6, 29) <= tuple(ipykernel.version_info[:2]) < (8, 0) and callable(_flush) and callable(_send_buffers):
    def _sending_buffers(self):
        with self._buffer_lock:
            self._klbr_sending = getattr(self, "_klbr_sending", 0) + 1
        try:
            return _send_buffers(self)
        finally:
            with self._buffer_lock:
                self._klbr_sending -= 1
    def _flush_if_anything_waits(self):
        queued = getattr(self.pub_thread, "_events", None)
        lock = getattr(self, "_buffer_lock", None)
        if getattr(self, "echo", None) is None and queued is not None and lock is not None:
            with lock:
                buffers = getattr(self, "_buffers", None)
                empty = buffers is not None and not any(buffer.tell() for buffer in buffers.values())
                nothing_sent = empty and not getattr(self, "_klbr_sending", 0)
            if nothing_sent and not queued:
                return
        _flush(self)
    iostream.OutStream._flush = _sending_buffers
    iostream.OutStream.flush = _flush_if_anything_waits
from ipykernel.kernelbase import Kernel
_init_sockets = getattr(IPKernelApp, "init_sockets", None)
if ipykernel.version_info[0] == 7 and callable(_init_sockets) and hasattr(Kernel, "_supports_kernel_subshells"):
    import threading
    class _NoShellChannelThread:
        parent_thread = threading.main_thread()
        def __bool__(self):
            return False
    def _shell_on_the_main_thread(self):
        _init_sockets(self)
        thread = getattr(self, "shell_channel_thread", None)
        if thread is not None:
            thread.io_loop.close()
            self.shell_channel_thread = _NoShellChannelThread()
    IPKernelApp.init_sockets = _shell_on_the_main_thread
    Kernel._supports_kernel_subshells = property(lambda self: False)
from ipykernel.ipkernel import IPythonKernel
_cancel_on_sigint = getattr(IPythonKernel, "_cancel_on_sigint", None)
if callable(_cancel_on_sigint):
    import contextlib
    import signal
    import socket
    _wakeup = []
    def _wakeup_fd():
        if not _wakeup:
            from tornado.ioloop import IOLoop
            wake, woken = socket.socketpair()
            wake.setblocking(False)
            woken.setblocking(False)
            def _drain(fd, events):
                try:
                    while woken.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            IOLoop.current().add_handler(woken.fileno(), _drain, IOLoop.READ)
            _wakeup.extend((wake, woken))
        return _wakeup[0].fileno()
    @contextlib.contextmanager
    def _cancel_on_sigint_woken(self, future):
        ours = _wakeup_fd()
        before = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if before != -1:
            signal.set_wakeup_fd(before)
        try:
            with _cancel_on_sigint(self, future):
                yield
        finally:
            if before == -1:
                now = signal.set_wakeup_fd(-1)
                if now != ours:
                    signal.set_wakeup_fd(now)
    IPythonKernel._cancel_on_sigint = _cancel_on_sigint_woken
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    exec(compile(BOOTSTRAP, "<klbr worker>", "exec"), {"__name__": "klbr_worker"})  # noqa: S102 — running the worker bootstrap is this entry point's job
