"""A one-node Slurm cluster on 127.0.0.1 for `slurm://` tests and benchmarks.

munged (a throwaway key, its socket in a short directory of its own), slurmctld and slurmd, started
with ``-F``/``-D`` as children of the run and stopped by pid: every job cancelled first (an srun
whose slurmctld is gone waits forever), then SIGTERM to each. Ports chosen free at start; everything
binds 127.0.0.1 (``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``), srun's own ports stay in a
range outside the ephemeral one the kernels' come from (``SrunPortRange``). No cgroups: process
tracking by /proc. Every Slurm command gets ``SLURM_CONF`` (`environ`): without it Slurm looks its
configuration up with a DNS query.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

SLURMCTLD = Path("/usr/sbin/slurmctld")
SLURMD = Path("/usr/sbin/slurmd")
MUNGED = Path("/usr/sbin/munged")
MUNGEKEY = Path("/usr/sbin/mungekey")
SRUN_PORTS = "61000-61999"  # above the kernel's ephemeral range (32768-60999 here): srun never takes a kernel's


def _free_ports(count: int) -> list[int]:
    held = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


def _started(process: subprocess.Popen[str], said: str, name: str) -> None:
    """Read `process`'s log until a line holds `said`; then read on in a thread (a full pipe blocks it)."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if said in line:
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return
    raise RuntimeError(f"{name} did not start: " + "".join(lines[-20:]))


class Cluster:
    def __init__(self) -> None:
        for path in (SLURMCTLD, SLURMD, MUNGED, MUNGEKEY):
            assert path.exists(), f"{path} is missing: `make test` installs slurm-wlm and munge (make engine-deps)"
        self.where = Path(tempfile.mkdtemp(prefix="ks", dir="/tmp"))
        self.where.chmod(0o755)  # munged wants its directories 0755, owned by root
        self.processes: list[subprocess.Popen[str]] = []
        self.conf = self.where / "slurm.conf"
        self.environ = {"SLURM_CONF": str(self.conf)}
        try:
            self._munge()
            self._configure()
            for daemon, args, said in ((SLURMCTLD, ["-D", "-vv"], "Running as primary controller"),
                                       (SLURMD, ["-D", "-vv", "-N", "localhost"], "slurmd started")):
                process = subprocess.Popen([str(daemon), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True, env={**os.environ, **self.environ})
                self.processes.append(process)
                _started(process, said, daemon.name)
            # The node registers on its own a moment later: wait for the scheduler to run a job.
            self.run("srun", "--immediate=60", "--quiet", "true", timeout=90)
        except BaseException:
            self.stop()
            raise

    def _munge(self) -> None:
        munge = self.where / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        subprocess.run([str(MUNGEKEY), "-c", "-k", str(key), "-b", "1024"], check=True)
        self.socket = munge / "s"
        process = subprocess.Popen(
            [str(MUNGED), "-F", "--force", "--key-file", str(key), "--socket", str(self.socket), "--pid-file",
             str(munge / "pid"), "--log-file", str(munge / "log"), "--seed-file", str(munge / "seed"),
             "--origin=127.0.0.1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        self.processes.append(process)
        _started(process, "Starting", "munged")

    def _configure(self) -> None:
        ctld, slurmd = _free_ports(2)
        memory = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")).split()[1]) // 1024 - 1024
        cpus = os.cpu_count() or 1
        for name in ("state", "spool"):
            (self.where / name).mkdir()
        self.conf.write_text("\n".join([
            "ClusterName=klbr", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
            f"SrunPortRange={SRUN_PORTS}", "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory", f"DefMemPerCPU={memory // cpus // 4}", "SlurmUser=root",
            "SlurmdUser=root", f"StateSaveLocation={self.where / 'state'}", f"SlurmdSpoolDir={self.where / 'spool'}",
            f"SlurmctldPidFile={self.where / 'slurmctld.pid'}", f"SlurmdPidFile={self.where / 'slurmd.pid'}",
            "MpiDefault=none", "ReturnToService=2", "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/backfill",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN",
            # several kernels at once (a benchmark runs three side by side): jobs share the cores
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8", ""]))

    def run(self, command: str, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run([command, *args], env={**os.environ, **self.environ}, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def jobs(self) -> list[str]:
        """The ids of the jobs that are not over (pending, running, completing)."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def stop(self) -> None:
        if len(self.processes) == 3:  # the controller answers: cancel what runs, or its srun hangs
            self.run("scancel", "--full", "--partition=debug", check=False)
            self.run("scancel", "--partition=debug", check=False)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        subprocess.run(["rm", "-rf", str(self.where)], check=False)  # noqa: S607
