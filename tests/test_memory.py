"""A local worker's memory: sampled, shown by `%klbr status`, kept in the cell log, and named as the
likely cause when a worker dies of it."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
from pathlib import Path

import jupyter_client
import pytest
from ipykernel.ipkernel import IPythonKernel

from klbr_supervisor.boot import bootstrap
from klbr_supervisor.memory import Sample, parse_size, size_text, verdict
from klbr_supervisor.system import heap
from utils import collect, execute, start_kernel, status_row, stream_text, until, value, wait_for_stream, worker_pid

MiB = 1 << 20
ROOT = Path(__file__).parent.parent
OLDEST = ROOT / ".venv-ipykernel" / "bin" / "python"  # `python:`'s interpreter (`make .venv-ipykernel/.ready`)
_SIZE = re.compile(r"([\d.]+) (MiB|GiB)")


def _bytes(text: str) -> list[int]:
    """The sizes `%klbr status` wrote, in order, in bytes (to the precision it wrote them)."""
    return [int(float(n) * (MiB if unit == "MiB" else 1 << 30)) for n, unit in _SIZE.findall(text)]


def test_sizes_read_and_written():
    assert parse_size("512M") == 512 * MiB and parse_size("8G") == 8 << 30 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("1000") == 1000 and parse_size(0) == 0
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    assert size_text(300 * MiB) == "300 MiB" and size_text(int(21.3 * (1 << 30))) == "21.3 GiB"


def test_the_verdict_claims_memory_only_with_a_sign():
    kill, near, low = -signal.SIGKILL, Sample(900 * MiB, 900 * MiB, 1000 * MiB), Sample(100 * MiB, 100 * MiB, 1000 * MiB)
    assert verdict(kill, asked=False, last=near, limit=None, oom_killed=False) == \
        "most likely out of memory: it used 900 MiB, with about 1000 MiB available"
    assert verdict(kill, asked=False, last=low, limit=None, oom_killed=False) is None
    assert verdict(kill, asked=False, last=None, limit=None, oom_killed=False) is None
    assert verdict(kill, asked=True, last=near, limit=None, oom_killed=True) is None  # klbr's own kill
    assert verdict(kill, asked=False, last=low, limit=None, oom_killed=True) == "out of memory (the system killed it)"
    assert verdict(3, asked=False, last=near, limit=None, oom_killed=False) is None
    assert "Supervisor.memory_limit" in verdict(kill, asked=False, last=near, limit=1000 * MiB, oom_killed=False)
    assert "512 MiB" in verdict(-signal.SIGABRT, asked=False, last=low, limit=512 * MiB, oom_killed=False)
    assert verdict(-signal.SIGABRT, asked=False, last=low, limit=None, oom_killed=False) is None


def test_status_and_the_cell_log_show_a_workers_memory(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        small, _ = execute(kc, "1 + 1")
        now, peak = _bytes(status_row(kc, "memory"))[:2]
        assert 10 * MiB < now <= peak < 1 << 30
        assert status_row(kc, "memory").endswith("no limit")
        found = value(kc, "from klbr_kernel import host\nhost.inspect()")
        assert found["memory"]["limit"] is None and found["memory_limit"] is None
        assert 10 * MiB < found["memory"]["rss"] <= found["memory"]["peak"] < 1 << 30
        big, _ = execute(kc, "x = b'1' * (300 << 20)")  # touched, so resident
        assert big["content"]["status"] == "ok"
        execute(kc, "del x")
        now, peak = _bytes(status_row(kc, "memory"))[:2]
        assert peak >= 300 * MiB > now
    log = sqlite3.connect(db)

    def cell_peak(reply: dict) -> int:
        (found,) = log.execute("SELECT memory_peak FROM cells WHERE msg_id = ?",
                               (reply["parent_header"]["msg_id"],)).fetchone()
        return found

    assert 10 * MiB < cell_peak(small) < 300 * MiB <= cell_peak(big)
    generation = until(lambda: log.execute("SELECT memory_peak FROM generations WHERE number = 1"
                                           " AND ended IS NOT NULL").fetchone(), 10, "the generation's end")
    assert generation[0] >= 300 * MiB


def test_inspect_says_the_workers_memory_and_its_limit():
    with start_kernel(extra_arguments=["--Supervisor.memory_limit=512M"]) as (km, kc):
        execute(kc, "from klbr_kernel import host")
        found = value(kc, "host.inspect()")
        assert found["memory_limit"] == 512 * MiB
        before = found["memory"]
        assert 10 * MiB < before["rss"] <= before["peak"] < 512 * MiB and before["limit"] == 512 * MiB
        # Sampled when asked: what a cell just allocated (touched, so resident) is in the next answer.
        grown = value(kc, "x = b'1' * (200 << 20)\nhost.inspect()['memory']")
        assert grown["rss"] >= before["rss"] + 190 * MiB and grown["peak"] >= grown["rss"]
        after = value(kc, "del x\nhost.inspect()['memory']")
        assert after["rss"] < grown["rss"] - 150 * MiB and after["peak"] >= grown["rss"]


# A cell that holds what it allocates in pages it has touched (resident), then says so and waits to be
# killed; `host.inspect()` takes a sample at once, so the last sample before the kill is this one. (Its
# client's first call starts a thread, whose stack counts against the limit: made before growing.)
GROWN = ("from klbr_kernel import host\nhost.inspect()\nx = b'1' * ({mib} << 20)\nhost.inspect()\n"
         "print('grown', flush=True)\nimport time\ntime.sleep(120)")


def _killed_from_outside(kc, code: str) -> dict:
    """Run `code` until it prints, SIGKILL its worker from here (as the OOM killer would), and
    return the cell's reply."""
    pid = worker_pid(kc)
    msg_id = kc.execute(code)
    wait_for_stream(kc, msg_id)
    os.kill(pid, signal.SIGKILL)
    reply, _ = collect(kc, msg_id)
    content = reply["content"]
    assert content["ename"] == "WorkerLost" and "killed by signal 9 (SIGKILL)" in content["evalue"], content
    return content


@pytest.mark.parametrize("options", [[], ["--Supervisor.memory_limit=512M"]], ids=["no-limit", "limit"])
def test_a_worker_killed_at_low_memory_is_not_called_out_of_memory(options):
    with start_kernel(extra_arguments=options) as (km, kc):
        content = _killed_from_outside(kc, GROWN.format(mib=20))
        assert "memory" not in content["evalue"]


def test_a_worker_killed_near_its_limit_is_most_likely_out_of_memory():
    with start_kernel(extra_arguments=["--Supervisor.memory_limit=512M"]) as (km, kc):
        content = _killed_from_outside(kc, GROWN.format(mib=320))
        found = re.search(r"most likely out of memory: it used (\d+) MiB, with about 512 MiB available", content["evalue"])
        assert found and 410 <= int(found[1]) <= 512, content["evalue"]
        assert "Supervisor.memory_limit" in content["evalue"]


# A cell that allocates in C, as a library would, and aborts when the allocation fails.
C_ABORT = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
           "if libc.malloc(2 << 30) is None:\n    libc.abort()")


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_memory_limit_fails_the_cell_and_the_kernel_serves_on(where):
    options = ["--Supervisor.memory_limit=512M"]
    env = None
    if where == "python":
        assert OLDEST.exists(), f"{OLDEST} is missing: make .venv-ipykernel/.ready"
        options.append(f"--Supervisor.placement=python:{OLDEST}")
        env = {"PYTHONPATH": str(ROOT)}
    with start_kernel(extra_arguments=options, env=env) as (km, kc):
        execute(kc, "x = 41")
        pid = worker_pid(kc)
        reply, _ = execute(kc, "y = bytearray(2 << 30)")
        assert reply["content"]["ename"] == "MemoryError", reply["content"]
        # Not bare: which limit, and where it is set.
        assert reply["content"]["evalue"].startswith("this worker's memory limit of 512 MiB stopped an allocation")
        assert "Supervisor.memory_limit" in reply["content"]["evalue"], reply["content"]
        assert value(kc, "x + 1") == 42 and worker_pid(kc) == pid  # the namespace, the same worker
        assert status_row(kc, "memory").endswith("limit 512 MiB")
        reply, _ = execute(kc, C_ABORT)
        content = reply["content"]
        assert content["ename"] == "WorkerLost" and "aborted (SIGABRT)" in content["evalue"], content
        assert "its memory limit is 512 MiB (Supervisor.memory_limit)" in content["evalue"]
        assert execute(kc, "x")[0]["content"]["ename"] == "NameError"  # a new generation
        assert worker_pid(kc) != pid and status_row(kc, "generation").startswith("2")


def test_klbr_memory_sets_the_next_generations_limit_without_a_config_file():
    with start_kernel() as (km, kc):
        execute(kc, "x = 41")
        _, outputs = execute(kc, "%klbr memory 512M")
        said = stream_text(outputs, "stdout")
        assert said == ("The next generation's memory limit is 512 MiB; generation 1 keeps no limit until it ends "
                        "(`%klbr restart` starts the next one now).\n"), said
        assert value(kc, "x + 1") == 42 and status_row(kc, "memory").endswith("no limit (the next generation's: 512 MiB)")
        execute(kc, "%klbr restart")
        assert status_row(kc, "memory").endswith("limit 512 MiB")
        reply, _ = execute(kc, "y = bytearray(2 << 30)")
        assert reply["content"]["ename"] == "MemoryError", reply["content"]
        for bad, says in [("lots", "'lots' is not a size"), ("1G 2G", "usage: %klbr memory")]:
            reply, _ = execute(kc, f"%klbr memory {bad}")
            assert reply["content"]["ename"] == "UsageError" and says in reply["content"]["evalue"], reply["content"]
        _, outputs = execute(kc, "%klbr memory none")
        assert stream_text(outputs, "stdout").startswith("The next generation's memory limit is none; generation 2 keeps 512 MiB")
        _, outputs = execute(kc, "%klbr memory")
        assert stream_text(outputs, "stdout").startswith("The next generation's memory limit is none")


FLOOD = "import sys\nchunk = 'x' * 65536\nfor _ in range(800):\n    sys.stdout.write(chunk)\n"  # 50 MiB


def _anon_mib(pid: int) -> float:
    """The anonymous part of `pid`'s PSS: the memory it has of its own."""
    line = next(line for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines() if line.startswith("Pss_Anon:"))
    return int(line.split()[1]) / 1024


def test_a_flood_of_output_leaves_its_memory_to_the_system_not_to_the_worker():
    """Three cells that print 50 MiB each and three that print 100,000 lines: on ipykernel 7 the
    worker's heap kept 41 to 78 MiB more than it began with (glibc keeps what is freed), more than
    plain ipykernel's 25; a second after the last cell it is back to ~24 more (decision 74)."""
    with start_kernel() as (km, kc):
        pid = worker_pid(kc)
        before = _anon_mib(pid)
        for _ in range(3):
            assert execute(kc, FLOOD, timeout=120)[0]["content"]["status"] == "ok"
            assert execute(kc, "for i in range(100_000):\n    print(i)", timeout=120)[0]["content"]["status"] == "ok"
        until(lambda: _anon_mib(pid) < before + 30, 30, f"the worker's memory back below {before + 30:.0f} MiB")
        assert worker_pid(kc) == pid


def test_without_malloc_trim_nothing_is_trimmed(monkeypatch):
    """The portable way, as on a Mac: a C library without malloc_trim, or a Python without ctypes,
    leaves ipykernel's execute as it is (the worker's bootstrap), and the proxy's `give_back` says it
    could not."""
    execute_request = IPythonKernel.execute_request
    bootstrap.memory_back_after_floods(libc=object())
    assert IPythonKernel.execute_request is execute_request
    monkeypatch.setitem(sys.modules, "ctypes", None)  # a Python built without _ctypes: its workers still start
    bootstrap.memory_back_after_floods()
    assert IPythonKernel.execute_request is execute_request
    assert heap.give_back() is True  # glibc, here
    monkeypatch.setattr(heap, "_TRIM", None)
    assert heap.give_back() is False


@pytest.mark.parametrize("where", ["local", "python"])
def test_a_worker_runs_jupyter_clients_package_init_only_when_a_cell_asks_for_it(where):
    """jupyter_client's managers, launcher and provisioners (importlib.metadata's entry points among
    them) stay out of a worker at rest (2.2 MiB), and a cell that asks for any of them gets them as
    under plain ipykernel: from threads at once, by name, by `import *`, and reloaded."""
    options = [f"--Supervisor.placement=python:{OLDEST}"] if where == "python" else []
    with start_kernel(extra_arguments=options) as (km, kc):
        loaded = "sorted(m for m in __import__('sys').modules if m.startswith(('jupyter_client.', 'importlib.metadata')))"
        at_rest = value(kc, loaded)
        assert "jupyter_client.session" in at_rest and "jupyter_client.connect" in at_rest
        assert not any(m.startswith(("jupyter_client.manager", "jupyter_client.provisioning", "importlib.metadata"))
                       for m in at_rest), at_rest
        # Sixteen threads asking at once: each waits for the one that runs `__init__` (before, some
        # were told there was no such attribute while it ran).
        threads = ("import threading, jupyter_client\nasked = []\n"
                   "def ask():\n    try:\n        asked.append(jupyter_client.MultiKernelManager.__name__)\n"
                   "    except AttributeError as e:\n        asked.append(str(e))\n"
                   "ts = [threading.Thread(target=ask) for _ in range(16)]\n"
                   "for t in ts:\n    t.start()\nfor t in ts:\n    t.join()\n")
        assert execute(kc, threads)[0]["content"]["status"] == "ok"
        assert value(kc, "sorted(set(asked))") == ["MultiKernelManager"]
        code = ("from jupyter_client import KernelManager, launch_kernel, find_connection_file\n"
                "import jupyter_client, importlib\n"
                "(KernelManager().kernel_name, launch_kernel.__module__, jupyter_client.__version__ == "
                "jupyter_client._version.__version__, importlib.reload(jupyter_client).MultiKernelManager.__name__)")
        assert value(kc, code) == ("python3", "jupyter_client.launcher", True, "MultiKernelManager")
        assert value(kc, "exec('from jupyter_client import *', ns := {}) or sorted({'KernelManager', "
                         "'BlockingKernelClient', 'AsyncKernelClient', 'write_connection_file'} - set(ns))") == []


def test_jupyter_client_imported_already_is_left_as_it_is():
    bootstrap.jupyter_client_on_demand()
    assert sys.modules["jupyter_client"] is jupyter_client and "__getattr__" not in vars(jupyter_client)
