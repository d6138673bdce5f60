"""Interrupts that land: a klbr worker's SIGINT ends what its main thread waits in, once, whatever
thread the kernel hands the signal to and whenever it comes, on the newest ipykernel (`local`) and the
oldest admitted (`python:`), and the handlers a cell installs see what they installed
(`interrupts_land` in klbr_supervisor/boot/bootstrap.py). Under load, with busy threads: the soak
(tests/test_soak.py); the moment a signal comes just before a sleep begins, measured:
benchmarks/interrupts.py.
"""

from __future__ import annotations

import ctypes
import re
import signal

import pytest

from utils import (
    collect,
    cpu_burners,
    execute,
    results,
    start_kernel,
    stream_text,
    until,
    value,
    wait_for_stream,
    worker_pid,
)


def _placed(kc, where: str, other_python) -> None:
    if where == "python":
        assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_sigint_the_kernel_hands_to_another_thread_still_ends_the_sleep_once(tmp_path, other_python, where):
    """Linux hands a process-directed signal to any thread that does not block it when the main thread
    cannot take it at once; Python's handler then sets a flag the sleeping main thread never looks at,
    and the cell slept on (a klbr interrupt then ended as WorkerKilled, the namespace lost). Here the
    signal goes to a bystander thread on purpose (tgkill): the worker hands it to its main thread,
    and a second sleep after the KeyboardInterrupt is not cut short by any echo of that hand-over."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        _placed(kc, where, other_python)
        execute(kc, "kept = 42")
        pid = worker_pid(kc)
        msg_id = kc.execute("import threading, time\nidle = threading.Event()\n"
                            "bystander = threading.Thread(target=idle.wait, daemon=True)\nbystander.start()\n"
                            "try:\n    print(bystander.native_id, flush=True)\n    time.sleep(600)\n"
                            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
                            "time.sleep(1)\n'slept on'")
        bystander = int(wait_for_stream(kc, msg_id))
        assert ctypes.CDLL(None, use_errno=True).tgkill(pid, bystander, signal.SIGINT) == 0
        reply, outputs = collect(kc, msg_id, timeout=60)  # without the hand-over: the sleep's 600 s
        assert reply["content"]["status"] == "ok", reply["content"]
        assert stream_text(outputs).endswith("interrupted\n") and results(outputs) == ["'slept on'"]
        assert worker_pid(kc) == pid and value(kc, "kept") == 42


@pytest.mark.parametrize("where", ["local", "python"])
def test_an_interrupted_cells_traceback_ends_at_its_own_line_as_under_ipykernel(tmp_path, other_python, where):
    """The KeyboardInterrupt is raised by ipykernel's handler inside klbr's wrapper of it: the
    traceback the notebook shows (and the reply carries) has the cell's line last, no frame of klbr's
    (nbclient's own suite compares it with plain ipykernel's)."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        _placed(kc, where, other_python)
        # Word that it sleeps comes from another thread once the sleep has begun: a print of the main
        # thread's own waits for ipykernel's I/O thread, whose stream can reach the test first, and an
        # interrupt then (under load) rightly ends in that wait, as it does on plain ipykernel.
        msg_id = kc.execute("import threading, time\nthreading.Timer(0.5, print, ('sleeping',), {'flush': True}).start()\n"
                            "time.sleep(600)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, outputs = collect(kc, msg_id, timeout=60)
        plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in reply["content"]["traceback"]]
        assert plain[-2].rstrip().endswith("----> 3 time.sleep(600)") and plain[-1] == "KeyboardInterrupt: ", plain
        (shown,) = [m["content"] for m in outputs if m["msg_type"] == "error"]
        assert shown["traceback"] == reply["content"]["traceback"]


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_cells_own_sigint_handler_runs_once_per_interrupt_and_is_given_back_as_installed(tmp_path, other_python,
                                                                                           where):
    """klbr installs every SIGINT handler wrapped, to know whether it ran: a cell sees ipykernel's
    handler and its own as they were installed, and its own runs once for one interrupt."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        _placed(kc, where, other_python)
        assert value(kc, "import signal\nsignal.getsignal(signal.SIGINT) is signal.default_int_handler") is True
        msg_id = kc.execute("import signal, threading\ncalls = []\ncalled = threading.Event()\n"
                            "def mine(signum, frame):\n    calls.append(signum)\n    called.set()\n"
                            "before = signal.signal(signal.SIGINT, mine)\n"
                            "given = (before is signal.default_int_handler, signal.getsignal(signal.SIGINT) is mine)\n"
                            "print('waiting', flush=True)\ncalled.wait(60)\n(given, calls)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, outputs = collect(kc, msg_id, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert results(outputs) == ["((True, True), [2])"]


@pytest.mark.parametrize("where", ["local", "python"])
def test_an_interrupted_await_is_cancelled_and_the_namespace_stays(tmp_path, other_python, where):
    """ipykernel cancels an awaiting cell on SIGINT from a handler whose wake-up its loop missed, so
    the cell went on to the end of its sleep (and klbr, hearing no reply, killed the worker): klbr's
    workers wake their loop on a signal, on the newest ipykernel and on the oldest admitted."""
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        if where == "python":
            assert execute(kc, f"%klbr placement python:{other_python}")[0]["content"]["status"] == "ok"
        execute(kc, "kept = 42")
        # A signal handler a cell left on the loop (asyncio's, through its own wakeup fd) still runs
        # while a later cell awaits.
        assert execute(kc, "import os, signal, asyncio\nloop = asyncio.get_running_loop()\n"
                           "fired = asyncio.Event()\n"
                           "loop.add_signal_handler(signal.SIGUSR1, fired.set)")[0]["content"]["status"] == "ok"
        assert value(kc, "os.kill(os.getpid(), signal.SIGUSR1)\n"
                         "await asyncio.wait_for(fired.wait(), 30)\n'fired'") == "fired"
        # asyncio takes the wakeup fd away when a loop's last signal handler goes: it is armed per cell.
        assert execute(kc, "loop.remove_signal_handler(signal.SIGUSR1)")[0]["content"]["status"] == "ok"
        pid = worker_pid(kc)
        msg_id = kc.execute("import asyncio\nprint('awaiting', flush=True)\nawait asyncio.sleep(600)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        reply, _ = collect(kc, msg_id, timeout=60)  # without the wake-up: WorkerKilled, after the grace
        assert reply["content"]["ename"] == "CancelledError", reply["content"]
        assert worker_pid(kc) == pid and value(kc, "kept") == 42


# A worker that has read the next execute (its busy is out) and is held before ipykernel installs
# its SIGINT handler (`pre_handler_hook`), until the test lets it go: the moment, held open, where a
# worker slow to begin a cell under load ignored the interrupt (SIG_IGN between cells).
_HOLD_BEFORE_THE_NEXT_CELL = """\
import os, time
kernel = get_ipython().kernel
def held(hook=kernel.pre_handler_hook):
    del kernel.pre_handler_hook
    open({held!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.01)
    hook()
kernel.pre_handler_hook = held
"""


@pytest.mark.parametrize("where", ["local", "python"])
def test_an_interrupt_before_the_worker_begins_the_cell_waits_for_it_and_keeps_the_namespace(tmp_path, other_python,
                                                                                             where):
    """ipykernel ignores SIGINT between cells and installs its handler only once it runs the next one:
    an interrupt sent to a worker that had the cell but had not begun it was lost, the cell ran on and
    klbr killed the worker after the grace (WorkerKilled, the namespace lost). Now the interrupt waits
    for the cell's execute_input, and the grace counts from then."""
    held, go = tmp_path / "held", tmp_path / "go"
    with cpu_burners(2), start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        _placed(kc, where, other_python)
        execute(kc, "kept = 42")
        pid = worker_pid(kc)
        assert execute(kc, _HOLD_BEFORE_THE_NEXT_CELL.format(held=str(held), go=str(go)))[0]["content"]["status"] == "ok"
        msg_id = kc.execute("import time\ntime.sleep(600)")
        until(held.exists, 30, "the worker reading the cell")
        interrupt = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(interrupt)
        reply = kc.control_channel.get_msg(timeout=30)  # answered once klbr has done what it does at once
        assert reply["parent_header"]["msg_id"] == interrupt["header"]["msg_id"]
        go.touch()
        reply, _ = collect(kc, msg_id, timeout=60)  # without the wait: WorkerKilled after the grace
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert worker_pid(kc) == pid and value(kc, "kept") == 42
        # An interrupt for a cell that has ended does nothing to the next.
        interrupt = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(interrupt)
        kc.control_channel.get_msg(timeout=30)
        assert value(kc, "import time\ntime.sleep(0.5)\nkept + 1") == 43


# The next cell's execute_input is out, its code not yet run: IPython's pre_run_cell holds it there.
_HOLD_BEFORE_THE_NEXT_CELLS_CODE = """\
import os, time
def held(info=None):
    get_ipython().events.unregister("pre_run_cell", held)
    open({held!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.01)
get_ipython().events.register("pre_run_cell", held)
"""


@pytest.mark.parametrize("where", ["local", "python"])
def test_an_interrupt_between_execute_input_and_the_cells_code_waits_for_the_code(tmp_path, other_python, where):
    """ipykernel has installed its handler and published execute_input, but runs its own code (and
    IPython's) before the cell's: a KeyboardInterrupt there was caught by ipykernel ("KeyboardInterrupt
    caught in kernel"), the execute never replied and klbr killed the worker. klbr's workers hold the
    signal until the cell's code runs."""
    held, go = tmp_path / "held", tmp_path / "go"
    with cpu_burners(2), start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        _placed(kc, where, other_python)
        execute(kc, "kept = 42")
        pid = worker_pid(kc)
        code = _HOLD_BEFORE_THE_NEXT_CELLS_CODE.format(held=str(held), go=str(go))
        assert execute(kc, code)[0]["content"]["status"] == "ok"
        msg_id = kc.execute("import time\ntime.sleep(600)")
        while True:  # klbr has seen it too: it forwards what it has watched
            seen = kc.get_iopub_msg(timeout=30)
            if seen["msg_type"] == "execute_input" and seen["parent_header"].get("msg_id") == msg_id:
                break
        until(held.exists, 30, "the worker holding before the cell's code")
        interrupt = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(interrupt)
        kc.control_channel.get_msg(timeout=30)  # the signal went out before this answer
        go.touch()
        reply, _ = collect(kc, msg_id, timeout=60)  # without the hold: no reply, WorkerKilled after the grace
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert worker_pid(kc) == pid and value(kc, "kept") == 42
