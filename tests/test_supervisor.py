"""A `Supervisor` driven with no proxy: a listener that records what it is told, real ipykernel workers.

What the proxy does with these reports is the proxy's; here is what the supervisor itself promises
its driver: a generation ready, a cell's reply and output, the loss of a worker reported once (after
what it sent) and a new generation ready after it, and a shutdown that leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from pathlib import Path

import pytest
from jupyter_client.session import Session
from traitlets import TraitError

from klbr_supervisor.states import EndReason, SupervisorState
from klbr_supervisor.supervisor import Supervisor

TIMEOUT = 120  # seconds for anything to happen, on a loaded machine


class Recorder:
    """A `WorkerListener` that keeps everything it is told, in order, and lets a test wait for it."""

    def __init__(self):
        self.heard: list[tuple] = []
        self._changed = asyncio.Event()

    def worker_message(self, generation, channel, wire):
        self._note("message", generation, channel, wire)

    def generation_ready(self, generation):
        self._note("ready", generation)

    def generation_ended(self, generation, ending, refusal):
        self._note("ended", generation, ending)

    def cell_note(self, msg_id, text):
        self._note("note", msg_id, text)

    def _note(self, *event) -> None:
        self.heard.append(event)
        self._changed.set()

    async def first(self, match, after: int = 0) -> tuple:
        """The first event from `after` on that `match` accepts, once it has come."""
        async with asyncio.timeout(TIMEOUT):
            while True:
                for event in self.heard[after:]:
                    if match(event):
                        return event
                self._changed.clear()
                await self._changed.wait()


def _children() -> set[int]:
    """This process's child processes, by pid."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.add(int(pid))
    return found


def _execute(session: Session, code: str) -> tuple[str, list]:
    msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                          "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    return msg["header"]["msg_id"], session.serialize(msg)


async def _cell(supervisor: Supervisor, recorder: Recorder, session: Session, code: str) -> tuple[str, str]:
    """Run `code` on the current generation, sent as the frontend's `session` sent it: its reply's
    status and what it printed."""
    start = len(recorder.heard)
    msg_id, frames = _execute(session, code)
    assert supervisor.send_execute(frames, msg_id=msg_id, code=code, counts=True, timeout=None)

    def about(event, channel, msg_type):
        return (event[0] == "message" and event[2] == channel and event[3].msg_type == msg_type
                and event[3].parent_id == msg_id)

    reply = await recorder.first(lambda e: about(e, "shell", "execute_reply"), start)
    await recorder.first(lambda e: about(e, "iopub", "status") and e[3].content["execution_state"] == "idle", start)
    supervisor.cells.finished(msg_id)
    printed = "".join(e[3].content["text"] for e in recorder.heard[start:] if about(e, "iopub", "stream"))
    return reply[3].content["status"], printed


def test_a_supervisor_serves_replaces_a_lost_worker_and_shuts_down_with_no_proxy(tmp_path, monkeypatch):
    monkeypatch.setenv("KLBR_DB", str(tmp_path / "log.sqlite3"))
    before = _children()

    async def drive() -> tuple[list, list[int]]:
        key = os.urandom(16).hex().encode()
        frontend = Session(key=key, username="user")  # what requests come from
        recorder = Recorder()
        supervisor = Supervisor(recorder, session=Session(key=key, username="kernel"), standby=False)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(supervisor.run())
            _, first = await recorder.first(lambda e: e[0] == "ready")
            assert await _cell(supervisor, recorder, frontend, "kept = 6 * 7\nprint(kept)") == ("ok", "42\n")
            pids = [first.pid]
            heard = len(recorder.heard)
            os.kill(first.pid, signal.SIGKILL)
            _, ended, ending = await recorder.first(lambda e: e[0] == "ended", heard)
            assert ended is first and ending.reason is EndReason.LOST and "SIGKILL" in ending.how, ending
            _, second = await recorder.first(lambda e: e[0] == "ready", heard)
            assert second.number == 2 and second.pid != first.pid and supervisor.current is second
            pids.append(second.pid)
            status, printed = await _cell(supervisor, recorder, frontend, "print('kept' in dir())")
            assert (status, printed) == ("ok", "False\n")  # a new worker: the namespace went with the old one
            await supervisor.shutdown()
        return recorder.heard, pids

    heard, pids = asyncio.run(drive())
    kinds = [event[0] for event in heard if event[0] != "message"]
    assert kinds == ["ready", "ended", "ready", "ended"], kinds  # each generation reported once each way
    assert heard[-1][2].reason is EndReason.SHUTDOWN
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived the supervisor's shutdown"
    assert _children() <= before, "a process the supervisor started is still running"


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")], ids=["negative", "nan", "inf"])
@pytest.mark.parametrize("setting", ["standby_idle_timeout", "standby_delay"])
def test_a_standby_time_that_is_no_number_of_seconds_is_refused_by_name(setting, value):
    with pytest.raises(TraitError, match=rf"^Supervisor\.{setting}: {value:g} is not a number of seconds, 0 or more$"):
        Supervisor(Recorder(), session=Session(key=b"k", username="kernel"), **{setting: value})


def test_the_standby_row_says_what_starts_a_resting_spare(tmp_path, monkeypatch):
    """A resting spare comes back with the next cell, unless cells are refused (a crash loop, a lost
    link): then `%klbr restart` comes first, and the row does not promise the next cell. With no
    spare kept at all, it says off."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the supervisor makes its runtime directory
    supervisor = Supervisor(Recorder(), session=Session(key=b"k", username="kernel"), standby_idle_timeout=600)
    supervisor.rest.resting = True
    assert supervisor.status()["standby"] == "resting (no cell for 600 s); the next cell starts it"
    supervisor.succession.set_state(SupervisorState.HANDING_OVER, "a test")
    supervisor.succession.set_state(SupervisorState.CRASH_LOOP, "a test")
    assert supervisor.status()["standby"] == "resting (no cell for 600 s)"
    supervisor.standby = False
    assert supervisor.status()["standby"] == "off"
