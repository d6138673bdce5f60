"""klbr's own workers: ipykernel, started after a few changes to how it runs.

`main` is ``python -m ipykernel_launcher ARGS...`` after these, each a function of its own:

- `limit_memory`: `Supervisor.memory_limit` as the worker's RLIMIT_DATA, before ipykernel is imported;
- `jupyter_client_on_demand`: jupyter_client's package `__init__` (its clients, managers and
  provisioners) runs when a name only it gives is first asked for, not as ipykernel starts;
- `keep_debugger_out`: with `Supervisor.debugger` off, no debugpy, before ipykernel is imported;
- `debugger_on_demand`: otherwise debugpy and pydevd are loaded when a frontend first uses the
  debugger, not as ipykernel starts (it imports no module that binds `signal.signal`);
- `lossless_iopub`: an iopub that never drops what the worker publishes;
- `start_up_output_waits`: what the worker prints as it starts waits for the proxy to subscribe;
- `flush_by_size`: stdout and stderr sent once 256 KiB wait, not as one message per 0.2 s;
- `memory_back_after_floods`: what a flood of output left free in the heap goes back to the system
  once its execute has replied;
- `flush_only_what_waits`: a flush with nothing to send returns at once;
- `shell_on_main_thread`: ipykernel 7 serves shell on its main thread, as 6.x does;
- `interrupts_land`: a SIGINT ends what the main thread waits in, once, whatever thread took it and
  whenever it came (an awaiting cell's loop woken too), and is held while an execute has not yet
  reached its cell's code.

Where this ipykernel does not let one be done, the worker says so on its stderr, one line per
missing behaviour beginning with `NOTICE` (`targets.process.StderrTail` copies such a line into the
kernel's log once per kernel, however many generations say it).

This module is sent to its worker as its own source text (`worker.BOOTSTRAP`) and run as
``python -c SOURCE -f CONNECTION_FILE ...`` (compiled as `SOURCE_NAME`), so it runs on an
interpreter with no klbr installed (a `python:` placement, an `ssh://` remote); `python -m
klbr_supervisor.boot.worker` calls `main` after arming the death signal. It imports the standard
library only until `main` runs: imported, it changes nothing, and a test applies each part alone. Each part patches ipykernel's classes,
read for 6.29 to 7.x (the range pyproject admits); what it finds missing it leaves as it is.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import os
import runpy
import signal
import socket
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

# The file name of the bootstrap's code where it runs as source text (`worker.BOOTSTRAP`).
SOURCE_NAME = "<klbr bootstrap>"
# What begins each line the bootstrap writes on its stderr about a behaviour this ipykernel lacks.
NOTICE = "klbr worker: "
# The environment variable `Supervisor.memory_limit` comes in, in bytes (see `limit_memory`).
MEMORY_LIMIT = "KLBR_MEMORY_LIMIT"
# The word on the worker's command line that `Supervisor.debugger = False` adds (`prelaunch.NO_DEBUGGER`
# says the same; a test compares them).
NO_DEBUGGER = "--KlbrWorker.debugger=False"
# Characters written to a stream since it was last flushed by size (see `flush_by_size`). 256 KiB,
# not more: what the proxy's iopub queues for a reader slower than the flood is counted in messages
# (`klbr_kernel.frontend.standin.IOPUB_QUEUE`, 200), and at 1 MiB a message a 1 GiB flood to a
# reader beside busy CPUs took the proxy to 300-480 MiB (2026-12-06); at 256 KiB, 75-155 MiB, and
# no slower (50 MiB in 64 KiB writes: 0.16 s a cell against 0.18 s, medians of 9).
FLUSH_AT = 1 << 18
# Seconds a starting worker's start-up code waits for the proxy's subscription (`start_up_output_waits`):
# the proxy subscribes as it adopts the worker, well within it even on a busy machine.
SUBSCRIBER_BOUND = 10.0

# Set by `flush_by_size` when a stream flushed by size, cleared by `memory_back_after_floods`.
_flooded = threading.Event()
# Seconds after such an execute's reply before the trim: the flood's last messages may still wait in
# libzmq's queue to the proxy (iopub has no mark), and a trim returns only what is free.
TRIM_AFTER = 1.0

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


def keep_debugger_out(argv: list[str] | None = None) -> bool:
    """`Supervisor.debugger = False` (`NO_DEBUGGER` in `argv`, by default this process's command line,
    taken off it): debugpy cannot be imported in this worker, so ipykernel makes no debugger, as when
    debugpy is not installed (6.29 and 7.x import it in a ``try`` in `ipykernel.debugger`): its
    kernel_info then says no debugger, a debug_request is answered without one, and debugpy's and
    pydevd's modules (about 7 MiB) are never loaded. A cell's ``import debugpy`` fails too. Returns
    whether it was kept out."""
    argv = sys.argv if argv is None else argv
    if NO_DEBUGGER not in argv:
        return False
    while NO_DEBUGGER in argv:
        argv.remove(NO_DEBUGGER)
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # the import system's "not importable here"
    return True


# What `ipykernel.debugger`'s variable explorer reads of pydevd's (6.29 to 7.x bind it as that module is
# imported), by the module each comes from, the module itself where its name ends the module's;
# `debugger_on_demand` loads them when the explorer is first used, `_PYDEVD_FIRST` first (importing
# it puts pydevd's bundle on sys.path).
_PYDEVD_NAMES = {"SuspendedFramesManager": "_pydevd_bundle.pydevd_suspended_frames",
                 "_FramesTracker": "_pydevd_bundle.pydevd_suspended_frames",
                 "pydevd_frame_utils": "_pydevd_bundle.pydevd_frame_utils"}
_PYDEVD_FIRST = "debugpy.server.api"


def jupyter_client_on_demand() -> None:
    """jupyter_client's package `__init__` runs when a name only it gives is first asked for, not as
    ipykernel imports `jupyter_client.session`: it imports every client, manager, launcher and
    provisioner of jupyter_client (importlib.metadata's entry points among them), none of which a
    worker uses, 2.3 MiB of a worker's anonymous memory and 42 modules (2026-12-06). The package's
    module is made from its own spec and given the names ipykernel takes from it (those of
    `jupyter_client._version` and `jupyter_client.connect`, and `BlockingKernelClient`, which
    `__init__` gives too); any other name runs the real `__init__` in it, once, so a cell's `from jupyter_client import KernelManager`
    (or `import *`) works as under plain ipykernel. Must run before anything imports jupyter_client;
    where it is imported already, or not found, nothing changes."""
    if "jupyter_client" in sys.modules:
        return
    spec = importlib.util.find_spec("jupyter_client")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    sys.modules["jupyter_client"] = package
    try:
        given = [importlib.import_module(f"jupyter_client.{name}") for name in ("_version", "connect", "blocking")]
    except Exception:  # a jupyter_client unlike 7 and 8: its own __init__, as it comes
        for name in [n for n in sys.modules if n == "jupyter_client" or n.startswith("jupyter_client.")]:
            del sys.modules[name]
        return
    version, connect, blocking = given
    names = {name: getattr(version, name) for name in ("__version__", "protocol_version", "protocol_version_info",
                                                       "version_info") if hasattr(version, name)}
    names.update((name, getattr(connect, name)) for name in getattr(connect, "__all__", ()) if hasattr(connect, name))
    # IPKernelApp's `blocking_class` (jupyter_client.connect's ConnectionFileMixin) is a trait whose
    # default, "jupyter_client.BlockingKernelClient", is imported as the app is made.
    names["BlockingKernelClient"] = blocking.BlockingKernelClient
    package.__dict__.update(names)
    loader, lock, began = spec.loader, threading.RLock(), False

    def __getattr__(name: str) -> Any:  # noqa: N807 — a module's own (PEP 562)
        nonlocal began
        # Another thread asking meanwhile waits for the first one's `__init__`; the `__init__` itself
        # asking (`from . import kernelspec`) is told what is there so far, as a package being
        # imported tells.
        with lock:
            if not began:
                began = True
                try:
                    loader.exec_module(package)
                finally:
                    package.__dict__.pop("__getattr__", None)
        if name in package.__dict__:
            return package.__dict__[name]
        why = f"module 'jupyter_client' has no attribute {name!r}"
        raise AttributeError(why)

    package.__dict__["__getattr__"] = __getattr__


def debugger_on_demand() -> bool:
    """ipykernel's debugger with debugpy and pydevd (~200 modules, 7.5 MiB a worker) loaded when a
    frontend first uses it, not as the worker starts (issue 41, decision 72). ipykernel imports them
    in `ipykernel.debugger` as it starts, yet uses them only when the debugger starts (`initialize`
    runs ``import debugpy; debugpy.listen(...)`` in the shell) and in its variable explorer: that
    module is imported here with debugpy hidden, told debugpy is available, and given an explorer
    that loads pydevd the first time it is used (`_PYDEVD_NAMES`). What ipykernel has at its start
    stays as it was: ``breakpoint()`` does nothing until pydevd loads, as debugpy's hook does with
    no debugger attached, and a hook of the user's own is kept when it loads; pydevd's warning of
    frozen modules, which ipykernel's start wrote to no cell, is turned off
    (PYDEVD_DISABLE_FILE_VALIDATION). A frontend's `debugInfo`, which JupyterLab sends as a
    notebook opens, needs none of it. Where debugpy is kept out (`keep_debugger_out`), not
    installed or already loaded, left as ipykernel has it; where `ipykernel.debugger` is not as
    6.29 to 7.x have it (its import fails without debugpy, or its explorer reads other names), it is
    imported with debugpy and a NOTICE says so. Returns whether the debugger is on demand."""
    import importlib.util  # noqa: PLC0415 — the standard library only until `main`

    if "debugpy" in sys.modules or importlib.util.find_spec("debugpy") is None:
        return False
    sys.modules["debugpy"] = None  # type: ignore[assignment]
    try:
        debugger: Any = _ipykernel("ipykernel.debugger")
    except ImportError:
        debugger = None  # it imports debugpy unguarded: ipykernel imports it again, with debugpy
    finally:
        del sys.modules["debugpy"]
    explorer: Any = getattr(debugger, "VariableExplorer", None)
    if (explorer is None or getattr(debugger, "_is_debugpy_available", True)
            or _globals_read(explorer) - set(vars(debugger)) - set(vars(builtins)) != set(_PYDEVD_NAMES)):
        if debugger is not None:
            importlib.reload(debugger)
        notice("the debugger's modules (debugpy, pydevd) load as the worker starts")
        return False
    loaded = False

    def load_pydevd() -> bool:
        nonlocal loaded
        if not loaded:
            hook = sys.breakpointhook
            try:  # twice at most: a cell importing debugpy in the same moment can fail both imports
                error = _pydevd_into(debugger) and _pydevd_into(debugger)
            finally:
                _keep_the_users_hook(hook)
            if error is not None:
                notice(f"the debugger's modules could not be loaded ({type(error).__name__}: {error}): "
                       "its variable explorer shows nothing")
                return False
            loaded = True
        return True

    class _ExplorerOnDemand:
        """ipykernel's `VariableExplorer`, made (with pydevd loaded) when first used."""

        def __init__(self) -> None:
            self._made: Any = None

        def __getattr__(self, name: str) -> Any:
            if self._made is None:
                self._made = explorer() if load_pydevd() else _NoVariables()
            return getattr(self._made, name)

    start = getattr(getattr(debugger, "Debugger", None), "start", None)
    if callable(start):
        def start_keeping_the_hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            hook = sys.breakpointhook
            try:
                return start(self, *args, **kwargs)
            finally:
                _keep_the_users_hook(hook)

        debugger.Debugger.start = start_keeping_the_hook
    debugger.VariableExplorer = _ExplorerOnDemand
    debugger._is_debugpy_available = True
    sys.breakpointhook = _breakpoint_ignored
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return True


def _pydevd_into(debugger: Any) -> Exception | None:
    """pydevd's names (`_PYDEVD_NAMES`) into `ipykernel.debugger`; the error where they could not
    be loaded (pydevd refuses to for reasons of its own: a module of the folder's shadowing one it uses)."""
    try:
        _ipykernel(_PYDEVD_FIRST)
        for name, module in _PYDEVD_NAMES.items():
            loaded = _ipykernel(module)
            setattr(debugger, name, loaded if module.endswith(f".{name}") else getattr(loaded, name))
    except Exception as error:  # whatever pydevd raises, the explorer answers without it
        return error
    return None


def _globals_read(cls: Any) -> set[str]:
    """The global names the methods of `cls` read (their nested code's included)."""
    import dis  # noqa: PLC0415 — the standard library only until `main`

    codes = [f.__code__ for f in vars(cls).values() if hasattr(f, "__code__")]
    names: set[str] = set()
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
        names |= {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    return names


def _breakpoint_ignored() -> None:
    """``breakpoint()`` before the debugger's modules are loaded: what debugpy's hook does with no
    debugger attached (it ignores PYTHONBREAKPOINT too, and takes no arguments)."""


def _keep_the_users_hook(hook: Any) -> None:
    """pydevd installs its breakpoint hook as it loads: under ipykernel that was before any cell, so
    a hook a cell set since (`hook`, unless it is `_breakpoint_ignored`) is put back."""
    if hook is not _breakpoint_ignored:
        sys.breakpointhook = hook


class _NoVariables:
    """The variable explorer where pydevd could not be loaded: nothing to show, and the frontend answered."""

    def track(self) -> None:
        pass

    def untrack_all(self) -> None:
        pass

    def get_children_variables(self, variable_ref: Any = None) -> list[Any]:
        return []


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


def start_up_output_waits(bound: float = SUBSCRIBER_BOUND) -> None:
    """What the worker runs and prints as it starts (IPython's startup files, `exec_lines`) waits
    until the proxy has subscribed to its iopub, `bound` seconds at most: printed before, it was
    published to no one (a PUB socket drops what it sends with no subscriber): the kernel's log
    never had generation 1's start-up lines (started before the proxy's imports), and missed a
    spare's whenever the proxy subscribed late (both of two full suites run side by side, 1 in 12
    runs of the test beside one). ipykernel 7's iopub is an XPUB that hears each subscription
    (it answers with JEP 65's `iopub_welcome`); 6.29's PUB hears none, and is left as it is."""
    iostream = _ipykernel("ipykernel.iostream")
    app = _ipykernel("ipykernel.kernelapp").IPKernelApp
    handle = getattr(getattr(iostream, "IOPubThread", None), "_handle_subscription", None)
    init_code = getattr(app, "init_code", None)
    if not callable(handle) or not callable(init_code):
        return
    subscribed = threading.Event()

    def _handle_subscription(self: Any, frames: Any) -> Any:
        try:
            return handle(self, frames)
        finally:
            subscribed.set()

    def _init_code_once_heard(self: Any, *args: Any, **kwargs: Any) -> Any:
        subscribed.wait(bound)
        return init_code(self, *args, **kwargs)

    iostream.IOPubThread._handle_subscription = _handle_subscription
    app.init_code = _init_code_once_heard


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
            _flooded.set()
            self.flush()
        unflushed[id(self)] = count
        return written

    iostream.OutStream.write = _write_bounded


def memory_back_after_floods(libc: Any = None) -> None:
    """What a flood of output left free in the worker's heap goes back to the system once its execute
    has replied (`malloc_trim`). glibc keeps freed memory for reuse, and the 256 KiB messages of
    `flush_by_size`, freed as they are sent, raise its threshold for giving a block a mapping of its
    own (to the size of a freed one), so they come from the heap, which does not shrink while a
    block near its top lives: after three cells that printed 50 MiB and 100,000 lines each, the
    worker held 101 MiB of anonymous memory, and 51 after a trim (2026-12-06). Only after an execute
    during which a stream flushed by size (256 KiB written): a trivial cell pays nothing. Where the C
    library has no `malloc_trim` (macOS), or Python has no ctypes, nothing changes."""
    try:
        if libc is None:
            import ctypes  # noqa: PLC0415 — here only: a Python built without _ctypes runs its workers too

            libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (ImportError, OSError, AttributeError):
        return
    kernel: Any = getattr(_ipykernel("ipykernel.ipkernel"), "IPythonKernel", None)
    execute = getattr(kernel, "execute_request", None)
    if execute is None:
        return

    pending: list[threading.Timer] = []

    def _trim() -> None:
        pending.clear()
        trim(0)

    async def execute_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await execute(self, *args, **kwargs)
        finally:
            if _flooded.is_set() and not pending:
                _flooded.clear()
                timer = threading.Timer(TRIM_AFTER, _trim)
                timer.daemon = True
                pending.append(timer)
                timer.start()

    kernel.execute_request = execute_request


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


# How long a SIGINT the main thread has not taken waits before it is sent to that thread again.
RESEND_AFTER = 0.05


class _Interrupts:
    """Every SIGINT a worker is sent, taken once by its main thread (see `interrupts_land`): the
    socket Python's C handler writes each signal's number to, while a handler of ours is installed,
    and the thread that sends a SIGINT the main thread has not taken to that thread again."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a handler may run again inside itself: reentrant
        self.drained = threading.Event()
        self.main = threading.main_thread().ident
        self.pair: tuple[socket.socket, socket.socket] | None = None  # (read, write), once made
        self.watcher: threading.Thread | None = None
        # An execute's handler runs, its cell's code not yet (see `_held_until_the_code`).
        self.before_code = False

    def arm(self) -> None:
        """Ours is the wakeup fd, unless another is there (asyncio's, for a cell's handler: then
        nothing is counted, and the handler runs as under ipykernel). On the main thread only."""
        if self.pair is None:
            read, write = socket.socketpair()
            read.setblocking(False)
            write.setblocking(False)
            self.pair = (read, write)
        ours = self.pair[1].fileno()
        before = _set_wakeup_fd(ours, warn_on_full_buffer=False)
        if before not in (-1, ours):
            _set_wakeup_fd(before)
        elif self.watcher is None:
            self.watcher = threading.Thread(target=self.watch, name="klbr interrupts", daemon=True)
            self.watcher.start()

    def disarm(self) -> None:
        """No wakeup fd of ours between cells (trio, on ipykernel 6, warns of one it finds)."""
        if self.pair is not None:
            now = _set_wakeup_fd(-1)
            if now != self.pair[1].fileno():
                _set_wakeup_fd(now)

    def counting(self) -> bool:
        """Whether ours is the wakeup fd now (on the main thread: the handler asks)."""
        now = _set_wakeup_fd(-1)
        _set_wakeup_fd(now)
        return self.pair is not None and now == self.pair[1].fileno()

    def take(self) -> bool:
        """Drain what the C handler wrote: True if a SIGINT was among it (under `lock`)."""
        taken = False
        if self.pair is not None:
            try:
                while chunk := self.pair[0].recv(4096):
                    taken = taken or int(signal.SIGINT) in chunk
            except OSError:
                pass
        self.drained.set()
        return taken

    def watch(self) -> None:
        """The watcher thread: a SIGINT still undrained `RESEND_AFTER` after it came goes to the
        main thread, again and again until taken; what nobody's handler will drain, it drains."""
        import select  # noqa: PLC0415 — once the first cell arms it

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        assert self.pair is not None and self.main is not None  # armed before it starts
        read = self.pair[0]
        while True:
            select.select([read], [], [])
            self.drained.clear()
            if self.drained.wait(RESEND_AFTER):
                continue
            with self.lock:
                try:
                    waiting = read.recv(4096, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                if int(signal.SIGINT) in waiting and isinstance(_getsignal(signal.SIGINT), _Landing):
                    signal.pthread_kill(self.main, signal.SIGINT)
                else:
                    self.take()


_interrupts = _Interrupts()
_signal, _getsignal, _set_wakeup_fd = signal.signal, signal.getsignal, signal.set_wakeup_fd


class _Landing:
    """A SIGINT handler as installed: it runs for a SIGINT it drains, once (the flag a late resend
    set again is an echo), and then wakes the running asyncio loop."""

    __slots__ = ("handler",)

    def __init__(self, handler: Any):
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> Any:
        with _interrupts.lock:
            if _interrupts.before_code and _interrupts.counting():
                return None  # left undrained: the watcher sends it again until the cell's code runs
            if not _interrupts.take() and _interrupts.counting():
                return None
        result = self.handler(signum, frame)
        try:
            import asyncio  # noqa: PLC0415 — ipykernel has, by any cell

            asyncio.get_running_loop().call_soon_threadsafe(_nothing)
        except RuntimeError:
            pass
        return result


def _nothing() -> None:
    """What wakes a loop."""


def _given(handler: Any) -> Any:
    return handler.handler if isinstance(handler, _Landing) else handler


def _without_landing(tb: Any) -> None:
    """A traceback that ends in `_Landing.__call__` (the KeyboardInterrupt ipykernel's handler raised
    in it) ends one frame earlier, where the signal came: the cell's own line, as under ipykernel."""
    before = None
    while tb is not None and tb.tb_next is not None:
        before, tb = tb, tb.tb_next
    if before is not None and tb.tb_frame.f_code is _Landing.__call__.__code__:
        before.tb_next = None


def _install(signalnum: int, handler: Any) -> Any:
    """`signal.signal`, SIGINT's handlers installed wrapped, each given back as it was given."""
    if signalnum != signal.SIGINT:
        return _signal(signalnum, handler)
    if callable(handler) and not isinstance(handler, _Landing):
        _interrupts.arm()  # before the handler: a SIGINT between the two is counted
        before = _signal(signalnum, _Landing(handler))
    else:
        before = _signal(signalnum, handler)
        if not callable(handler):
            _interrupts.disarm()
    return _given(before)


def _held_until_the_code() -> None:
    """A SIGINT that comes while ipykernel runs an execute's handler but not yet its cell's code
    (klbr sends the interrupt of a cell once it sees its execute_input, published there) raised
    its KeyboardInterrupt in ipykernel's own code: "KeyboardInterrupt caught in kernel", and the
    execute never replied. Between the handler's start and IPython's `run_code` the wrapper leaves
    the signal undrained, and the watcher sends it again until the code runs; an execute that ends
    without running code (aborted) has it dropped with ipykernel's SIG_IGN."""
    kernel: Any = getattr(_ipykernel("ipykernel.ipkernel"), "IPythonKernel", None)
    shell: Any = getattr(_ipykernel("IPython.core.interactiveshell"), "InteractiveShell", None)
    execute, run_code = getattr(kernel, "execute_request", None), getattr(shell, "run_code", None)
    if execute is None or run_code is None:
        notice("a SIGINT that comes before a cell's code runs may end the execute without a reply")
        return

    async def execute_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        _interrupts.before_code = True
        try:
            return await execute(self, *args, **kwargs)
        finally:
            _interrupts.before_code = False

    async def run_code_now(self: Any, *args: Any, **kwargs: Any) -> Any:
        _interrupts.before_code = False
        return await run_code(self, *args, **kwargs)

    kernel.execute_request = execute_request
    shell.run_code = run_code_now


def interrupts_land() -> None:
    """An interrupt always lands, once. A SIGINT sent to the worker (its group: `killpg`, as
    jupyter_client sends it) sets Python's flag from the C handler on whichever thread the kernel
    picked, and the Python handler runs on the main thread when it next checks. Two ways that was
    too late: the signal landed on the main thread just before a blocking call began (`time.sleep`
    between releasing the GIL and entering the syscall: the GIL's hand-over to a thread that wants
    it holds that window open for as long as the other thread takes to be scheduled), or on
    another thread (Linux hands a process-directed signal to any thread that does not block it
    when the main thread cannot take it at once). Either way the sleep went on and klbr killed the
    worker after its grace (WorkerKilled, the namespace lost): 7 of 500 such signals under load with
    ipykernel's handler, 0 with this (benchmarks/interrupts.py, 2026-12-06).

    So every SIGINT handler is installed wrapped (`signal.signal` and `getsignal`, patched before
    ipykernel binds them, give back the handler as given), and while one is, Python writes each
    signal's number to a socket of ours (`signal.set_wakeup_fd`). A watcher thread sees the byte;
    if the handler has not drained it `RESEND_AFTER` later, it sends SIGINT to the main thread
    (`pthread_kill`), which interrupts whatever call it waits in, and again until taken. The wrapper
    runs the handler only for a SIGINT it drains, so the flag a late resend set again is an echo and
    does nothing (resends are sent under the lock the wrapper drains under). Where another wakeup fd
    is set (asyncio's, for a handler a cell added to its loop) nothing is counted: the handler runs
    as under ipykernel. A handler that returns is followed by a wake of the running asyncio loop:
    ipykernel cancels an awaiting cell from its SIGINT handler with the loop's plain `call_soon`,
    and the loop, waiting in epoll, slept on to its timeout (`await asyncio.sleep(60)` ran to its
    end, and was killed). The wrapper's own frame is taken out of what IPython shows of the
    KeyboardInterrupt it raised. A SIGINT that comes before the cell's code runs waits for it
    (`_held_until_the_code`). Must run before ipykernel is imported (`kernelbase` binds
    `signal.signal`)."""
    signal.signal = _install
    signal.getsignal = lambda signalnum: _given(_getsignal(signalnum))
    # What IPython shows of an exception (and keeps as sys.last_traceback, and ipykernel replies
    # with) passes through `_get_exc_info` (IPython 8 and 9): the wrapper's frame goes there.
    shell: Any = getattr(_ipykernel("IPython.core.interactiveshell"), "InteractiveShell", None)
    get_exc_info = getattr(shell, "_get_exc_info", None)
    if callable(get_exc_info):
        def _get_exc_info(self: Any, exc_tuple: Any = None) -> Any:
            found = get_exc_info(self, exc_tuple)
            _without_landing(found[2])
            return found

        shell._get_exc_info = _get_exc_info
    _held_until_the_code()


def memory_error_says_why(limit: int) -> None:
    """A MemoryError under `limit_memory`'s limit says, in the cell, which limit it met and where it
    is set: bare, it left the user guessing whether the machine or klbr ran out. Its message gains
    the words as IPython takes the exception to show it (`_get_exc_info`, as `interrupts_land`)."""
    if not limit:
        return
    size = f"{limit / (1 << 30):.1f} GiB" if limit >= 1 << 30 else f"{limit / (1 << 20):.0f} MiB"
    why = (f"this worker's memory limit of {size} stopped an allocation; the namespace is kept. The limit "
           "is Supervisor.memory_limit (the kernel's configuration), or what `%klbr memory LIMIT` set for "
           "this generation: `%klbr memory 8G` and `%klbr restart` give the next generation more")
    shell: Any = getattr(_ipykernel("IPython.core.interactiveshell"), "InteractiveShell", None)
    get_exc_info = getattr(shell, "_get_exc_info", None)
    if callable(get_exc_info):
        def _get_exc_info(self: Any, exc_tuple: Any = None) -> Any:
            found = get_exc_info(self, exc_tuple)
            error = found[1]
            if isinstance(error, MemoryError) and not any(why in str(a) for a in error.args):
                error.args = (f"{error.args[0]} ({why})" if error.args else why, *error.args[1:])
            return found

        shell._get_exc_info = _get_exc_info


def main() -> None:
    """The worker: each change above, then ipykernel's own launcher with this process's arguments."""
    limit = limit_memory()
    jupyter_client_on_demand()
    if not keep_debugger_out():
        debugger_on_demand()  # before anything imports `ipykernel.ipkernel`, which 6.29 has import debugpy
    interrupts_land()  # first of what patches ipykernel: `kernelbase` binds `signal.signal` as it is imported
    memory_error_says_why(limit)
    lossless_iopub()
    start_up_output_waits()
    flush_by_size()
    memory_back_after_floods()
    flush_only_what_waits()
    shell_on_main_thread()
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if "__file__" not in globals():  # run as source text (`worker.BOOTSTRAP`): its code's file is `SOURCE_NAME`
        # A module of that file, under a name of its own: ipykernel 7's debugger hides the frames of
        # the modules loaded as the kernel starts (by file), and this code's are under every cell's
        # (`interrupts_land` wraps the execute), so JupyterLab's call stack showed them.
        sys.modules["__main__"].__file__ = SOURCE_NAME
        sys.modules.setdefault("klbr_bootstrap", sys.modules["__main__"])
    main()
