"""ipywidgets: comms open and round-trip through the proxy, also while a cell runs."""

from __future__ import annotations

import time

from utils import collect, execute


def _comm_open(outputs):
    return next(m for m in outputs if m["msg_type"] == "comm_open" and m["content"]["target_name"] == "jupyter.widget"
                and m["content"]["data"]["state"].get("_model_name") == "IntSliderModel")


def _set_value(kc, comm_id, value):
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": {"value": value}, "buffer_paths": []}})
    kc.shell_channel.send(msg)


def test_a_widget_round_trips_through_the_proxy(kernel):
    km, kc = kernel
    reply, outputs = execute(kc, "import ipywidgets as w\ns = w.IntSlider(value=3)\ndisplay(s)")
    comm_id = _comm_open(outputs)["content"]["comm_id"]
    assert any(m["msg_type"] == "display_data" for m in outputs)

    _set_value(kc, comm_id, 7)  # frontend -> kernel
    reply, outputs = execute(kc, "s.value")
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["7"]

    reply, outputs = execute(kc, "s.value = 9")  # kernel -> frontend
    updates = [m for m in outputs if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id]
    assert updates and updates[-1]["content"]["data"]["state"]["value"] == 9

    kc.comm_info(target_name="jupyter.widget")
    info = kc.get_shell_msg(timeout=10)
    assert comm_id in info["content"]["comms"]


def test_comm_messages_are_not_held_behind_a_running_cell(kernel):
    km, kc = kernel
    reply, outputs = execute(kc, "import ipywidgets as w\ns = w.IntSlider(value=0)\ndisplay(s)")
    comm_id = _comm_open(outputs)["content"]["comm_id"]
    code = ("import asyncio\nprint('waiting for the widget', flush=True)\nfor _ in range(200):\n"
            "    if s.value == 11:\n        break\n    await asyncio.sleep(0.05)\ns.value")
    start = time.monotonic()
    msg_id = kc.execute(code)
    while (m := kc.get_iopub_msg(timeout=10))["parent_header"].get("msg_id") != msg_id or m["msg_type"] != "stream":
        pass  # the cell runs
    _set_value(kc, comm_id, 11)
    reply, outputs = collect(kc, msg_id, timeout=30)
    assert reply["content"]["status"] == "ok", reply["content"]  # the worker's own reply, not klbr's after a grace
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["11"]
    assert time.monotonic() - start < 8, "the comm reached the worker while the cell ran"
