"""The helper process that runs one generation's provisioner, off the kernel's event loop.

A provisioner other than jupyter_client's local one may block its loop (gateway_provisioners'
shutdown waits on a `Popen` for up to 30 s, its SSH path blocks on paramiko) or run the kernel where
no exit of a local process can be watched. `provisioned.ProvisionedWorker` starts this file as
``python -m klbr_supervisor.targets.provisioner_host REPORT_FD``, one per generation, and speaks JSON lines:

- in, on stdin: ``{"start": {...}}`` first (kernelspec name, the generation's fresh key, env, the
  connection file's path: never on the command line; the user's worker options, which go after the
  kernelspec's argv), then any of ``{"interrupt": 1}``,
  ``{"terminate": 1}``, ``{"kill": 1}``;
- out, on REPORT_FD: ``{"started": INFO, "pid": P, "pgid": G}`` (P and G only when the kernel is a
  process of this machine), or ``{"failed": TEXT}``; later ``{"exited": STATUS}``, only from the
  real exit of such a local process, or ``{"killed": 1}`` when the provisioner's kill returned. A provisioner's `poll()` is never taken for an exit: a remote
  one may report a live kernel dead during a network cut.

Stdin's end means shut down now, as does ``kill``, SIGTERM or the kernel's own exit: the kernel is
killed through its provisioner and its resources cleaned up, each call bounded, and the helper exits.
An alarm bounds the whole of it, so a helper never outlives its kernel process for long.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable
from typing import Any, NotRequired, Protocol, TypedDict

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from ..system import watch

BOUND = 20.0  # seconds a provisioner call gets before the helper goes on without it


class Start(TypedDict):
    """What ``{"start": ...}`` carries (`provisioned.ProvisionedTarget.launch` sends it)."""

    kernel_name: str
    key: str
    signature_scheme: str
    env: dict[str, str]
    username: NotRequired[str]
    connection_file: str
    extra_arguments: NotRequired[list[str]]


class LocalProcess(Protocol):
    """A kernel process on this machine as a provisioner keeps it (a `Popen`)."""

    pid: int

    def wait(self) -> int: ...

    def poll(self) -> int | None: ...


class Host:
    def __init__(self, report_fd: int):
        self._report = os.fdopen(report_fd, "w", buffering=1)
        self._loop = asyncio.get_running_loop()
        self.now = asyncio.Event()  # shut down now
        self._km: AsyncKernelManager | None = None
        self.starting: asyncio.Future[None] | None = None
        self._exited = False

    def say(self, **message: object) -> None:
        try:
            self._report.write(json.dumps(message) + "\n")
        except (OSError, ValueError):
            self.now.set()  # nobody listens: the kernel that started it is gone

    async def start(self, spec: Start) -> None:
        session = Session(key=spec["key"].encode("ascii"), signature_scheme=spec["signature_scheme"],
                          username=spec.get("username") or "klbr")
        self._km = km = AsyncKernelManager(kernel_name=spec["kernel_name"], session=session,
                                           connection_file=spec["connection_file"])
        try:
            await km.start_kernel(env=spec["env"], extra_arguments=spec.get("extra_arguments") or [])
        except Exception as e:
            self.say(failed=f"{type(e).__name__}: {e}")
            self.now.set()
            return
        info = {k: (v.decode("ascii") if isinstance(v, bytes) else v) for k, v in km.get_connection_info().items()}
        process = self._local_process(km)
        pid = process.pid if process is not None else None
        pgid = None
        if pid is not None:
            try:
                pgid = os.getpgid(pid)
            except OSError:
                pass
            if pgid == os.getpgid(0):
                pgid = None  # in our own group: what the kernel's reaper must not take down with it
        self.say(started=info, pid=pid, pgid=pgid)
        if process is not None:
            watch.child_exit(process, lambda: self._kernel_exited(process))

    def _local_process(self, km: AsyncKernelManager) -> LocalProcess | None:
        """The kernel's process on this machine, when its provisioner keeps one (a `Popen`). One that
        has ended before the kernel answered was only its launcher (gateway_provisioners' Docker and
        Kubernetes launchers start a container or a pod and exit): its exit says nothing of the kernel."""
        provisioner = km.provisioner
        for name in ("process", "local_proc"):
            process: LocalProcess | None = getattr(provisioner, name, None)
            if process is not None and hasattr(process, "pid"):
                return process if process.poll() is None else None
        return None

    def _kernel_exited(self, process: LocalProcess) -> None:
        self._exited = True
        self.say(exited=process.wait())
        self.now.set()

    async def command(self, message: dict[str, Any]) -> None:
        """An interrupt or a terminate, run as a task of its own: a call that hangs (a signal sent
        over a cut network) never holds up a kill or stdin's end behind it."""
        km = self._km
        if km is None or km.provisioner is None:
            return
        elif "interrupt" in message:
            await _bounded(km.interrupt_kernel())
        elif "terminate" in message:
            await _bounded(km.provisioner.terminate())

    async def shut_down(self) -> None:
        signal.alarm(int(3 * BOUND))  # whatever blocks below, the helper ends
        # The kernel may have stopped reading what it says (it ended the generation): nothing it
        # or a library prints from here on may fail the shutdown.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.dup2(devnull, 1)
        if self.starting is not None and not self.starting.done():
            self.starting.cancel()  # a launch under way: what it started is killed below
            await asyncio.wait({self.starting}, timeout=BOUND)
        km = self._km
        if km is None or km.provisioner is None:
            return
        if not self._exited and await _bounded(km.provisioner.kill(restart=False)):
            self.say(killed=1)  # the provisioner says it ended its kernel
        await _bounded(km.cleanup_resources())


async def _bounded(awaitable: Awaitable[object]) -> bool:
    """Whether the call returned within BOUND without raising; never raises itself."""
    try:
        async with asyncio.timeout(BOUND):
            await awaitable
        return True
    except Exception as e:
        try:
            sys.stderr.write(f"klbr provisioner helper: {type(e).__name__}: {e}\n")
            sys.stderr.flush()
        except Exception:
            pass
        return False


async def _commands(host: Host, reader: asyncio.StreamReader) -> None:
    started = False
    tasks = set()
    try:
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "start" in message and not started:
                started = True
                host.starting = asyncio.ensure_future(host.start(message["start"]))
            elif "kill" in message:
                return
            else:
                task = asyncio.ensure_future(host.command(message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        host.now.set()


async def main(report_fd: int) -> None:
    host = Host(report_fd)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, host.now.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    commands = asyncio.ensure_future(_commands(host, reader))
    await host.now.wait()
    commands.cancel()
    await host.shut_down()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the kernel's terminal is not for it
    asyncio.run(main(int(sys.argv[1])))
    os._exit(0)  # threads a provisioner left behind do not keep the helper alive
