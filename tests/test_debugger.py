"""`Supervisor.debugger = False`: workers klbr starts keep debugpy out (issue 41, decision 70).

Real kernels and workers: ipykernel of .venv (the newest pyproject admits) locally, prelaunched and
started by the supervisor, and 6.29 (the oldest) on a `python:` placement. Off, no module of
debugpy's is loaded in the worker, kernel_info says no debugger (JupyterLab then hides its toggle),
a debug_request is answered as ipykernel answers it without debugpy, and cells run; the default
keeps the debugger."""

from __future__ import annotations

from pathlib import Path

from jupyter_client.manager import KernelManager

from klbr_supervisor.boot import bootstrap, prelaunch
from utils import (
    DEBUGPY_LOADED,
    assert_no_debugger,
    debug_request,
    execute,
    kernel_info,
    start_kernel,
    status_row,
    value,
)

OTHER = Path(__file__).parent.parent / ".venv-ipykernel" / "bin" / "python"
OFF = "--Supervisor.debugger=False"
def test_off_on_the_command_line_the_prelaunched_a_restarted_and_a_python_placement_worker_have_no_debugpy(
        tmp_path):
    assert OTHER.exists(), f"{OTHER} is missing: `make test` creates it (make .venv-ipykernel/.ready)"
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[OFF, "--KlbrKernelApp.log_level=INFO"], log=log) as (km, kc):
        assert_no_debugger(kc)  # generation 1, spawned before the proxy's imports, and kept
        assert "discarded" not in log.read_text()
        execute(kc, "%klbr restart")
        assert_no_debugger(kc)  # one the supervisor started
        reply, _ = execute(kc, f"%klbr placement python:{OTHER}")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert value(kc, "__import__('ipykernel').__version__") == "6.29.0"
        assert_no_debugger(kc)


def test_off_in_a_config_file_holds_too(tmp_path):
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.debugger = False\n")
    with start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)}) as (km, kc):
        assert_no_debugger(kc)


def test_the_default_keeps_the_debugger_on_ipykernel_7_and_6_29(kernel):
    """ipykernel 6.29 says nothing of its debugger in kernel_info (7 lists it in supported_features):
    the proxy says it has one, as it does."""
    km, kc = kernel
    for _ in ("newest", "oldest"):
        assert "debugpy" in value(kc, DEBUGPY_LOADED)
        info = kernel_info(kc)
        assert info["debugger"] is True and "debugger" in info["supported_features"]
        assert debug_request(kc)["success"] is True
        assert status_row(kc, "debugger") == "on"
        reply, _ = execute(kc, f"%klbr placement python:{OTHER}")
        assert reply["content"]["status"] == "ok", reply["content"]


def test_the_word_the_prelaunch_and_the_settings_give_is_the_one_the_bootstrap_takes_off():
    assert prelaunch.NO_DEBUGGER == (bootstrap.NO_DEBUGGER,)
    argv = ["x", "-f", "conn.json", bootstrap.NO_DEBUGGER, "--Session.session=s"]
    assert bootstrap.keep_debugger_out(argv) is True and argv == ["x", "-f", "conn.json", "--Session.session=s"]
    assert bootstrap.keep_debugger_out(argv) is False
    for given, read in ((["-f", "k.json"], True), ([OFF], False), (["--Supervisor.debugger=true"], True),
                        (["--Supervisor.debugger", "0"], False), (["--Supervisor.debugger=maybe"], None),
                        ([OFF, "--Supervisor.debugger=True"], None)):
        assert prelaunch.debugger_given(given) is read, given


def test_the_first_kernel_info_as_the_kernel_starts_says_no_debugger():
    """Asked at once, before the proxy's imports are done: the stand-in answers, from the command line."""
    km = KernelManager(kernel_name="klbr")
    km.start_kernel(extra_arguments=[OFF])
    kc = km.client()
    kc.start_channels()
    try:
        msg_id = kc.kernel_info()
        reply = kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["debugger"] is False, reply["content"]["banner"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def test_off_says_no_debugger_only_for_workers_klbr_starts():
    """ipykernel 6.x says nothing of its debugger: with the option off, a worker klbr started has
    none (it kept debugpy out); a `kernelspec:` or a provisioner's worker, which klbr does not start,
    keeps its own, and kernel_info and `%klbr status` say so."""
    from klbr_kernel.frontend import kernel_info  # noqa: PLC0415 — the module's setting is changed and put back

    six = {"status": "ok", "implementation": "ipython", "language_info": {"name": "python"}}  # as 6.29 answers
    kernel_info.configure(False)
    try:
        assert kernel_info.kernel_info_content(six, 1, "local")["debugger"] is False
        assert kernel_info.kernel_info_content(six, 1, "kernelspec:py", klbr_started=False)["debugger"] is True
    finally:
        kernel_info.configure(True)
    assert kernel_info.kernel_info_content(six, 1, "local")["debugger"] is True
