"""klbr's own workers: ipykernel, started after a few changes to how it runs.

`main` is ``python -m ipykernel_launcher ARGS...`` after these, each a function of its own:

- `limit_memory`: `Supervisor.memory_limit` as the worker's RLIMIT_DATA, before ipykernel is imported;
- `lossless_iopub`: an iopub that never drops what the worker publishes;
- `flush_by_size`: stdout and stderr sent once a megabyte waits, not as one message per 0.2 s;
- `flush_only_what_waits`: a flush with nothing to send returns at once;
- `shell_on_main_thread`: ipykernel 7 serves shell on its main thread, as 6.x does;
- `wake_on_signal`: a signal wakes the loop of a cell that awaits, so an interrupt cancels it at once.

Where this ipykernel does not let one be done, the worker says so on its stderr, one line per
missing behaviour beginning with `NOTICE` (`targets.process.StderrTail` copies such a line into the
kernel's log once per kernel, however many generations say it).

This module is sent to its worker as its own source text (`worker.BOOTSTRAP`) and run as
``python -c SOURCE -f CONNECTION_FILE ...``, so it runs on an interpreter with no klbr installed (a
`python:` placement, an `ssh://` remote); `python -m klbr_supervisor.boot.worker` calls `main`
after arming the death signal. It imports the standard library only until `main` runs: imported,
it changes nothing, and a test applies each part alone. Each part patches ipykernel's classes,
read for 6.29 to 7.x (the range pyproject admits); what it finds missing it leaves as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import signal
import socket
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

# What begins each line the bootstrap writes on its stderr about a behaviour this ipykernel lacks.
NOTICE = "klbr worker: "
# The environment variable `Supervisor.memory_limit` comes in, in bytes (see `limit_memory`).
MEMORY_LIMIT = "KLBR_MEMORY_LIMIT"
# Characters written to a stream since it was last flushed by size (see `flush_by_size`).
FLUSH_AT = 1 << 20

_KEEPS_HWM = ("iopub keeps ipykernel's high-water mark ({}): a cell that floods while the kernel is "
              "starved of CPU may lose outputs, its idle included")


def _ipykernel(module: str = "ipykernel") -> Any:
    """An ipykernel module, untyped: the bootstrap reads what each version has, as it finds it."""
    return importlib.import_module(module)


def notice(behaviour: str) -> None:
    """Say on stderr that this ipykernel lacks what `behaviour` describes (see `NOTICE`)."""
    sys.stderr.write(f"{NOTICE}ipykernel {_ipykernel().__version__} on {sys.executable}: {behaviour}\n")
    sys.stderr.flush()


def limit_memory(environ: MutableMapping[str, str] = os.environ) -> int:
    """`Supervisor.memory_limit` (bytes, in `MEMORY_LIMIT`, taken out of the environment) as
    RLIMIT_DATA, before ipykernel is imported: an allocation past it fails in the worker (a Python
    one raises MemoryError in the cell), and the processes the worker starts inherit it. RLIMIT_DATA
    counts private writable mappings (Linux 4.7 and later), what "memory a cell allocated" means;
    RLIMIT_AS would count address space too, which libraries reserve in large areas they never use.
    A hard limit below it wins. Returns the limit set (0: none)."""
    limit = int(environ.pop(MEMORY_LIMIT, "") or 0)
    if limit:
        import resource  # noqa: PLC0415 — only with a limit

        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return limit


class _IopubContext:
    """The ZMQ context `IPKernelApp.init_iopub` is handed: its PUB and XPUB sockets get SNDHWM 0."""

    def __init__(self, context: Any):
        self._context = context
        self.made = False

    def socket(self, socket_type: int, *args: Any, **kwargs: Any) -> Any:
        import zmq  # noqa: PLC0415 — the standard library only until `main`

        made = self._context.socket(socket_type, *args, **kwargs)
        if socket_type in (zmq.PUB, zmq.XPUB):
            made.setsockopt(zmq.SNDHWM, 0)
            self.made = True
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def lossless_iopub() -> None:
    """An iopub that never drops: ipykernel's queue toward a subscriber holds 1000 messages and then
    loses what comes next, the cell's idle included. Its only subscriber is the proxy, which reads
    everything (and bounds what it keeps for slow frontends, see `klbr_kernel.frontend.outbox`), so
    when the proxy is starved of CPU while a cell floods, the worker keeps what it published instead.

    Only the iopub socket loses its high-water mark: `IPKernelApp.init_iopub(context)` makes it from
    the context it is handed (ipykernel 6.29 to 7.x: a PUB, or an XPUB), so that call is handed a
    context whose PUB and XPUB sockets get SNDHWM 0 before they bind (libzmq copies a socket's
    options into its listener at bind: set later, the option would not reach the proxy's
    connection). The sockets IOPubThread makes for itself and the subshells' pairs keep ipykernel's
    marks."""
    app = _ipykernel("ipykernel.kernelapp").IPKernelApp
    init_iopub = getattr(app, "init_iopub", None)
    if not callable(init_iopub):
        notice(_KEEPS_HWM.format("IPKernelApp has no init_iopub"))
        return

    def _lossless_iopub(self: Any, context: Any) -> None:
        handed = _IopubContext(context)
        init_iopub(self, handed)
        if not handed.made:
            notice(_KEEPS_HWM.format("IPKernelApp.init_iopub made no PUB socket from the context it was handed"))

    app.init_iopub = _lossless_iopub


def flush_by_size(flush_at: int = FLUSH_AT) -> None:
    """stdout and stderr flush by size too: ipykernel buffers everything written between its 0.2 s
    flushes and sends it as one message, so a cell printing 1 GiB in 64 KiB writes made one 1 GiB
    message (the worker held three copies, the proxy one). Once `flush_at` characters were written
    to a stream since this last flushed it, the writing thread flushes and waits for the send (the
    hand-over to the iopub socket, which has no mark: it paces the worker to its own sending, not
    to the proxy's reading). The count is the bootstrap's own, over the public `write` and `flush`:
    ipykernel's timed flushes in between only make a flush come early."""
    iostream = _ipykernel("ipykernel.iostream")
    write = getattr(getattr(iostream, "OutStream", None), "write", None)
    if not callable(write):
        notice("stdout and stderr flush every 0.2 s only (ipykernel.iostream has no OutStream.write): "
               "a cell that prints a flood sends it as one message")
        return
    unflushed: dict[int, int] = {}

    def _write_bounded(self: Any, string: str) -> Any:
        written = write(self, string)
        count = unflushed.get(id(self), 0) + len(string)
        if count >= flush_at:
            count = 0
            self.flush()
        unflushed[id(self)] = count
        return written

    iostream.OutStream.write = _write_bounded


def flush_only_what_waits() -> None:
    """A flush with nothing to send returns at once. ipykernel's hands the send to its iopub thread
    and waits for that thread to have run it, a round trip between two threads (a wake-up each way),
    and it flushes stdout and stderr before and after each request: four round trips for a trivial
    cell that had nothing to send, about 0.6 ms of the worker's CPU and of its time here (2026-12-03).

    Nothing needs waiting for when neither stream holds text, no send of the stream's is under way
    (its timed flush empties the buffers first and queues the message after: counted around
    `OutStream._flush`) and the iopub thread has nothing queued; otherwise ipykernel's flush waits as
    before, so a print still goes out before what comes after it. On ipykernel 6.29 to 7.x, whose
    `OutStream` buffers by parent under `_buffer_lock` and whose iopub thread queues in `_events`
    (where one is missing, or the stream echoes, ipykernel's flush runs as it is)."""
    ipykernel = _ipykernel()
    out_stream: Any = getattr(_ipykernel("ipykernel.iostream"), "OutStream", None)
    flush = getattr(out_stream, "flush", None)
    send_buffers = getattr(out_stream, "_flush", None)
    if not ((6, 29) <= tuple(ipykernel.version_info[:2]) < (8, 0) and callable(flush) and callable(send_buffers)):
        return

    def _sending_buffers(self: Any) -> Any:
        with self._buffer_lock:
            self._klbr_sending = getattr(self, "_klbr_sending", 0) + 1
        try:
            return send_buffers(self)
        finally:
            with self._buffer_lock:
                self._klbr_sending -= 1

    def _flush_if_anything_waits(self: Any) -> None:
        queued = getattr(self.pub_thread, "_events", None)
        lock = getattr(self, "_buffer_lock", None)
        if getattr(self, "echo", None) is None and queued is not None and lock is not None:
            with lock:
                buffers = getattr(self, "_buffers", None)
                empty = buffers is not None and not any(buffer.tell() for buffer in buffers.values())
                nothing_sent = empty and not getattr(self, "_klbr_sending", 0)
            if nothing_sent and not queued:
                return
        flush(self)

    out_stream._flush = _sending_buffers
    out_stream.flush = _flush_if_anything_waits


class _NoShellChannelThread:
    """What ipykernel 7 finds where it asks for its shell channel thread: false where it checks for
    one, and the main thread as the one that reads shell (a cell with a top-level await asks, to
    cancel itself on SIGINT)."""

    parent_thread = threading.main_thread()

    def __bool__(self) -> bool:
        return False


def shell_on_main_thread() -> None:
    """Shell served on the main thread, as ipykernel 6 serves it: ipykernel 7 reads shell on a
    thread of its own for kernel subshells, and hands every request to the main thread and every
    reply back over inproc sockets, decoding each header twice. klbr offers no subshells (the proxy
    refuses their requests), so on ipykernel 7 the thread is dropped before it starts
    (`init_sockets` made it, `init_kernel` starts it), and ipykernel takes the path it keeps for no
    thread: the shell stream on the main loop. It says "no subshells"
    (`_supports_kernel_subshells`) and finds a `_NoShellChannelThread` where it asks for the thread.
    A trivial cell then costs the worker about 0.4 ms less CPU and 0.3 ms less time here
    (2026-12-03). Only on ipykernel 7, whose uses of the thread were read for this: 6.x has none, and
    another major version is left as it is."""
    ipykernel = _ipykernel()
    app = _ipykernel("ipykernel.kernelapp").IPKernelApp
    kernel = _ipykernel("ipykernel.kernelbase").Kernel
    init_sockets = getattr(app, "init_sockets", None)
    if not (ipykernel.version_info[0] == 7 and callable(init_sockets) and hasattr(kernel, "_supports_kernel_subshells")):
        return

    def _shell_on_the_main_thread(self: Any) -> None:
        init_sockets(self)
        thread = getattr(self, "shell_channel_thread", None)
        if thread is not None:
            thread.io_loop.close()
            self.shell_channel_thread = _NoShellChannelThread()

    app.init_sockets = _shell_on_the_main_thread
    kernel._supports_kernel_subshells = property(lambda self: False)


def wake_on_signal() -> None:
    """A signal wakes the loop while a cell awaits. An interrupt of such a cell reaches ipykernel's
    SIGINT handler while the loop waits in epoll; the handler schedules the cancel with the loop's
    plain `call_soon` (it runs on the loop's own thread), and the wait goes on until its timeout:
    `await asyncio.sleep(60)` was cancelled only when the sleep ended (plain ipykernel too), and
    klbr, hearing no reply, killed the worker after its grace (WorkerKilled, the namespace lost).

    Python writes each signal's number to the wakeup fd it is given, from its C handler, so while
    ipykernel watches SIGINT for an awaiting cell (`_cancel_on_sigint`, in 6.29 and 7) this gives it
    one the loop watches and drains, and takes it away after (unless the cell set its own): armed
    for each such cell, as the cell's code may take it away (asyncio's last `remove_signal_handler`
    sets none), and not between cells, where trio would warn of a collision. Where one is set
    already (asyncio's, for a handler a cell added), it stays: it wakes the loop too, and asyncio
    reads its handlers' signals from it."""
    kernel = _ipykernel("ipykernel.ipkernel").IPythonKernel
    cancel_on_sigint = getattr(kernel, "_cancel_on_sigint", None)
    if not callable(cancel_on_sigint):
        return
    pair: list[socket.socket] = []  # (written by Python's handler, drained by the loop), once made

    def _wakeup_fd() -> int:
        if not pair:
            from tornado.ioloop import IOLoop  # noqa: PLC0415 — ipykernel's loop, once a cell awaits

            wake, woken = socket.socketpair()
            wake.setblocking(False)
            woken.setblocking(False)

            def _drain(fd: int, events: int) -> None:
                try:
                    while woken.recv(4096):
                        pass
                except BlockingIOError:
                    pass

            IOLoop.current().add_handler(woken.fileno(), _drain, IOLoop.READ)
            pair.extend((wake, woken))
        return pair[0].fileno()

    @contextlib.contextmanager
    def _cancel_on_sigint_woken(self: Any, future: Any) -> Iterator[None]:
        ours = _wakeup_fd()
        before = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if before != -1:
            signal.set_wakeup_fd(before)
        try:
            with cancel_on_sigint(self, future):
                yield
        finally:
            if before == -1:
                now = signal.set_wakeup_fd(-1)
                if now != ours:
                    signal.set_wakeup_fd(now)

    kernel._cancel_on_sigint = _cancel_on_sigint_woken


def main() -> None:
    """The worker: each change above, then ipykernel's own launcher with this process's arguments."""
    limit_memory()
    lossless_iopub()
    flush_by_size()
    flush_only_what_waits()
    shell_on_main_thread()
    wake_on_signal()
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
