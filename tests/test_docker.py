"""`docker://IMAGE` placement against a real Docker engine.

`make test` installs Debian's docker.io (make engine-deps); this module starts a private dockerd
(no bridge, no iptables, its socket under /tmp: `tests/dockerd.py`), imports the test image (the host's
own Python and a venv with ipykernel, no registry; cached outside the clone), points the kernel at it
with `DOCKER_HOST`, and stops the daemon at the end. Containers run on `--network none`: the kernel's
sockets are files in a mounted directory.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from dockerd import Dockerd, klbr_image
from utils import collect, execute, start_kernel, status_row, stream_text, until, value, wait_for_stream

pytestmark = pytest.mark.docker

HOSTNAME = "__import__('socket').gethostname()"


@pytest.fixture(scope="module")
def engine():
    daemon = Dockerd()
    try:
        yield daemon, klbr_image(daemon)
    finally:
        daemon.stop()


def on_docker(tmp_path, engine, *options, query: str = ""):
    daemon, image = engine
    return start_kernel(extra_arguments=[f"--Supervisor.placement=docker://{image}{query}", *options],
                        env={"KLBR_DB": str(tmp_path / "log.sqlite3"), **daemon.environ}, cwd=tmp_path)


def test_cells_run_in_a_container_with_host_calls_and_interrupts(tmp_path, engine):
    daemon, image = engine
    (tmp_path / "data.txt").write_text("from the notebook's directory")
    with on_docker(tmp_path, engine) as (km, kc):
        assert value(kc, "__import__('os').path.exists('/.dockerenv')") is True
        hostname = value(kc, HOSTNAME)
        assert hostname != os.uname().nodename
        # the notebook's directory is the kernel's, mounted
        assert value(kc, "open('data.txt').read()") == "from the notebook's directory"
        assert value(kc, "__import__('os').getcwd()") == str(tmp_path)
        containers = daemon.containers()
        assert len(containers) == 1 and containers[0].startswith(hostname)
        # its own key: the frontend's is nowhere in the container
        key = value(kc, "get_ipython().kernel.session.key")
        assert key and key != km.session.key
        # host calls over the mounted socket
        inspected = value(kc, "from klbr_kernel import host; d = host.inspect(); (d['placement'], d['identity']['hostname'])")
        assert inspected == (f"docker://{image}", hostname)
        execute(kc, "host.put('seen', {'where': 'container'})")
        assert value(kc, "host.get('seen')") == {"where": "container"}
        # an interrupt keeps the namespace
        execute(kc, "kept = 41")
        msg_id = kc.execute("print('asleep', flush=True); import time; time.sleep(60)")
        wait_for_stream(kc, msg_id)
        km.interrupt_kernel()
        assert collect(kc, msg_id)[0]["content"]["ename"] == "KeyboardInterrupt"
        assert value(kc, "kept + 1") == 42
        assert value(kc, HOSTNAME) == hostname
    until(lambda: not daemon.containers(), 5, "no container left after the shutdown")


def test_a_kernel_that_exits_is_worker_lost_and_the_next_cell_runs_in_a_new_container(tmp_path, engine):
    daemon, image = engine
    with on_docker(tmp_path, engine) as (km, kc):
        first = value(kc, HOSTNAME)
        reply, _ = execute(kc, "import os; os._exit(3)", timeout=60)
        assert reply["content"]["ename"] == "WorkerLost" and "exited with status 3" in reply["content"]["evalue"]
        second = value(kc, HOSTNAME, timeout=60)
        assert second != first
        until(lambda: len(daemon.containers()) == 1, 5, "the exited kernel's container gone")


def test_a_container_past_its_memory_limit_is_worker_lost_naming_memory(tmp_path, engine):
    with on_docker(tmp_path, engine, "--Supervisor.memory_limit=256M") as (km, kc):
        execute(kc, "x = 41")
        assert value(kc, "int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read())") == 256 << 20
        reply, _ = execute(kc, "big = bytearray(1 << 30)", timeout=60)
        content = reply["content"]
        assert content["ename"] == "WorkerLost", content
        assert "out of memory (the system killed it at its memory limit of 256 MiB" in content["evalue"], content
        assert value(kc, "1 + 1", timeout=60) == 2
        assert status_row(kc, "generation").startswith("2")


def test_a_sigkilled_kernel_leaves_no_container(tmp_path, engine):
    daemon, image = engine
    with on_docker(tmp_path, engine) as (km, kc):
        assert value(kc, "1") == 1
        assert len(daemon.containers()) == 1
        km.provisioner.process.send_signal(signal.SIGKILL)
        km.provisioner.process.wait()
        began = time.monotonic()
        until(lambda: not daemon.containers(), 5, "no container left after the kernel's SIGKILL")
        print(f"container gone {time.monotonic() - began:.2f} s after the kernel's SIGKILL")


def test_a_daemon_that_stops_answering_is_placement_lost(tmp_path, engine):
    daemon, image = engine
    with on_docker(tmp_path, engine, "--Supervisor.link_timeout=3") as (km, kc):
        execute(kc, "kept = 1")
        msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(120)")
        wait_for_stream(kc, msg_id)
        daemon.pause()
        try:
            reply, _ = collect(kc, msg_id, timeout=60)
            assert reply["content"]["ename"] == "PlacementLost", reply["content"]
            reply, _ = execute(kc, "40 + 2")
            assert reply["content"]["ename"] == "PlacementLost" and "%klbr reconnect" in reply["content"]["evalue"]
        finally:
            daemon.resume()
        reply, outputs = execute(kc, "%klbr reconnect", timeout=60)
        assert reply["content"]["status"] == "ok", stream_text(outputs)
        assert value(kc, "40 + 2") == 42
    rows = sqlite3.connect(tmp_path / "log.sqlite3").execute("SELECT code, status FROM cells ORDER BY id").fetchall()
    assert ("print('running', flush=True)\nimport time\ntime.sleep(120)", "unknown") in rows
    until(lambda: not daemon.containers(), 5, "no container left after the shutdown")


def test_an_image_the_engine_lacks_is_refused_before_the_session_moves(tmp_path, engine):
    with on_docker(tmp_path, engine) as (km, kc):
        hostname = value(kc, HOSTNAME)
        reply, outputs = execute(kc, "%klbr placement docker://klbr-missing:1", timeout=60)
        assert reply["content"]["status"] == "error"
        assert "has no image klbr-missing:1" in reply["content"]["evalue"], reply["content"]
        assert value(kc, HOSTNAME) == hostname


