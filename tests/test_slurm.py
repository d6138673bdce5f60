"""`slurm://` placement against a real one-node Slurm cluster on 127.0.0.1.

`make test` installs Debian's slurm-wlm and munge (make engine-deps); this module starts munged,
slurmctld and slurmd as children of the run (`tests/slurm.py`), hands the kernel `SLURM_CONF`, and
stops them at the end. The node's interpreter is the run's own venv (ipykernel 7: CurveZMQ), named in
the spec: the kernel is reached over TCP on 127.0.0.1, encrypted.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest

from klbr_supervisor.targets.slurm import job_state
from slurm import Cluster
from utils import (
    DEBUGPY_LOADED,
    collect,
    debug_request,
    execute,
    interrupt_keeps_the_namespace,
    start_kernel,
    stream_text,
    until,
    value,
    wait_for_stream,
)

pytestmark = pytest.mark.slurm

JOB = "__import__('os').environ['SLURM_JOB_ID']"


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


SPEC = f"slurm://debug?python={sys.executable}&time=10"


def on_slurm(tmp_path, cluster, *options):
    return start_kernel(extra_arguments=[f"--Supervisor.placement={SPEC}", "--HostService.tcp_ip=127.0.0.1", *options],
                        env={"KLBR_DB": str(tmp_path / "log.sqlite3"), **cluster.environ}, cwd=tmp_path)


def test_cells_run_as_a_job_step_over_curve_with_host_calls_and_interrupts(tmp_path, cluster):
    with on_slurm(tmp_path, cluster) as (km, kc):
        job = value(kc, JOB)
        assert cluster.jobs() == [job]
        assert cluster.job(job)["JobState"] == "RUNNING" and cluster.job(job)["Partition"] == "debug"
        assert value(kc, "__import__('os').getcwd()") == str(tmp_path)
        # over TCP, encrypted, with a key of its own
        info = value(kc, "__import__('json').load(open(get_ipython().kernel.parent.connection_file))")
        assert info["transport"] == "tcp" and info["ip"] == "127.0.0.1" and info["curve_publickey"]
        assert info["key"] != km.session.key.decode()
        # host calls over the host channel's TCP socket
        inspected = value(kc, "from klbr_kernel import host; d = host.inspect(); (d['placement'], d['generation'])")
        assert inspected == (SPEC, 1)
        execute(kc, "host.put('seen', {'where': 'node'})")
        assert value(kc, "host.get('seen')") == {"where": "node"}
        interrupt_keeps_the_namespace(km, kc)
        assert value(kc, JOB) == job
        # the debugger, loaded when first used (decision 72), starts on the node
        assert value(kc, DEBUGPY_LOADED) == []
        assert debug_request(kc)["success"] is True and "pydevd" in value(kc, DEBUGPY_LOADED)
    until(lambda: not cluster.jobs(), 5, "no job left after the shutdown")


def test_a_kernel_that_exits_is_worker_lost_and_the_next_cell_runs_in_a_new_job(tmp_path, cluster):
    with on_slurm(tmp_path, cluster) as (km, kc):
        first = value(kc, JOB)
        reply, _ = execute(kc, "import os; os._exit(3)", timeout=60)
        assert reply["content"]["ename"] == "WorkerLost" and "exited with status 3" in reply["content"]["evalue"]
        second = value(kc, JOB, timeout=60)
        assert second != first
        until(lambda: cluster.jobs() == [second], 5, "the exited kernel's job gone")
    until(lambda: not cluster.jobs(), 5, "no job left after the shutdown")


def test_a_sigkilled_kernel_leaves_no_job(tmp_path, cluster):
    with on_slurm(tmp_path, cluster) as (km, kc):
        job = value(kc, JOB)
        assert cluster.jobs() == [job]
        km.provisioner.process.send_signal(signal.SIGKILL)
        km.provisioner.process.wait()
        until(lambda: not cluster.jobs(), 5, "no job left after the kernel's SIGKILL")


def test_the_scheduler_says_what_ended_a_job_when_srun_did_not(cluster, monkeypatch):
    """srun can end before slurmstepd's "*** ... CANCELLED ..." reaches it ("task 0: Terminated"
    alone); klbr then asks the scheduler (`slurm.job_state`), which keeps an ended job's record."""
    for variable, setting in cluster.environ.items():
        monkeypatch.setenv(variable, setting)
    name = f"klbr-test-state-{os.getpid()}"
    srun = subprocess.Popen([shutil.which("srun") or "srun", f"--job-name={name}", "--ntasks=1", "--quiet", "sleep",
                             "120"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: asyncio.run(job_state("scontrol", name)) or "", 30, "the scheduler has the job")
        cluster.run("scancel", f"--name={name}")
        assert srun.wait(timeout=30) != 0
    finally:
        srun.kill()
        srun.wait()
    assert re.fullmatch(r"job \d+ is CANCELLED", asyncio.run(job_state("scontrol", name, ended=True)) or "")
    assert asyncio.run(job_state("scontrol", "klbr-test-no-such-job", ended=True)) is None


def test_a_job_cancelled_from_outside_is_placement_lost_in_the_schedulers_words(tmp_path, cluster):
    with on_slurm(tmp_path, cluster) as (km, kc):
        job = value(kc, JOB)
        # The agent's directory on the node (its connection file, with the key, beside its sockets)
        agent_dir = os.path.dirname(value(kc, "__import__('ipykernel.connect').connect.get_connection_file()"))
        assert os.path.basename(agent_dir).startswith("klbr-")
        msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(120)")
        wait_for_stream(kc, msg_id)
        cluster.run("scancel", job)
        reply, _ = collect(kc, msg_id, timeout=60)
        content = reply["content"]
        assert content["ename"] == "PlacementLost", content
        assert "CANCELLED" in content["evalue"], content
        # the step's SIGTERM ends the agent, which removes it first (it was left in the node's /tmp)
        until(lambda: not os.path.exists(agent_dir), 30, f"{agent_dir} removed")
        reply, _ = execute(kc, "40 + 2")
        assert reply["content"]["ename"] == "PlacementLost"
        reply, outputs = execute(kc, "%klbr reconnect", timeout=60)
        assert reply["content"]["status"] == "ok", stream_text(outputs)
        assert value(kc, JOB) != job
    rows = sqlite3.connect(tmp_path / "log.sqlite3").execute("SELECT code, status FROM cells ORDER BY id").fetchall()
    assert ("print('running', flush=True)\nimport time\ntime.sleep(120)", "unknown") in rows
