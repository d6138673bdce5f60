"""A bug in klbr's own handling of a request costs that request an InternalError, never a hang, and
never the kernel (semantics 1).

The bugs are planted for real: a `jupyter_klbr_config.py` in the kernel's config dir replaces some of
klbr's handlers with ones that raise, each only for the request that triggers it.
"""

from __future__ import annotations

import time

from utils import collect, execute, said, start_kernel

PLANTED = """
import klbr_kernel.proxy.own as own
import klbr_kernel.proxy.delivery as delivery
import klbr_kernel.proxy.dispatch as dispatch
import klbr_kernel.proxy.magic_cells as cells
import klbr_supervisor.supervisor as supervisor


def planted(where):
    raise RuntimeError(f"planted bug in {where}")


own.OwnAnswers.history = lambda self, req: planted("the history answer")
cells.magic_output = lambda *args: planted("a %klbr command")

_route = dispatch.Dispatch._route
def route(self, req):
    if "plant-dispatch" in req.code:
        planted("the dispatch")
    return _route(self, req)
dispatch.Dispatch._route = route

_reply = delivery.Delivery._execute_reply
def execute_reply(self, req, wire):
    if "plant-reply" in req.code:
        planted("the reply path")
    return _reply(self, req, wire)
delivery.Delivery._execute_reply = execute_reply

async def interrupt(self):
    planted("the interrupt")
supervisor.Supervisor.interrupt = interrupt
"""


def _kernel(tmp_path):
    (tmp_path / "jupyter_klbr_config.py").write_text(PLANTED)
    return start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}, log=tmp_path / "kernel.log")


def _states(outputs):
    return [m["content"]["execution_state"] for m in outputs if m["msg_type"] == "status"]


def _internal_error(reply, msg_type: str, where: str) -> None:
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "InternalError", content
    user, detail = said(content["evalue"])
    assert user == (f"klbr failed while handling this {msg_type}: a bug in klbr, not in your code. The kernel keeps "
                    "serving and the worker's namespace is kept; please report it with the kernel's log, which has "
                    "the traceback."), user
    assert f"planted bug in {where}" in detail, detail


def test_a_raising_handler_answers_its_request_and_the_kernel_keeps_serving(tmp_path):
    with _kernel(tmp_path) as (km, kc):
        for code, where in [("1  # plant-dispatch", "the dispatch"), ("2  # plant-reply", "the reply path"),
                            ("%klbr status", "a %klbr command")]:
            reply, outputs = execute(kc, code)
            _internal_error(reply, "execute_request", where)
            assert _states(outputs) == ["busy", "idle"]
            assert [m["content"]["ename"] for m in outputs if m["msg_type"] == "error"] == ["InternalError"]
            reply, outputs = execute(kc, "40 + 2")
            assert reply["content"]["status"] == "ok"
        msg_id = kc.history(hist_access_type="tail", n=3)
        reply, outputs = collect(kc, msg_id)
        _internal_error(reply, "history_request", "the history answer")
        assert _states(outputs) == ["busy", "idle"]
        reply, _ = execute(kc, "'still serving'")
        assert reply["content"]["status"] == "ok"
    log = (tmp_path / "kernel.log").read_text()
    assert "Traceback" in log and "planted bug in the reply path" in log


def test_a_failing_interrupt_is_answered_and_the_kernel_keeps_serving(tmp_path):
    """The interrupt's task raises: before the boundary, that ended the task group, and the kernel."""
    with _kernel(tmp_path) as (km, kc):
        msg_id = kc.execute("import time\ntime.sleep(1)\n'slept'")
        while kc.get_iopub_msg(timeout=10)["msg_type"] != "execute_input":
            pass
        interrupt = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(interrupt)
        reply = kc.control_channel.get_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == interrupt["header"]["msg_id"]
        _internal_error(reply, "interrupt_request", "the interrupt")
        reply, _ = collect(kc, msg_id)  # the interrupt never reached the worker: the cell ends as written
        assert reply["content"]["status"] == "ok"
        started = time.monotonic()
        reply, outputs = execute(kc, "6 * 7")
        assert reply["content"]["status"] == "ok" and time.monotonic() - started < 10
        assert km.is_alive()


PLANTED_OUTPUT = """
import klbr_kernel.proxy.delivery as delivery


def planted(where):
    raise RuntimeError(f"planted bug in {where}")


_iopub = delivery.Delivery._iopub
def iopub(self, wire, req):
    if wire.msg_type == "stream" and "plant-output" in str(wire.content.get("text")):
        planted("the output path")
    return _iopub(self, wire, req)
delivery.Delivery._iopub = iopub
"""


def test_a_cell_answered_internal_error_mid_run_is_stopped_before_the_next_runs(tmp_path):
    """The relay fails on a running cell's output: the cell is answered at once, and its worker, which
    still runs it, is interrupted. Nothing of it reaches the frontend after its idle, and the next
    cell runs only once the worker is free (semantics 11)."""
    (tmp_path / "jupyter_klbr_config.py").write_text(PLANTED_OUTPUT)
    with start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}, log=tmp_path / "kernel.log") as (km, kc):
        seen = []
        reply, outputs = execute(kc, "import time\ntry:\n    print('plant-output', flush=True)\n"
                                     "    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                                     "    print('late', flush=True)\n    stopped = True", seen=seen)
        _internal_error(reply, "execute_request", "the output path")
        reply, outputs = execute(kc, "stopped", seen=seen, timeout=60)
        assert reply["content"]["status"] == "ok" and outputs[-2]["content"]["data"]["text/plain"] == "True"
        assert not [m for m in seen if m["msg_type"] == "stream" and m["content"]["text"] == "late\n"]


def test_a_generation_whose_start_raises_before_launch_is_answered_and_shuts_down(tmp_path):
    """A bug in the start path before any worker exists: the cell gets WorkerStartFailed (not a
    hang), and a shutdown still ends the kernel at once."""
    (tmp_path / "jupyter_klbr_config.py").write_text(
        "import klbr_supervisor.supervisor as supervisor\n"
        "async def check(self, placement):\n"
        "    raise RuntimeError('planted bug in the placement check')\n"
        "supervisor.Supervisor._check = check\n")
    with start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}) as (km, kc):
        reply, _ = execute(kc, "1 + 1")
        assert reply["content"]["ename"] == "WorkerStartFailed"
        proxy = km.provisioner.process
        start = time.monotonic()
        kc.shutdown()
        assert kc.get_control_msg(timeout=10)["msg_type"] == "shutdown_reply"
        assert proxy.wait(timeout=10) == 0 and time.monotonic() - start < 10
