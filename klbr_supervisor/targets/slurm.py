"""``slurm://[PARTITION][?options]``: the workbench as a Slurm job step on a node the scheduler picks.

`Supervisor.srun_command` (default ``srun``) runs with the kernel's environment: ``SLURM_CONF`` and
the user's defaults apply, and inside an allocation (``salloc``, ``SLURM_JOB_ID`` set) each generation
is a step of it. One ``srun`` per generation, its options `Supervisor.slurm_options` then the spec's
(``time=``, ``mem=``, ``gpus=``, ``account=``, ...), ``--job-name`` klbr's for this kernel and
generation. The agent (`boot.agent`) comes over the step's stdin with the generation's fresh key, as
over ssh's.

A node cannot see this machine's ipc sockets: the kernel listens on TCP on the node's address
(``SLURMD_NODENAME``'s, else its host name's), served with CurveZMQ, its keypair fresh per
generation and sent over stdin with the key; the proxy's sockets are CurveZMQ clients of it. Host
calls come back over the host channel's TCP socket, CurveZMQ too (`host_channel` "tcp").

The job ends with its generation (``scancel --name`` of the job, after srun is killed: an srun
killed with its group leaves its job running), and by the kernel's reaper if the kernel dies first.
srun ending with no exit of the kernel reported (``scancel`` from outside, a time limit, a
preemption, a node lost) is a lost link, in the scheduler's words (`PlacementLost`): slurmstepd's
line on srun's stderr, or where srun ended before it came, the job's state (`job_state`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Coroutine
from typing import Any, Unpack

import zmq

from ..boot.agent_launch import CHANNELS, READ_FIRST_LINE, lease_of, spawn
from ..boot.placement import Placement
from ..boot.worker import BOOTSTRAP
from .agent import AgentTarget
from .base import TargetArgs
from .process import WorkerProcess

# Seconds `scontrol` gets to say how a job ended, and between its answers while the job is not over
# yet (`job_state`); the states it shows then.
SCONTROL_TIMEOUT = 5.0
SCONTROL_AGAIN = 0.2
_NOT_OVER = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}

# The spec's options, as srun's own.
SRUN_OPTIONS = {"time": "--time", "mem": "--mem", "gpus": "--gpus", "account": "--account", "qos": "--qos",
                "cpus": "--cpus-per-task", "constraint": "--constraint"}


async def job_state(scontrol: str, job_name: str, *, ended: bool = False) -> str | None:
    """The state of the last job named `job_name`, as `scontrol` shows it (``job 12 is CANCELLED``,
    ``job 12 is TIMEOUT (TimeLimit)``): the scheduler keeps an ended job's record for a few minutes
    (MinJobAge). `ended`: the job is over, so ask again (every `SCONTROL_AGAIN` s, within
    `SCONTROL_TIMEOUT`) while it is still shown running or completing, as it is for a moment after
    its srun ends. None when the scheduler has no such job, or does not answer."""
    found = None
    try:
        async with asyncio.timeout(SCONTROL_TIMEOUT):
            while True:
                found, state = await _last_job(scontrol, job_name)
                if not ended or state not in _NOT_OVER:
                    break
                await asyncio.sleep(SCONTROL_AGAIN)
    except TimeoutError:
        pass  # its last answer stands
    return found


async def _last_job(scontrol: str, job_name: str) -> tuple[str | None, str | None]:
    """One `scontrol show job`: the last job named `job_name` in words, and its state."""
    try:
        process = await asyncio.create_subprocess_exec(scontrol, "--oneliner", "show", "job",
                                                       stdin=asyncio.subprocess.DEVNULL,
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return None, None
    try:
        out, _ = await process.communicate()
    finally:
        if process.returncode is None:  # cancelled by the time limit
            process.kill()
            await asyncio.shield(process.wait())
    found = state = None
    for line in out.decode("utf-8", "replace").splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("JobName") == job_name and "JobState" in fields:
            state, reason = fields["JobState"], fields.get("Reason", "None")
            found = f"job {fields.get('JobId', '?')} is {state}" + (f" ({reason})" if reason != "None" else "")
    return found, state


class SlurmTarget(AgentTarget):
    host_channel = "tcp"  # a node reaches this machine over the network only

    def __init__(self, placement: Placement, **kwargs: Unpack[TargetArgs]):
        super().__init__(placement, **kwargs)
        given = self.given
        self.job_name = f"{os.path.basename(given.runtime_dir)}-{given.number}"
        srun = given.engines.srun
        scancel = os.path.join(os.path.dirname(srun[0]), "scancel")
        self._cancel = [scancel, f"--name={self.job_name}"]
        public, secret = zmq.curve_keypair()
        self._curve = public.decode("ascii"), secret.decode("ascii")
        self._cancelling: WorkerProcess | None = None

    @property
    def command_name(self) -> str:
        return f"srun of {self.job_name}"

    @property
    def where(self) -> str:
        return f"in Slurm job {self.job_name}"

    def said(self, lines: list[str]) -> str:
        """The scheduler's own words, where it gave any (``*** STEP 12.0 ON node CANCELLED AT ...
        DUE TO TIME LIMIT ***``), else srun's last line."""
        scheduler = [line for line in lines if "***" in line]
        return (scheduler or lines or [""])[-1]

    def ask_why(self, said: str) -> Coroutine[Any, Any, str] | None:
        """srun can end before slurmstepd's line of a cancelled, timed-out or preempted job reaches it
        ("task 0: Terminated" alone, seen in test_slurm's cancelled job on this machine):
        then the job's state, as the scheduler has it, follows srun's words. Not for a job klbr
        cancelled itself."""
        if "***" in said or self._cancelling is not None:
            return None
        return self._with_state(said)

    async def _with_state(self, said: str) -> str:
        scontrol = os.path.join(os.path.dirname(self.given.engines.srun[0]), "scontrol")
        state = await job_state(scontrol, self.job_name, ended=True)
        if state is None:
            return said
        return f"{said}; the scheduler says {state}" if said else f"the scheduler says {state}"

    @property
    def local(self) -> str:
        return ""  # over TCP

    def environment(self, host: dict[str, str]) -> dict[str, str]:
        """The host channel's credentials, its TCP endpoint and CurveZMQ key (`base.Given.host_tcp`);
        without one, why not."""
        if self.given.host_tcp is None:
            return {"KLBR_HOST_UNAVAILABLE": f"{self.placement} has no host channel: no TCP one was offered"}
        try:
            endpoint, server_key = self.given.host_tcp()
        except (OSError, zmq.ZMQError) as e:
            return {"KLBR_HOST_UNAVAILABLE": f"{self.placement} has no host channel: it could not listen on TCP ({e})"}
        return {**host, "KLBR_HOST_ENDPOINT": endpoint, "KLBR_HOST_SERVERKEY": server_key}

    def argv(self) -> list[str]:
        placement, engines = self.placement, self.given.engines
        words = [*engines.srun, f"--job-name={self.job_name}", "--ntasks=1", "--quiet"]
        if placement.target:
            words.append(f"--partition={placement.target}")
        words += [*engines.slurm_options]
        words += [f"{SRUN_OPTIONS[name]}={value}" for name, value in placement.options if name in SRUN_OPTIONS]
        return [*words, placement.option("python", "python3"), "-c", READ_FIRST_LINE]

    def spawn(self, extra_arguments: list[str], host: dict[str, str]) -> subprocess.Popen[bytes]:
        public, secret = self._curve
        start: dict[str, object] = {
            "dir": f"/tmp/klbr-{os.urandom(8).hex()}",  # noqa: S108 — on the node: the agent makes it, 0700, or fails
            "memory_limit": self.memory_limit, "key": self.key, "signature_scheme": self.session.signature_scheme,
            "bootstrap": BOOTSTRAP, "args": extra_arguments, "channels": CHANNELS,
            "lease": lease_of(self.given.link_timeout), "cwd": os.getcwd(),
            "transport": "tcp", "ip": "", "curve_publickey": public, "curve_secretkey": secret}
        if "KLBR_HOST_ENDPOINT" in host:
            start.update({"host": host, "client": dict(self.given.client)})
        self.given.reaper.at_end(self._cancel)  # srun killed with its group leaves its job running
        return spawn(self.argv(), lambda: start)

    def connection(self, started: dict[str, Any]) -> dict[str, Any]:
        ports = started["ports"]
        return {"transport": "tcp", "ip": started["ip"], "key": self.key,
                "signature_scheme": self.session.signature_scheme, "curve_publickey": self._curve[0],
                **{f"{name}_port": ports[name] for name in CHANNELS}}

    def close(self) -> None:
        """The generation has ended: srun goes, and its job by name, whatever srun did."""
        super().close()
        if self._cancelling is None:
            try:
                process = subprocess.Popen(self._cancel, stdin=subprocess.DEVNULL,  # noqa: S603 — the configured srun's scancel, no shell
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                return  # the reaper tries again when the kernel ends
            self._cancelling = WorkerProcess(process, None, self.given.reaper,
                                             lambda status: self.given.reaper.never(self._cancel))
