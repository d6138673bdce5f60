"""A frontend that stops reading iopub while a cell floods: the proxy's memory stays bounded, the
reply and the idle still arrive, and what was dropped is said and is in the cell log (see `outbox`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import start_kernel, stream_text, until

WRITES = 4096  # of 64 KiB: 256 MiB, four times what the outbox keeps for a slow frontend


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_stalled_frontend_costs_bounded_memory_and_still_gets_its_reply_and_idle(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        kernel_pid = km.provisioner.process.pid
        msg_id = kc.execute(f"import sys\nfor i in range({WRITES}):\n"
                            "    sys.stdout.write(f'{i:06d}' + 'x' * 65529 + '\\n'); sys.stdout.flush()\n'flooded'")
        # iopub is not read meanwhile: the reply comes on shell all the same.
        reply = kc.get_shell_msg(timeout=180)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
        peak = _peak_rss_mib(kernel_pid)
        print(f"proxy peak RSS {peak:.0f} MiB")
        outputs = []
        while True:  # now the frontend reads again: the whole bracket is there
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            outputs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert outputs[0]["msg_type"] == "status" and outputs[0]["content"]["execution_state"] == "busy"
        lines = stream_text(outputs, "stdout").splitlines()
        assert all(len(line) == 65535 for line in lines)  # what arrives arrives whole
        delivered = [int(line[:6]) for line in lines]
        assert delivered == sorted(set(delivered)), "in order, none twice"
        notice = stream_text(outputs, "stderr")
        assert "outputs of this request were not delivered" in notice and "%klbr replay" in notice
        dropped = int(notice.split("klbr: ")[1].split()[0])
        # A dropped output holds one line or more (ipykernel may join writes between its flushes).
        assert 0 < dropped <= WRITES - len(delivered)
        assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["'flooded'"]
        assert peak < 250, f"the proxy peaked at {peak:.0f} MiB"


def test_a_stalled_proxy_loses_nothing_its_worker_publishes(tmp_path):
    """The kernel process is stopped (a loaded machine, at its worst) while its worker prints 5000
    lines: the worker's iopub must not drop at ipykernel's high-water mark of 1000, or lines and the
    cell's idle are lost and the frontend waits forever."""
    done = tmp_path / "done"
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        proxy = km.provisioner.process.pid
        msg_id = kc.execute(f"print('first', flush=True)\nimport os, signal\nos.kill({proxy}, signal.SIGSTOP)\n"
                            "for i in range(5000):\n    print(i, flush=True)\n"
                            f"open({str(done)!r}, 'w').close()")
        try:
            until(done.exists, 120, "the worker has printed everything while the kernel was stopped")
        finally:
            os.kill(proxy, signal.SIGCONT)
        outputs = []
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            outputs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert stream_text(outputs).split() == ["first", *map(str, range(5000))]
        assert kc.get_shell_msg(timeout=30)["content"]["status"] == "ok"
