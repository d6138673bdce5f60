"""`Supervisor.debugger = False`: workers klbr starts keep debugpy out (issue 41, decision 70).

Real kernels and workers: ipykernel of .venv (the newest pyproject admits) locally, prelaunched and
started by the supervisor, and 6.29 (the oldest) on a `python:` placement. Off, no module of
debugpy's is loaded in the worker, kernel_info says no debugger (JupyterLab then hides its toggle),
a debug_request is answered as ipykernel answers it without debugpy, and cells run; the default
keeps the debugger, loaded when a frontend first uses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager

from klbr_supervisor.boot import bootstrap, prelaunch
from utils import (
    DEBUGPY_LOADED,
    assert_no_debugger,
    collect,
    debug_request,
    drain,
    execute,
    kernel_info,
    start_kernel,
    status_row,
    stream_text,
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


# What a cell's own breakpoint hook prints, set before the debugger's modules load.
USERS_HOOK = "import sys\ndef mine():\n    print('the user hook')\nsys.breakpointhook = mine"


def _printed(kc, code: str, heard: list[dict]) -> str:
    """What a cell printed; every iopub message read meanwhile goes to `heard`."""
    reply, outputs = execute(kc, code, seen=heard, allow_stdin=False)
    assert reply["content"]["status"] == "ok", reply["content"]
    return stream_text(outputs)


@pytest.mark.parametrize("workers", [("local", f"python:{OTHER}"), (f"python:{sys.executable}",)],
                         ids=["local-and-python-6.29", "python-7-as-source-text"])
def test_the_default_debugger_loads_when_first_used_and_stops_at_a_breakpoint(kernel, workers):
    """By default debugpy and pydevd load when a frontend first uses the debugger (decision 72), and
    the debugger then works as ipykernel's: a breakpoint in a cell stops it, with the cell's frames
    in the stack (none of klbr's bootstrap, run from its file or as source text), its
    variables are read, and it goes on. Before, `breakpoint()` is ignored, as under plain ipykernel
    with no debugger attached, and JupyterLab's `debugInfo` (sent as a notebook opens) is answered
    without loading them; a breakpoint hook a cell sets is kept as they load, and nothing of
    theirs reaches a cell. ipykernel 6.29 says nothing of its debugger in kernel_info (7 lists it in
    supported_features): the proxy says it has one, as it does."""
    km, kc = kernel
    for placement in workers:
        if placement != "local":
            reply, _ = execute(kc, f"%klbr placement {placement}")
            assert reply["content"]["status"] == "ok", reply["content"]
        assert value(kc, DEBUGPY_LOADED) == []
        info = kernel_info(kc)
        assert info["debugger"] is True and "debugger" in info["supported_features"]
        assert status_row(kc, "debugger") == "on"
        heard: list[dict] = []
        assert _printed(kc, "x = 42\nbreakpoint()\nprint('after')", heard) == "after\n"
        assert debug_request(kc, "debugInfo")["body"]["isStarted"] is False
        assert value(kc, DEBUGPY_LOADED) == []

        # pydevd loads for what comes first, the variable explorer or the debugger's start (the last
        # worker); a breakpoint hook a cell set stays.
        execute(kc, USERS_HOOK, seen=heard)
        first, then = ("initialize", "inspectVariables") if placement == workers[-1] != "local" else (
            "inspectVariables", "initialize")
        for command in (first, then):
            answer = debug_request(kc, command)
            if command == "inspectVariables":
                assert "x" in [v["name"] for v in answer["body"]["variables"]], answer
            else:
                assert answer["success"] is True
            assert "pydevd" in value(kc, DEBUGPY_LOADED, seen=heard)
            assert _printed(kc, "breakpoint()", heard) == "the user hook\n"
        execute(kc, "sys.breakpointhook = sys.__breakpointhook__", seen=heard)

        assert debug_request(kc, "attach")["success"] is True
        code = "def f(a, b):\n    c = a + b\n    return c\n\nf(2, 3)"
        source = debug_request(kc, "dumpCell", {"code": code})["body"]["sourcePath"]
        placed = debug_request(kc, "setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source},
                                                      "sourceModified": False})
        assert placed["body"]["breakpoints"][0]["verified"] is True, placed
        assert debug_request(kc, "configurationDone")["success"] is True
        msg_id = kc.execute(code)
        stopped = kc.get_iopub_msg(timeout=30)
        while stopped["msg_type"] != "debug_event" or stopped["content"]["event"] != "stopped":
            heard.append(stopped)
            stopped = kc.get_iopub_msg(timeout=30)
        assert stopped["content"]["body"]["reason"] == "breakpoint"
        thread = stopped["content"]["body"]["threadId"]
        frames = debug_request(kc, "stackTrace", {"threadId": thread})["body"]["stackFrames"]
        # the cell's frames, as under ipykernel: none of klbr's worker or bootstrap (hidden as ipykernel's
        # own modules). Under ipykernel 7 a worker run as source text keeps `python -c`'s own frame at the
        # bottom: hiding "<string>" would hide the code a cell runs with exec() too.
        launcher = [("<module>", "<string>")] if placement == f"python:{sys.executable}" else []
        assert [(f["name"], f["source"]["path"]) for f in frames] == [("f", source), ("<module>", source),
                                                                       *launcher], frames
        frame = frames[0]
        assert frame["line"] == 2
        scopes = debug_request(kc, "scopes", {"frameId": frame["id"]})["body"]["scopes"]
        local = debug_request(kc, "variables", {"variablesReference": scopes[0]["variablesReference"]})
        assert {v["name"]: v["value"] for v in local["body"]["variables"]} == {"a": "2", "b": "3"}
        assert debug_request(kc, "continue", {"threadId": thread})["success"] is True
        reply, outputs = collect(kc, msg_id, seen=heard)
        assert reply["content"]["status"] == "ok"
        assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["5"]
        assert debug_request(kc, "disconnect", {"restart": False, "terminateDebuggee": False})["success"] is True
        # Nothing but what the cells printed: pydevd's warning of frozen modules, which ipykernel writes
        # as it starts (to no cell), is not written as it loads (it was, into the next cell's output).
        printed = {m["content"]["text"] for m in heard + drain(kc.iopub_channel) if m["msg_type"] == "stream"}
        assert printed == {"after\n", "the user hook\n"}, printed


def test_an_explorer_whose_pydevd_cannot_load_shows_nothing_and_says_why():
    """pydevd refuses to load in some folders (a file that shadows a standard module); ipykernel then
    has no debugger at all. Loaded on demand, the variable explorer answers with no variables, and
    the worker's stderr (the kernel's log) says why."""
    code = (f"import sys; bootstrap = {{'__name__': 'klbr_bootstrap'}}\n"
            f"exec(compile(open({bootstrap.__file__!r}).read(), 'bootstrap', 'exec'), bootstrap)\n"
            "assert bootstrap['debugger_on_demand']()\n"
            "sys.modules['debugpy.server.api'] = None\n"
            "import ipykernel.debugger\n"
            "print(ipykernel.debugger.VariableExplorer().get_children_variables())")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]
    assert f"{bootstrap.NOTICE}ipykernel" in done.stderr and "could not be loaded (ModuleNotFoundError" in done.stderr


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


# `ipykernel.debugger` modules of shapes 6.29 to 7.x do not have: no variable explorer; debugpy imported
# unguarded; an explorer that reads a name of pydevd's the bootstrap does not load.
GUARDED = "try:\n    import debugpy\n    _is_debugpy_available = True\nexcept ImportError:\n    _is_debugpy_available = False\n"
OTHER_SHAPES = {
    "no-explorer": GUARDED,
    "unguarded": "import debugpy\n_is_debugpy_available = True\nclass VariableExplorer:\n    pass\n",
    "other-names": (GUARDED + "class VariableExplorer:\n    def track(self):\n"
                    "        return SuspendedFramesManager, _FramesTracker, pydevd_frame_utils, pydevd_api\n"),
}


@pytest.mark.parametrize("shape", OTHER_SHAPES)
def test_an_ipykernel_whose_debugger_module_is_not_6_29_to_7_s_keeps_its_debugger_loaded_as_it_starts(tmp_path, shape):
    """`bootstrap.debugger_on_demand` imports `ipykernel.debugger` with debugpy hidden; where that
    module is not as 6.29 to 7.x have it, it is imported again with debugpy, so the worker has the
    debugger ipykernel gives it (and starts), and its stderr says the modules load at start."""
    package = tmp_path / "ipykernel"
    package.mkdir()
    (package / "__init__.py").write_text("__version__ = '99.0'\n")
    (package / "debugger.py").write_text(OTHER_SHAPES[shape])
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); bootstrap = {{'__name__': 'klbr_bootstrap'}}\n"
            f"exec(compile(open({bootstrap.__file__!r}).read(), 'bootstrap', 'exec'), bootstrap)\n"
            "print(bootstrap['debugger_on_demand'](), __import__('ipykernel.debugger').debugger._is_debugpy_available)")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert f"{bootstrap.NOTICE}ipykernel 99.0" in done.stderr and "load as the worker starts" in done.stderr
