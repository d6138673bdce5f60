"""A kernelspec whose provisioner is not jupyter_client's local one, run through a helper process.

For ``kernelspec:NAME``, or ``local`` with `Supervisor.worker_kernel`, when the kernelspec names
another provisioner (gateway_provisioners' Kubernetes, Docker, YARN, SSH). The provisioner runs in
`provisioner_host`, one helper process per generation, so nothing it does blocks the kernel's loop.
This side is the generation's target:

- `launch` sends the start (the fresh key travels on the pipe, never in argv) and returns the
  connection info the provisioner reports, whose key may be one its launcher chose;
- `interrupt` and `signal` are lines to the helper; SIGKILL also arms `LET_GO`, after which the
  kernel's local process group, if it reported one, is SIGKILLed here and the helper let go;
- the end: an exit status the helper read off a local kernel process, or, when the helper ends
  with none reported, None: the generation takes that as a lost link (its outcome unknown).

The helper is not the reaper's: when the kernel dies it sees stdin's end and kills the kernel
through its provisioner (a pod, a remote process), within its own alarm. A local kernel process
it reports is the reaper's, as every local worker is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Unpack

import zmq

from ..boot.placement import Placement
from ..exits import describe_exit
from .base import NO_ENGINES, Engines, GenerationArgs, LaunchError, OnExit, SshCommand, Target
from .kernelspec import KernelspecTarget
from .managed import installed_spec
from .pipes import LinePipe
from .process import WorkerProcess

FORWARDED = "KERNEL_"  # the prefix of what gateway_provisioners forward to a kernel's environment
PROVISIONER_PREFIXES = ("GP_", "DOCKER_")  # what configures a provisioner and its engine's client
if TYPE_CHECKING:
    from .provisioner_host import Start

# Seconds the generation waits for the helper to end its kernel (a kill asked for); after that it
# lets go: the helper goes on with the kill on its own (bounded by its alarm), and the end is
# reported unconfirmed, which the generation takes as a lost link, never replaced automatically.
LET_GO = 3.0


class ProvisionedTarget(Target):
    remote = True  # its kernel may run where only its sockets reach
    host_channel = "tcp"  # so may its host calls: see `environment`

    def __init__(self, placement: Placement, *, worker_kernel: str = "", **kwargs: Unpack[GenerationArgs]):
        super().__init__(placement, **kwargs)
        self.kernel_name = placement.target if placement.kind == "kernelspec" else worker_kernel
        self._connection_file = os.path.join(self.given.runtime_dir, f"worker-{self.given.number}.json")
        self._reaper = self.given.reaper
        self._on_exit: OnExit = lambda status: None
        self._log = self.given.log
        self._loop = asyncio.get_running_loop()
        self._helper: WorkerProcess | None = None
        self._pipe: LinePipe | None = None  # commands to its stdin, reports from its report pipe
        self._started: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pgid: int | None = None  # the kernel's local process group, if it has one
        self._kill_timer: asyncio.TimerHandle | None = None
        self._reported = False
        self._pid: int | None = None  # the kernel's local process, if it has one

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        if placement.kind == "kernelspec":
            await KernelspecTarget.check(placement, ssh, engines)

    @property
    def pid(self) -> int | None:
        return self._pid

    def environ(self) -> dict[str, str]:
        """The minimal environment, and what configures the provisioner itself: gateway_provisioners
        reads its options from ``GP_*`` variables, Docker's client its engine from ``DOCKER_*``, a
        Kubernetes client its cluster from ``KUBECONFIG``."""
        return {**super().environ(), **{name: value for name, value in os.environ.items()
                                        if name.startswith(PROVISIONER_PREFIXES) or name == "KUBECONFIG"}}

    def environment(self, host: dict[str, str]) -> dict[str, str]:
        """Its host channel on TCP with CurveZMQ, where a kernel its provisioner runs elsewhere may
        reach it: the credentials and the server's key named KERNEL_*, which gateway_provisioners
        forward to the kernel (the client reads either name); nothing secret in any argv."""
        env = self.environ()
        try:
            if self.given.host_tcp is None:
                msg = "no TCP host channel was offered"
                raise OSError(msg)
            endpoint, server_key = self.given.host_tcp()
        except (OSError, zmq.ZMQError) as e:
            why = f"{self.placement.spec} has no host channel: it could not listen on TCP ({e})"
            return {**env, f"{FORWARDED}KLBR_HOST_UNAVAILABLE": why}
        channel = {**host, "KLBR_HOST_ENDPOINT": endpoint, "KLBR_HOST_SERVERKEY": server_key}
        return {**env, **{f"{FORWARDED}{name}": value for name, value in channel.items()}}

    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        self._on_exit = on_exit
        reports, write_end = os.pipe()
        try:
            process = subprocess.Popen(  # noqa: S603 — this interpreter and klbr's provisioner_host, no shell
                [sys.executable, "-m", "klbr_supervisor.targets.provisioner_host", str(write_end)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                pass_fds=(write_end,), start_new_session=True)
        except OSError as e:
            os.close(reports)
            message = f"its provisioner's helper could not be started: {e}"
            raise LaunchError(message) from e
        finally:
            os.close(write_end)
        assert process.stdin is not None  # opened as a pipe just above
        self._pipe = LinePipe(reports, os.dup(process.stdin.fileno()), self._report)
        process.stdin.close()
        self._helper = WorkerProcess(process, None, self._reaper, self._helper_exited)
        start: Start = {"kernel_name": self.kernel_name, "key": self.session.key.decode("ascii"),
                        "signature_scheme": self.session.signature_scheme, "env": env,
                        "username": self.session.username, "connection_file": self._connection_file,
                        "extra_arguments": list(extra_arguments)}
        self._send(start=start)
        return await asyncio.shield(self._started)

    @property
    def interrupts_by_message(self) -> bool:
        """Its helper's manager sends a message-mode interrupt on a control socket of its own."""
        spec = installed_spec(self.kernel_name)
        return spec is not None and spec.interrupt_mode == "message"

    async def interrupt(self) -> None:
        self._send(interrupt=1)

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self._send(kill=1)
            if self._kill_timer is None and self._helper is not None:
                self._kill_timer = self._loop.call_later(LET_GO, self._let_go)
        else:
            self._send(terminate=1)

    def keep(self, data: bytes) -> None:
        if self._helper is not None and self._helper.stderr is not None:
            self._helper.stderr.keep(data)

    def tail(self) -> str:
        return self._helper.tail() if self._helper is not None else ""

    async def release(self) -> None:
        """The helper cleans up after its provisioner itself."""

    def close(self) -> None:
        """The generation has ended: the helper is told to finish (if it has not), and a local
        kernel process group goes now, as any local worker's does."""
        if self._kill_timer is not None:
            self._kill_timer.cancel()
            self._kill_timer = None
        if self._pipe is not None:
            self._pipe.close()  # the helper reads its stdin's end: it finishes
        if self._pgid is not None:
            _killpg(self._pgid)
            self._reaper.forget(self._pgid)
            self._pgid = None
        # Its stderr is read on until it ends (StderrTail closes at EOF): a closed pipe would fail
        # what the helper still has to say while it shuts its kernel down.

    # -- internals ---------------------------------------------------------------------------------

    def _send(self, **message: object) -> None:
        if self._pipe is not None:
            self._pipe.send(False, **message)

    def _report(self, message: dict[str, Any]) -> None:
        if "started" in message and not self._started.done():
            self._pid = message.get("pid")
            self._pgid = message.get("pgid")
            if self._pgid:
                self._reaper.watch(self._pgid)
            self._started.set_result(message["started"])
        elif "failed" in message and not self._started.done():
            self._started.set_exception(LaunchError(str(message["failed"])))
        elif "exited" in message and self._started.done() and not self._started.exception():
            self._end(message["exited"])
        elif "killed" in message:
            self.confirmed = True

    def _helper_exited(self, returncode: int) -> None:
        if self._pipe is not None:
            self._pipe.read_now()  # what it reported before it ended comes first
        if not self._started.done():
            tail = self._helper.tail().strip().splitlines()[-1:] if self._helper is not None else []
            self._started.set_exception(LaunchError(
                f"its provisioner's helper {describe_exit(returncode)}" + (f": {tail[0]}" if tail else "")))
            return
        self.lost_how = (f"the helper running its provisioner {describe_exit(returncode)} and reported no exit"
                         if not self.confirmed else "ended by its provisioner (no exit status reported)")
        self._end(None)

    def _end(self, status: int | None) -> None:
        if not self._reported and self._started.exception() is None:
            self._reported = True
            self._on_exit(status)

    def _let_go(self) -> None:
        self._kill_timer = None
        self._log.warning("the provisioner helper of %s did not end its kernel within %.0f s: let go (it goes "
                          "on with the kill on its own)", self.kernel_name, LET_GO)
        if self._pgid is not None:
            _killpg(self._pgid)
        if self._pipe is not None:
            self._pipe.read_now()
        self.lost_how = f"its provisioner did not confirm the kill within {LET_GO:.0f} s"
        self._end(None)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
