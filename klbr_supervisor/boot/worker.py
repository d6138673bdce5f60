"""`python -m klbr_supervisor.boot.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`), an iopub that does not drop, flushes that wait only when something waits,
a shell served on the main thread and interrupts that always land (see `BOOTSTRAP`). Standard library,
pyzmq and ipykernel only.
"""

from __future__ import annotations

import signal
import sys

from .deathsig import die_with

# What the bootstrap says on its stderr when this ipykernel does not let it do its part, one line
# per missing behaviour. The worker's stderr is copied to the kernel's (its log); `StderrTail`
# copies each such line once per kernel, however many generations say it.
NOTICE = "klbr worker: "

# ipykernel, with an iopub that never drops: its queue toward a subscriber holds 1000 messages and
# then loses what comes next, the cell's idle included. Its only subscriber is the proxy, which reads
# everything (and bounds what it keeps for slow frontends, see `klbr_kernel.outbox`), so when the
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
# 256 KiB, not more: what the proxy's iopub queues for a reader slower than the flood is counted in
# messages (`klbr_kernel.early.IOPUB_QUEUE`, 200), and at 1 MiB a message a 1 GiB flood to a reader
# beside busy CPUs took the proxy to 300-480 MiB (2026-12-06); at 256 KiB, 75-155 MiB, and no slower
# (50 MiB in 64 KiB writes: 0.16 s a cell against 0.18 s, medians of 9).
FLUSH_AT = 1 << 18
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
# And an interrupt always lands. A SIGINT sent to the worker (its group: `killpg`, as jupyter_client
# sends it) sets Python's flag from the C handler on whichever thread the kernel picked, and the
# Python handler then runs on the main thread when it next checks. Two ways that was too late:
# - the signal lands on the main thread just before a blocking call begins (in `time.sleep`, between
#   releasing the GIL and entering the syscall: the GIL's hand-over to a thread that wants it, the
#   iopub thread sending the print before the sleep say, holds that window open for as long as the
#   other thread takes to be scheduled), so no syscall is interrupted and the flag waits out the sleep;
# - it lands on another thread (Linux hands a process-directed signal to any thread that does not
#   block it, when the main thread cannot take it at once), and the main thread's sleep goes on.
# Either way the cell slept on and klbr killed the worker after its grace (WorkerKilled, the namespace
# lost): 1 interrupt in 100 of a sleeping cell beside busy threads on a loaded machine (2026-12-06).
# So every SIGINT handler is installed wrapped (`signal.signal` and `getsignal` patched before
# ipykernel binds them; both still give the handler as it was given), and while one is, Python
# writes each signal's number to a socket of ours (`signal.set_wakeup_fd`). A watcher thread sees the
# byte; if the handler has not taken it (drained it) 50 ms later, it sends SIGINT to the main thread
# itself (`pthread_kill`), which interrupts whatever call it is in, and again every 50 ms until taken.
# The wrapper runs the handler only for a SIGINT it drains, so the flag a resend set again after the
# handler ran is an echo and does nothing: one interrupt, one KeyboardInterrupt. (A resend is sent
# under the lock the wrapper drains under, after seeing the byte still there.) Where another wakeup fd
# is set (asyncio's, for a handler a cell added to its loop), it stays and nothing is counted: the
# handler runs as under ipykernel. Signals a cell blocks, C code that holds the GIL and checks
# nothing: as under ipykernel.
# The wrapper also wakes the running asyncio loop after a handler that returns: ipykernel cancels an
# awaiting cell from its SIGINT handler with the loop's plain `call_soon`, and the loop, waiting in
# epoll, went on until its timeout (`await asyncio.sleep(60)` ran to its end, and was killed).
# `Supervisor.memory_limit`, in bytes, comes in the worker's environment under this name and is set
# as RLIMIT_DATA before ipykernel is imported: an allocation past it fails in the worker (a Python
# one raises MemoryError in the cell), and the processes the worker starts inherit it. RLIMIT_DATA
# counts private writable mappings (Linux 4.7 and later), what "memory a cell allocated" means;
# RLIMIT_AS would count address space too, which libraries reserve in large areas they never use.
MEMORY_LIMIT = "KLBR_MEMORY_LIMIT"
# How long the watcher lets a SIGINT the main thread has not taken wait before sending it again.
RESEND_AFTER = 0.05
SIGINT = int(signal.SIGINT)  # the byte Python writes to a wakeup fd for it
INTERRUPTS = f"""\
import signal
import socket
import threading
_signal, _getsignal, _set_wakeup_fd = signal.signal, signal.getsignal, signal.set_wakeup_fd
class _Interrupts:
    def __init__(self):
        self.lock = threading.RLock()
        self.drained = threading.Event()
        self.main = threading.main_thread().ident
        self.read = self.write = None
        self.watcher = None
    def fd(self):
        if self.read is None:
            self.read, self.write = socket.socketpair()
            self.read.setblocking(False)
            self.write.setblocking(False)
        return self.write.fileno()
    def arm(self):
        ours = self.fd()
        before = _set_wakeup_fd(ours, warn_on_full_buffer=False)
        if before not in (-1, ours):
            _set_wakeup_fd(before)
        elif self.watcher is None:
            self.watcher = threading.Thread(target=self.watch, name="klbr interrupts", daemon=True)
            self.watcher.start()
    def disarm(self):
        if self.write is not None:
            now = _set_wakeup_fd(-1)
            if now != self.write.fileno():
                _set_wakeup_fd(now)
    def counting(self):
        now = _set_wakeup_fd(-1)
        _set_wakeup_fd(now)
        return self.write is not None and now == self.write.fileno()
    def take(self):
        taken = False
        try:
            while chunk := self.read.recv(4096):
                taken = taken or {SIGINT} in chunk
        except OSError:
            pass
        self.drained.set()
        return taken
    def watch(self):
        import select
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
        while True:
            select.select([self.read], [], [])
            self.drained.clear()
            if self.drained.wait({RESEND_AFTER}):
                continue
            with self.lock:
                try:
                    waiting = self.read.recv(4096, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                if {SIGINT} in waiting and isinstance(_getsignal(signal.SIGINT), _Landing):
                    signal.pthread_kill(self.main, signal.SIGINT)
                else:
                    self.take()
_interrupts = _Interrupts()
class _Landing:
    __slots__ = ("handler",)
    def __init__(self, handler):
        self.handler = handler
    def __call__(self, signum, frame):
        with _interrupts.lock:
            if not _interrupts.take() and _interrupts.counting():
                return None
        result = self.handler(signum, frame)
        try:
            import asyncio
            asyncio.get_running_loop().call_soon_threadsafe(_nothing)
        except RuntimeError:
            pass
        return result
def _nothing():
    pass
def _given(handler):
    return handler.handler if isinstance(handler, _Landing) else handler
def _install(signalnum, handler):
    if signalnum != signal.SIGINT:
        return _signal(signalnum, handler)
    if callable(handler) and not isinstance(handler, _Landing):
        _interrupts.arm()
        before = _signal(signalnum, _Landing(handler))
    else:
        before = _signal(signalnum, handler)
        if not callable(handler):
            _interrupts.disarm()
    return _given(before)
signal.signal = _install
signal.getsignal = lambda signalnum: _given(_getsignal(signalnum))
"""
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
{INTERRUPTS}import zmq
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
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    exec(compile(BOOTSTRAP, "<klbr worker>", "exec"), {"__name__": "klbr_worker"})  # noqa: S102 — running the worker bootstrap is this entry point's job
