"""A request's life as a state machine: every move goes through one door that refuses what the
machine does not allow, and the lives listed here are the ones a real kernel's requests live.

The lives are walked through the door without a kernel, and each is also seen in a real kernel:
one session serves a request of each kind, with its debug log on, where the door logs every move
(`Request.move`). A move made past the door leaves a gap in a request's logged moves."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from klbr_kernel.requests.request import TRANSITIONS, WITH_WORKER, IllegalMove, Phase, Request
from klbr_supervisor.messages.wire import Wire
from utils import collect, start_kernel, until, worker_pid


def _req(msg_type: str = "execute_request") -> Request:
    return Request("shell", Wire([], [], {"msg_type": msg_type, "msg_id": "m1"}, {}), {"code": "1"})


# A bug planted for one cell (the way tests/test_boundary.py plants them): its output makes the
# relay raise, and the error boundary answers it while its worker still runs it.
PLANTED = """
import klbr_kernel.proxy.delivery as delivery
_iopub = delivery.Delivery._iopub
def iopub(self, wire, req):
    if wire.msg_type == "stream" and "plant-boundary" in str(wire.content.get("text")):
        raise RuntimeError("planted bug in the output path")
    return _iopub(self, wire, req)
delivery.Delivery._iopub = iopub
"""
_MOVE = re.compile(r"request (?P<msg_type>\S+) (?P<msg_id>\S+): (?P<before>\w+) -> (?P<after>\w+)"
                   r"(?P<boundary> \(the error boundary\))?$")


@pytest.fixture(scope="module")
def lived(tmp_path_factory) -> dict[str, list[tuple[str, str, bool]]]:
    """One kernel session serving a request of each kind: {what: the moves its door logged, each
    (before, after, by the error boundary)}. Its workers are the misbehaving ipykernel whose first
    completion kills it; no spare, so a lost generation's successor starts only when it is needed."""
    tmp = tmp_path_factory.mktemp("lives")
    (tmp / "jupyter_klbr_config.py").write_text(PLANTED)
    db, log, gate = tmp / "log.sqlite3", tmp / "kernel.log", tmp / "gate"
    # The misbehaving worker of the run, with a marker of this session's own: its first completion
    # is the one that kills its worker, whatever ran before.
    spec = KernelSpecManager().get_kernel_spec("misbehaving-complete").to_dict()
    spec["argv"][spec["argv"].index("complete") + 1] = str(tmp / "complete-marker")
    (tmp / "kernels" / "lives-complete").mkdir(parents=True)
    (tmp / "kernels" / "lives-complete" / "kernel.json").write_text(json.dumps(spec))
    env = {"KLBR_DB": str(db), "JUPYTER_CONFIG_DIR": str(tmp), "KLBR_TEST_START_GATE": str(gate),
           "JUPYTER_PATH": os.pathsep.join([str(tmp), os.environ["JUPYTER_PATH"]])}
    ids: dict[str, tuple[str, str]] = {}

    def logged(text: str) -> bool:
        return text in log.read_text()

    with start_kernel(extra_arguments=["--Supervisor.worker_kernel=lives-complete", "--KlbrKernelApp.log_level=DEBUG",
                                       "--Supervisor.standby=False", "--Store.busy_timeout=120"],
                      env=env, log=log) as (km, kc):

        def cell(what: str, code: str) -> dict:
            msg_id = kc.execute(code)
            ids[what] = ("execute_request", msg_id)
            return collect(kc, msg_id, timeout=60)[0]["content"]

        def request(what: str, msg_type: str, msg_id: str) -> dict:
            ids[what] = (msg_type, msg_id)
            reply = kc.get_shell_msg(timeout=60)
            assert reply["parent_header"]["msg_id"] == msg_id
            return reply["content"]

        assert cell("a cell", "1")["status"] == "ok"
        assert request("a completion retried after its worker died", "complete_request",
                       kc.complete("pri", 3))["status"] == "ok"
        assert request("a completion", "complete_request", kc.complete("pri", 3))["status"] == "ok"
        assert cell("a %klbr cell", "%klbr status")["status"] == "ok"
        assert request("history from the cell log", "history_request",
                       kc.history(hist_access_type="tail", n=3))["status"] == "ok"
        assert cell("a cell answered by the error boundary", "print('plant-boundary')")["ename"] == "InternalError"
        # A cell whose row waits for the database's write lock while its worker dies: the next
        # generation is held back (the gate) until the row is in, so the cell waits for it, queued.
        pid = worker_pid(kc)
        ended = log.read_text().count("current generation: serving -> none")
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        gate.touch()
        msg_id = kc.execute("'runs on the next'")
        ids["a cell whose generation ended while its row committed"] = ("execute_request", msg_id)
        until(lambda: logged(f"{msg_id}: queued -> recording"), 30, "the cell's row waits for the lock")
        os.kill(pid, signal.SIGKILL)
        until(lambda: log.read_text().count("current generation: serving -> none") > ended, 30,
              "the proxy saw its generation end")
        lock.rollback()
        lock.close()
        until(lambda: logged(f"{msg_id}: recording -> queued"), 60, "the row is in, and the cell waits")
        gate.unlink()
        assert collect(kc, msg_id, timeout=60)[0]["content"]["status"] == "ok"
        # The database file goes away: the next cell's row cannot be written (the store looks at
        # its file at most every half second, so the cells of that half second may still be written).
        os.rename(db, db.with_name("moved.sqlite3"))
        deadline = time.monotonic() + 30
        n = 0
        while cell("a cell whose row could not be written", f"{n}").get("ename") != "SessionPaused":
            n += 1
            assert time.monotonic() < deadline, "the session did not pause"

    # By type and id: a msg_id alone identifies nothing (the manager's shutdown_request reuses the
    # first execute's, as every clone of a jupyter_client Session starts its counter again).
    moves: dict[tuple[str, str], list[tuple[str, str, bool]]] = {}
    for line in log.read_text().splitlines():
        match = _MOVE.search(line)
        if match:
            moves.setdefault((match["msg_type"], match["msg_id"]), []).append(
                (match["before"], match["after"], bool(match["boundary"])))
    return {what: moves.get(key, []) for what, key in ids.items()}


def _life(moves: list[tuple[str, str, bool]]) -> list[str]:
    """The phases a request went through, its time with the worker (sent, then awaiting its reply
    or its idle) as one SENT; assert that its moves chain, each from where the last one left it
    (what moved it past the door leaves a gap)."""
    assert moves, "no move was logged"
    for (_, after, _), (before, _, _) in itertools.pairwise(moves):
        assert after == before, f"moved past the door from {after} to {before}: {moves}"
    phases = [moves[0][0], *(after for _, after, _ in moves)]
    with_worker = {p.value for p in WITH_WORKER}
    life = []
    for phase in phases:
        name = "SENT" if phase in with_worker else Phase(phase).name
        if not (life and name == "SENT" == life[-1]):
            life.append(name)
    return life


@pytest.mark.parametrize("what, path", [
    ("a cell", ["RECORDING", "SENT", "ANSWERED", "DONE"]),  # a recorded cell the worker answers
    ("a completion", ["SENT", "ANSWERED", "DONE"]),  # a completion, a comm message
    ("a %klbr cell", ["PROXY", "ANSWERED", "DONE"]),  # a %klbr cell
    ("history from the cell log", ["ANSWERED", "DONE"]),  # refused, aborted, or history from the cell log
    ("a completion retried after its worker died", ["SENT", "QUEUED", "SENT", "ANSWERED", "DONE"]),  # retried once after a loss
    ("a cell whose generation ended while its row committed",
     ["RECORDING", "QUEUED", "SENT", "ANSWERED", "DONE"]),  # its generation ended while its row committed
    ("a cell whose row could not be written", ["RECORDING", "ANSWERED", "DONE"]),  # SessionPaused
])
def test_the_lives_a_request_can_have(what, path, lived):
    req = _req()
    for phase in path:
        req.move(Phase[phase])
    assert req.phase is Phase.DONE
    assert _life(lived[what]) == ["QUEUED", *path], f"{what} lived otherwise in a real kernel"


# How each phase is reached through the door, from the first.
_TO = {"QUEUED": [], "SENT": ["SENT"], "PROXY": ["PROXY"], "ANSWERED": ["ANSWERED"], "DONE": ["ANSWERED", "DONE"]}


@pytest.mark.parametrize("start, to", [
    ("QUEUED", "DONE"),  # nothing reaches the frontend without an answer first
    ("SENT", "RECORDING"),  # a row is written before the worker sees the cell, never after
    ("PROXY", "SENT"),  # a %klbr cell never goes to a worker
    ("PROXY", "QUEUED"),  # nor is it retried
    ("ANSWERED", "SENT"),  # an answered request is never sent again (no replay)
    ("ANSWERED", "QUEUED"),
    ("DONE", "ANSWERED"),  # nor answered twice
    ("DONE", "QUEUED"),
])
def test_illegal_moves_are_refused(start, to, lived):
    req = _req()
    for phase in _TO[start]:
        req.move(Phase[phase])
    with pytest.raises(IllegalMove):
        req.move(Phase[to])
    assert req.phase is Phase[start]
    # In the real kernel, every request's moves went through the door (they chain, from queued to
    # done, the boundary's only to done), and none made this one.
    for what, moves in lived.items():
        _life(moves)
        assert moves[0][0] == "queued" and moves[-1][1] == "done", f"{what}: {moves}"
        assert all(after == "done" for _, after, boundary in moves if boundary), f"{what}: {moves}"
        assert (start.lower(), to.lower()) not in {(before, after) for before, after, _ in moves}, f"{what}: {moves}"
    assert any(boundary for moves in lived.values() for _, _, boundary in moves), "the boundary answered a cell"


def test_done_is_the_only_end_and_every_phase_can_reach_it():
    assert TRANSITIONS[Phase.DONE] == frozenset()
    for phase in Phase:
        seen, todo = set(), [phase]
        while todo:
            p = todo.pop()
            seen.add(p)
            todo += [q for q in TRANSITIONS[p] if q not in seen]
        assert Phase.DONE in seen, f"{phase} cannot be answered"


def test_which_requests_expect_a_reply_from_the_worker():
    assert _req("execute_request").expects_reply
    assert _req("complete_request").expects_reply
    assert not _req("comm_msg").expects_reply
    control = Request("control", Wire([], [], {"msg_type": "debug_request", "msg_id": "d"}, {}))
    assert control.expects_reply
    assert not Request("control", Wire([], [], {"msg_type": "abort_request", "msg_id": "a"}, {})).expects_reply


# -- each field of a request has one writer ---------------------------------------------------------

KERNEL = Path(__file__).resolve().parent.parent / "klbr_kernel"
# Who a field's comment names as its writer ("the door: ..."), and the module that is.
WRITERS = {"the door": "frontend.door", "itself": "requests", "current": "requests.current",
           "delivery": "proxy.delivery", "brackets": "proxy.brackets", "dispatch": "proxy.dispatch",
           "the cell log": "cell_log.recording", "the execution counts": "requests.counts",
           "lifecycle": "proxy.lifecycle", "own": "proxy.own", "resends": "proxy.resends"}
# Names a request goes by where it is written (`req`, a followed `target`, the `execute` of one).
REQUEST_NAMES = {"req", "target", "original", "live", "followed", "execute", "dup", "r"}


def _fields(cls: str, path: Path) -> dict[str, str]:
    """The fields of dataclass `cls` in `path`, each with the writer its comment names."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    found = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            comment = lines[item.lineno - 1].partition("#")[2].strip()
            found[item.target.id] = next((w for w in WRITERS if comment.startswith(w)), comment)
    return found


def _writes() -> dict[str, set[str]]:
    """Per field name, the modules of klbr_kernel that assign it (or append to it, clear it, ...)
    on something named as a request is."""
    writes: dict[str, set[str]] = {}
    for path in KERNEL.rglob("*.py"):
        module = ".".join(path.relative_to(KERNEL).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            elif isinstance(node, ast.AugAssign):
                targets = [node.target]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("append", "remove", "extend", "clear", "pop", "begin", "landed")):
                targets = [node.func.value]
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                owner = target.value
                named = (isinstance(owner, ast.Name) and owner.id in REQUEST_NAMES) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "execute")
                if named or (isinstance(owner, ast.Name) and owner.id == "self" and module.startswith("requests.")):
                    writes.setdefault(target.attr, set()).add(module)
    return writes


def test_each_field_of_a_request_is_written_by_the_one_writer_its_comment_names():
    """`Request` and its `Execute` name, beside each field, the one part that writes it (or the
    request itself, through a method); no other module writes it."""
    fields = {**_fields("Request", KERNEL / "requests" / "request.py"),
              **_fields("Execute", KERNEL / "requests" / "execute.py")}
    unnamed = {name: comment for name, comment in fields.items() if comment not in WRITERS}
    assert not unnamed, f"fields whose comment names no writer: {unnamed}"
    writes = _writes()
    wrong = {}
    for name, writer in fields.items():
        module = WRITERS[writer]
        others = {m for m in writes.get(name, ()) if not (m == module or m.startswith(module + "."))}
        if others:
            wrong[name] = (writer, sorted(others))
    assert not wrong, f"written elsewhere than by its writer: {wrong}"
