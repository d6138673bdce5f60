"""`docker://IMAGE` placement against a real Docker engine, and gateway_provisioners' DockerProvisioner
through `kernelspec:` against the same engine.

`make test` installs Debian's docker.io (make engine-deps); this module starts a private dockerd
(no bridge, no iptables, its socket under /tmp: `tests/dockerd.py`), imports the test image (the host's
own Python and a venv with ipykernel, no registry; cached outside the clone), points the kernel at it
with `DOCKER_HOST`, and stops the daemon at the end. Containers run on `--network none`: the kernel's
sockets are files in a mounted directory. gateway_provisioners' containers run on the host network
(`GP_DOCKER_NETWORK=host`, `DOCKER_NETWORK=host`), the kernel on 127.0.0.1: its image adds bash, its
launchers and a uid 1000 to the test image (`dockerd.gateway_image`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockerd import Dockerd, gateway_image, klbr_image
from utils import (
    DEBUGPY_LOADED,
    collect,
    debug_request,
    execute,
    interrupt_keeps_the_namespace,
    processes,
    start_kernel,
    status_row,
    stream_text,
    until,
    value,
    wait_for_stream,
)

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent

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
        interrupt_keeps_the_namespace(km, kc)
        assert value(kc, HOSTNAME) == hostname
        # the debugger, loaded when first used (decision 72), starts in the container
        assert value(kc, DEBUGPY_LOADED) == []
        assert debug_request(kc)["success"] is True and "pydevd" in value(kc, DEBUGPY_LOADED)
    until(lambda: not daemon.containers(), 5, "no container left after the shutdown")


def test_the_first_container_starts_before_the_proxys_imports_and_is_kept(tmp_path, engine):
    """The command line's docker:// starts generation 1's `docker run` first thing (as ssh:// its ssh):
    the container the first cell runs in is that one, not a second start."""
    daemon, image = engine
    log = tmp_path / "kernel.log"
    with start_kernel(extra_arguments=[f"--Supervisor.placement=docker://{image}", "--KlbrKernelApp.log_level=INFO"],
                      env={"KLBR_DB": str(tmp_path / "log.sqlite3"), **daemon.environ}, cwd=tmp_path, log=log) as (km, kc):
        assert value(kc, "__import__('os').path.exists('/.dockerenv')") is True
        assert len(daemon.containers()) == 1
        assert "generation 1 adopts what was started before the imports (EarlyDocker)" in log.read_text()
        assert value(kc, "from klbr_kernel import host; host.inspect()['placement']") == f"docker://{image}"


def test_a_config_file_that_asks_for_another_first_container_is_honoured_and_the_early_one_goes(tmp_path, engine):
    """A config file read after the early `docker run` asks for a memory limit: the early container
    is removed, and the one the cells run in has the limit."""
    daemon, image = engine
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.memory_limit = '300M'\n")
    with start_kernel(extra_arguments=[f"--Supervisor.placement=docker://{image}"], cwd=tmp_path,
                      env={"KLBR_DB": str(tmp_path / "log.sqlite3"), "JUPYTER_CONFIG_DIR": str(tmp_path),
                           **daemon.environ}) as (km, kc):
        assert value(kc, "int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read())") == 300 << 20
        until(lambda: len(daemon.containers()) == 1, 10, "the early container removed")


def test_an_early_container_goes_with_a_kernel_that_dies_before_its_first_generation(tmp_path, engine):
    """A config value the kernel cannot take ends it before any generation adopts the `docker run`
    started for it: that container and the kernel's runtime directory go with it."""
    daemon, image = engine
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.link_timeout = 'soon'\n")
    (tmp_path / "tmp").mkdir()
    conn = tmp_path / "kernel.json"
    conn.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "k"), "shell_port": 1, "iopub_port": 2,
                                "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "secret"}))
    done = subprocess.run([sys.executable, "-m", "klbr_kernel", "-f", str(conn),
                           f"--Supervisor.placement=docker://{image}"], check=False, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, **daemon.environ,
                                                          "JUPYTER_CONFIG_DIR": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")})
    assert done.returncode != 0 and "link_timeout" in done.stderr, done.stderr
    assert not list((tmp_path / "tmp").iterdir())
    until(lambda: not daemon.containers(), 10, "the early container removed")


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


def test_a_sigkilled_docker_run_is_placement_lost_and_its_container_goes(tmp_path, engine):
    """A killed `docker run` leaves its container running: klbr removes it by name."""
    daemon, image = engine
    with on_docker(tmp_path, engine) as (km, kc):
        assert value(kc, "1") == 1
        mount = f"--volume={tmp_path}:{tmp_path}".encode()  # the notebook's directory: this kernel's
        runs = processes(lambda words: words[:2] == [b"docker", b"run"] and mount in words)
        assert len(runs) == 1, runs
        msg_id = kc.execute("print('running', flush=True)\nimport time\ntime.sleep(120)")
        wait_for_stream(kc, msg_id)
        os.kill(runs[0], signal.SIGKILL)
        reply, _ = collect(kc, msg_id, timeout=60)
        assert reply["content"]["ename"] == "PlacementLost" and "docker run" in reply["content"]["evalue"], reply["content"]
        until(lambda: not daemon.containers(), 5, "no container left after its docker run was killed")


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




@pytest.fixture(scope="module")
def gateway_docker(engine, tmp_path_factory) -> Path:
    """gateway_provisioners' own installer, as its docs say: `jupyter-docker-spec install` (root allowed:
    this machine's tests run as root), its provisioner the host-network subclass
    (`tests/provisioners/klbr_docker_host.py`)."""
    daemon, image = engine
    prefix = tmp_path_factory.mktemp("gateway-docker")
    subprocess.run([str(BIN / "jupyter-docker-spec"), "install", f"--prefix={prefix}", "--kernel-name=gp-docker",
                    f"--image-name={gateway_image(daemon, image)}", "--unauthorized-users=nobody"],
                   check=True, capture_output=True)
    spec = prefix / "share" / "jupyter" / "kernels" / "gp-docker" / "kernel.json"
    kernel = json.loads(spec.read_text())
    kernel["metadata"]["kernel_provisioner"]["provisioner_name"] = "klbr-host-docker-provisioner"
    spec.write_text(json.dumps(kernel))
    return prefix / "share" / "jupyter"


def test_gateway_provisioners_docker_provisioner_runs_the_workbench(tmp_path, engine, gateway_docker):
    """Start, a cell in the container, an interrupt, host calls over TCP with CurveZMQ, and a loss:
    a kernel that exits in a container is seen as its link's silence (no exit of a process here)."""
    daemon, image = engine
    env = {"JUPYTER_PATH": os.pathsep.join([str(gateway_docker), os.environ["JUPYTER_PATH"]]),
           # the spec's argv runs `python`: this venv's, which has the launcher's needs (docker's SDK)
           "PATH": os.pathsep.join([str(BIN), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join([str(HERE / "provisioners"), os.environ.get("PYTHONPATH", "")]),
           "GP_DOCKER_NETWORK": "host", "DOCKER_NETWORK": "host", "GP_RESPONSE_IP": "127.0.0.1",
           "KLBR_DB": str(tmp_path / "log.sqlite3"), **daemon.environ}
    with start_kernel(extra_arguments=["--Supervisor.placement=kernelspec:gp-docker", "--HostService.tcp_ip=127.0.0.1",
                                       "--Supervisor.link_timeout=3"], env=env) as (km, kc):
        assert value(kc, "(__import__('os').path.exists('/.dockerenv'), __import__('os').getuid())", timeout=90) == (True, 1000)
        assert len(daemon.docker("ps", "-q").stdout.split()) == 1
        interrupt_keeps_the_namespace(km, kc)
        execute(kc, "from klbr_kernel import host")
        assert value(kc, "host.inspect()['placement']") == "kernelspec:gp-docker"
        execute(kc, "host.put('seen', 'container')")
        assert value(kc, "host.get('seen')") == "container"
        assert value(kc, "__import__('os').environ['KERNEL_KLBR_HOST_ENDPOINT'].startswith('tcp://127.0.0.1:')")
        reply, _ = execute(kc, "import os; os._exit(3)", timeout=60)
        assert reply["content"]["ename"] == "PlacementLost", reply["content"]
        reply, outputs = execute(kc, "%klbr reconnect", timeout=120)
        assert reply["content"]["status"] == "ok", stream_text(outputs)
        assert value(kc, "__import__('os').path.exists('/.dockerenv')") is True
    until(lambda: not daemon.docker("ps", "-q").stdout.split(), 30, "no container left after the shutdown")
