"""IPython and ipykernel options on the kernel's command line reach every generation's ipykernel.

nbclient's `extra_arguments`, a frontend or a kernelspec put them there as they would for ipykernel
(`--HistoryManager.hist_file=:memory:` is what nbclient's own suite passes); klbr keeps the options
of its own classes and hands the rest, as traitlets read them, to each worker it starts.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from klbr_kernel.app import KlbrKernelApp
from klbr_supervisor.boot import prelaunch
from utils import execute, results, start_kernel, value

ROOT = Path(__file__).parent.parent
OTHER = ROOT / ".venv-ipykernel" / "bin" / "python"

# What nbclient passes, an option that makes every expression's value shown, a value with spaces and
# quotes, an `IPKernelApp` option: all read by the prelaunch too, so the first worker starts with them.
# (In the order workers get them: by name.)
OPTIONS = ["--HistoryManager.hist_file=:memory:", "--IPKernelApp.code_to_run=from_app = 5",
           "--InteractiveShell.ast_node_interactivity=all", "--InteractiveShellApp.exec_lines=spaced = 'a b  c'"]
# ipykernel's own alias and flag: only ipykernel's tables read them.
FLAGS = ["--cache-size=1234", "--no-automagic"]


def assert_options_applied(kc, flags: bool = False, history: bool = False) -> None:
    """The worker behind `kc` runs with every one of `OPTIONS` (and `FLAGS`); its IPython history is
    off (klbr's default: hist_file=:memory: alone keeps it) unless `history`."""
    reply, outputs = execute(kc, "1\n2")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert results(outputs) == ["1", "2"]  # ast_node_interactivity=all: every expression's value
    shell = value(kc, "(str(get_ipython().history_manager.hist_file), get_ipython().history_manager.enabled, "
                      "spaced, from_app)")
    assert shell == (":memory:", history, "a b  c", 5)
    if flags:
        assert value(kc, "(get_ipython().cache_size, get_ipython().automagic)") == (1234, False)


def test_the_command_line_is_split_as_traitlets_reads_it_and_the_prelaunch_agrees():
    """klbr's own classes keep their options; the rest is what each worker gets, written back as
    ``--Class.trait=value``. The first worker, started before the proxy reads anything, starts with
    what the proxy will read, or not at all (it would be discarded)."""
    def read(argv):
        app = KlbrKernelApp()
        app.parse_command_line(argv)
        return app.worker_options()

    plain = ["-f", "kernel.json", "--Supervisor.cell_timeout=3", "--Store.synchronous=FULL", "--debug",
             "--InteractiveShell.ast_node_interactivity=all", "--HistoryManager.hist_file=:memory:",
             "--X.y=one two", "--HostService.max_requests_per_cell=9", "--X.y=three", "--Session.debug=True",
             "--KlbrKernelApp.max_message_size=2000000", "--log-level=INFO"]
    options = read(plain)
    assert options == ["--HistoryManager.hist_file=:memory:", "--InteractiveShell.ast_node_interactivity=all",
                       "--X.y=one two", "--X.y=three"]
    assert prelaunch.worker_options(plain) == options
    # ipykernel's flags and aliases are read with ipykernel's own tables; the prelaunch leaves them
    # to the proxy (it reads only --Class.trait=value).
    flagged = ["-f", "kernel.json", "--pylab", "--matplotlib=inline", "--cache-size", "7", "--no-automagic",
               "--ip=0.0.0.0", "--IPKernelApp.matplotlib=inline"]
    assert read(flagged) == ["--IPKernelApp.matplotlib=inline", "--InteractiveShell.automagic=False",
                             "--InteractiveShell.cache_size=7", "--InteractiveShellApp.matplotlib=inline",
                             "--InteractiveShellApp.pylab=auto"]  # --ip: the worker's connection is klbr's
    assert prelaunch.worker_options(flagged) is None
    assert prelaunch.worker_options(["-f", "kernel.json", "--InteractiveShell.colors", "nocolor"]) is None
    # The names the prelaunch takes for klbr's are the app's.
    app = KlbrKernelApp()
    assert app.own_sections() == prelaunch.KLBR_SECTIONS
    assert frozenset(app.flags) | frozenset(app.aliases) == prelaunch.KLBR_NAMES


def test_options_reach_the_prelaunched_worker_a_restarted_one_and_a_python_placement(tmp_path):
    assert OTHER.exists(), f"{OTHER} is missing: `make test` creates it (make .venv-ipykernel/.ready)"
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[*OPTIONS, "--KlbrKernelApp.log_level=INFO"], log=log) as (km, kc):
        assert_options_applied(kc)  # generation 1, spawned before the proxy's imports, and kept
        said = log.read_text()
        assert f"every worker gets {shlex.join(OPTIONS)}" in said and "discarded" not in said
        execute(kc, "%klbr restart")
        assert_options_applied(kc)  # one the supervisor started
        reply, _ = execute(kc, f"%klbr placement python:{OTHER}")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert value(kc, "__import__('sys').executable") == str(OTHER)
        assert_options_applied(kc)
        # As the worker was started: the options on its command line, word for word.
        argv = value(kc, "open('/proc/self/cmdline', 'rb').read().split(b'\\0')")
        assert argv[-len(OPTIONS) - 1:-1] == [option.encode() for option in OPTIONS]


def test_ipykernels_own_flags_and_aliases_reach_workers_too():
    """`--no-automagic`, `--cache-size=N`: with the old reading, argparse refused them and the
    kernel never started."""
    with start_kernel(extra_arguments=[*FLAGS, *OPTIONS]) as (km, kc):
        assert_options_applied(kc, flags=True)
    with start_kernel(extra_arguments=[f"--Supervisor.placement=python:{OTHER}", *FLAGS, *OPTIONS]) as (km, kc):
        assert value(kc, "__import__('sys').executable") == str(OTHER)
        assert_options_applied(kc, flags=True)


def test_options_reach_a_kernelspec_placement_as_extra_arguments(tmp_path):
    spec = tmp_path / "specs" / "kernels" / "plain-ipykernel"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain ipykernel", "language": "python"}))
    path = os.pathsep.join([str(tmp_path / "specs"), os.environ["JUPYTER_PATH"]])
    with start_kernel(extra_arguments=[*FLAGS, *OPTIONS], env={"JUPYTER_PATH": path}) as (km, kc):
        reply, _ = execute(kc, "%klbr placement kernelspec:plain-ipykernel")
        assert reply["content"]["status"] == "ok", reply["content"]
        # klbr adds no option of its own to a kernelspec's command line: its history is on, in memory
        assert_options_applied(kc, flags=True, history=True)


@pytest.mark.parametrize("where", ["local", "python"])
def test_the_users_ipython_profile_applies_in_workers_as_in_ipykernel(tmp_path, where):
    """`ipython_kernel_config.py` in IPYTHONDIR's default profile configures klbr's workers as it
    configures a plain ipykernel."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        "c.InteractiveShell.ast_node_interactivity = 'all'\n"
        "c.InteractiveShellApp.exec_lines = ['from_profile = 7']\n")
    options = [f"--Supervisor.placement=python:{OTHER}"] if where == "python" else []
    with start_kernel(extra_arguments=options, env={"IPYTHONDIR": str(tmp_path / "ipython")}) as (km, kc):
        for _ in range(2):  # the first generation, then one the supervisor started
            assert results(execute(kc, "1\n2")[1]) == ["1", "2"]
            assert value(kc, "from_profile") == 7
            execute(kc, "%klbr restart")


def test_a_worker_option_ipykernel_refuses_is_named_in_every_cells_error():
    with start_kernel(extra_arguments=["--InteractiveShell.ast_node_interactivity=bogus"]) as (km, kc):
        for _ in range(2):  # the next cell tries a new worker, which refuses it the same way
            reply, _ = execute(kc, "1")
            assert reply["content"]["ename"] == "WorkerStartFailed"
            assert "ast_node_interactivity" in reply["content"]["evalue"] and "bogus" in reply["content"]["evalue"]
