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

from utils import collect, execute, results, start_kernel, stream_text, value, wait_for_stream, worker_pid


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
