"""A frontend that stops reading iopub while a cell floods: the proxy's memory stays bounded, the
reply and the idle still arrive, and what was dropped is said and is in the cell log (see `outbox`)."""

from __future__ import annotations

from pathlib import Path

from utils import collect, execute, raw_socket, start_kernel, stream_text

WRITES = 4096  # of 64 KiB: 256 MiB, four times what the outbox keeps for a slow frontend


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _stall_after(tmp_path: Path, seconds: float) -> dict:
    """The environment of a kernel whose outbox waits `seconds` for a subscriber that takes nothing."""
    (tmp_path / "jupyter_klbr_config.py").write_text(f"import klbr_kernel.frontend.outbox\nklbr_kernel.frontend.outbox.STALL = {seconds}\n")
    return {"JUPYTER_CONFIG_DIR": str(tmp_path), "KLBR_DB": str(tmp_path / "log.sqlite3")}


def test_a_stalled_frontend_costs_bounded_memory_and_still_gets_its_reply_and_idle(tmp_path):
    # It reads nothing while the cell runs: long enough here not to count as gone for good.
    with start_kernel(env=_stall_after(tmp_path, 600)) as (km, kc):
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


def test_a_subscriber_that_reads_nothing_does_not_hold_back_the_others(tmp_path):
    """A second client subscribes to iopub and never reads (a suspended console). Once it has taken
    nothing for `STALL` seconds, outputs it cannot take go past it, and what closes a request goes
    past it after `CATCH_UP`: the notebook's client, reading, gets its reply and its idle, and its
    outputs in order (on a loaded machine it may itself lag and lose some, as with a PUB); the
    stalled one loses what did not fit."""
    with start_kernel(env=_stall_after(tmp_path, 2)) as (km, kc), raw_socket(km, "iopub") as (stalled, _):
        stalled.rcvhwm = 10
        welcome = kc.execute("'the stalled subscriber is in'")  # its subscription is through
        collect(kc, welcome)
        reply, outputs = execute(kc, "for i in range(20_000):\n    print(i, flush=True)", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        lines = [int(line) for line in stream_text(outputs).split()]
        assert lines == sorted(set(lines)) and lines[0] == 0, "in order, none twice"
