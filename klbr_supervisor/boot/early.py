"""What `prelaunch.start` started before the proxy's imports, until a target adopts it: the default
worker (`Prelaunched`, adopted by `targets.local`), or the first generation's ssh or ``docker run``
(`EarlySsh`, `EarlyDocker`: the agent's command, adopted by `targets.ssh` and `targets.docker`).
Each says whether the configuration, once read whole, asks for this very start (`matches`); what is
not taken is discarded, and leaves nothing.
"""

from __future__ import annotations

import os
import subprocess

from .groups import end_process

# Imports here are the few the spawn needs (no dataclasses, tempfile, uuid, ctypes): each ms before
# the spawn is a ms on the first cell. Not even typing: mypy reads this name as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol, Self

    from . import docker_launch, ssh_launch
    from .placement import Placement

    class Engines(Protocol):
        """What `EarlyDocker.matches` reads of the engines' configuration (`targets.base.Engines`)."""

        @property
        def docker(self) -> list[str]: ...
        @property
        def docker_options(self) -> list[str]: ...

    class Configured(Protocol):
        """What `Early.matches` reads of the configuration: the `Supervisor` (its settings and its
        parsed placement), which this module may not import."""

        @property
        def worker_kernel(self) -> str: ...
        @property
        def where(self) -> Placement: ...
        @property
        def ipython_history(self) -> bool: ...
        @property
        def memory_limit(self) -> str: ...
        @property
        def worker_args(self) -> tuple[str, ...]: ...
        @property
        def worker_options(self) -> tuple[str, ...]: ...
        @property
        def ssh(self) -> tuple[list[str], list[str]]: ...
        @property
        def link_timeout(self) -> float: ...
        @property
        def engines(self) -> Engines: ...


def leave_nothing(process: subprocess.Popen[bytes] | None, runtime_dir: str) -> None:
    """End a first worker that is not wanted after all, and leave nothing of it."""
    if process is not None:
        end_process(process)
    import shutil  # noqa: PLC0415 — only here: the spawn waits for no import

    try:
        shutil.rmtree(runtime_dir)
    except OSError:
        pass  # gone already (the supervisor removes its runtime directory as it ends)


class Early:
    """What `start` started, until it is handed over: `take` (once, by the target that adopts it),
    or `discard` (once, by whoever finds it is not what is configured, or at exit)."""

    host_channel: dict[str, str] | None = None  # its host channel's endpoint, token and key, if it has one

    def __init__(self, process: subprocess.Popen[bytes], runtime_dir: str, session_id: str):
        self.process = process
        self.runtime_dir = runtime_dir
        self.session_id = session_id  # the proxy's from now on (see `klbr_kernel.frontend.standin`)
        self._held = True  # not yet taken or discarded

    def matches(self, settings: Configured, session_id: str) -> bool:
        """Whether the configuration (config files included) asks for this very start."""
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{type(self).__name__}, pid {self.process.pid}"

    def take(self) -> Self:
        """Handed over to the generation that adopts it: from now on it is that generation's, and
        `discard` leaves it alone."""
        if not self._held:
            msg = "what was started early is taken or discarded already"
            raise RuntimeError(msg)
        self._held = False
        return self

    def discard(self, at_exit: bool = False) -> None:
        """Not wanted after all (another worker is configured, or the kernel will not start): end
        it, leave nothing. Nothing, once it was taken. `at_exit`: called by atexit, where no thread
        may be started to finish it."""
        if self._held:
            self._held = False
            leave_nothing(self.process, self.runtime_dir)


class Prelaunched(Early):
    """The default worker, ipykernel on this interpreter (`targets.local` adopts it)."""

    def __init__(self, process: subprocess.Popen[bytes], runtime_dir: str, connection_file: str, session_id: str,
                 host_channel: dict[str, str], args: list[str]):
        super().__init__(process, runtime_dir, session_id)
        self.args = args  # ipykernel's, after its connection file
        self.connection_file = connection_file
        self.host_channel = host_channel

    def matches(self, settings: Configured, session_id: str) -> bool:
        """The default worker, with the session id the proxy speaks as and the options it read for
        workers."""
        return (not (settings.worker_kernel or settings.where.kind != "local" or settings.ipython_history
                     or settings.memory_limit)  # a limit is set before ipykernel starts
                and self.session_id == session_id
                and self.args == [f"--Session.session={session_id}", *settings.worker_args, *settings.worker_options])


class EarlyAgent(Early):
    """The first generation's command that starts the agent where its kernel runs (ssh, ``docker run``),
    started with the agent's start and a fresh key before the proxy's imports; its target adopts it."""

    def __init__(self, process: subprocess.Popen[bytes], runtime_dir: str, session_id: str):
        import threading  # noqa: PLC0415 — only here: the local prelaunch waits for no import

        super().__init__(process, runtime_dir, session_id)  # its kernel is started with the proxy's
        # Its lease is renewed from here until the generation takes it, as the generation renews
        # it after: a link that stalls meanwhile ends the kernel in `link_timeout`, as always.
        # Writes never block: a stalled command takes none.
        assert process.stdin is not None  # `agent_launch.spawn` gives it a stdin pipe
        self._fd = process.stdin.fileno()
        os.set_blocking(self._fd, False)
        self._stop = threading.Event()
        self._renewing = threading.Thread(target=self._renew, name="klbr-early-lease", daemon=True)
        self._renewing.start()

    def _renew(self) -> None:
        from .agent_launch import LEASE_EVERY  # noqa: PLC0415 — agents only: the local spawn waits for no import

        while not self._stop.wait(LEASE_EVERY):
            try:
                os.write(self._fd, b'{"lease": 1}\n')  # shorter than PIPE_BUF: all or nothing
            except BlockingIOError:
                pass
            except OSError:
                return  # the command has ended: its exit says why

    def _stop_renewing(self) -> None:
        self._stop.set()
        self._renewing.join()

    def take(self) -> Self:
        """Its generation takes its pipes over: renewals are the generation's from now on."""
        taken = super().take()
        self._stop_renewing()
        return taken

    def discard(self, at_exit: bool = False) -> None:
        """The command goes, and with its stdin the agent and its kernel."""
        self._stop_renewing()
        super().discard(at_exit)


# How long a discarded ssh has to end by itself (its agent told by stdin's end) before it is killed.
DISCARD_GRACE = 5.0


class EarlySsh(EarlyAgent):
    """The first generation's ssh (``--Supervisor.placement=ssh://…`` on the command line; `targets.ssh`
    adopts it)."""

    def __init__(self, launch: ssh_launch.Launch, process: subprocess.Popen[bytes], runtime_dir: str,
                 session_id: str):
        import threading  # noqa: PLC0415 — imported already, by `EarlyAgent`

        super().__init__(process, runtime_dir, session_id)
        self.launch = launch  # what it was started with
        self._ending = threading.Lock()  # a discard's end: its thread's, or the proxy's exit
        self._ended = False

    def matches(self, settings: Configured, session_id: str) -> bool:
        launch = self.launch
        return (launch.placement == settings.where and (launch.ssh_command, launch.ssh_options) == settings.ssh
                and launch.link_timeout == settings.link_timeout
                and not settings.memory_limit  # the agent gets it in the start message, already sent
                and launch.args == [f"--Session.session={session_id}", *settings.worker_args,
                                    *settings.worker_options])

    def __str__(self) -> str:
        return f"ssh to {self.launch.placement}, pid {self.process.pid}, its agent's directory {self.launch.remote_dir} there"

    def discard(self, at_exit: bool = False) -> None:
        """Its agent has its start already, and the remote the host channel's socket sshd bound for it,
        which only the agent can remove (sshd leaves it): told by stdin's end, the agent ends its
        kernel and removes both its directory and that socket, and ssh ends with it. Killed after
        `DISCARD_GRACE` (a stalled link): from a thread of its own, or, `at_exit`, here; an exit
        meanwhile kills it at once rather than wait or leave it running."""
        if not self._held:
            return
        self._held = False
        self._stop_renewing()
        assert self.process.stdin is not None  # `agent_launch.spawn` gives it a stdin pipe
        self.process.stdin.close()
        if at_exit:  # threads are joined before atexit's functions run: none may start now
            self._end_after_grace()
            return
        import atexit  # noqa: PLC0415 — rare: an ssh started early and not wanted
        import threading  # noqa: PLC0415 — imported already, by `EarlyAgent`

        atexit.register(self._end)
        threading.Thread(target=self._end_after_grace, name="klbr-early-discard", daemon=True).start()

    def _end_after_grace(self) -> None:
        try:
            self.process.wait(timeout=DISCARD_GRACE)
        except subprocess.TimeoutExpired:
            pass
        self._end()

    def _end(self) -> None:
        """Once, whoever comes first: the grace's end, or the proxy's (which waits for the other)."""
        with self._ending:
            if not self._ended:
                self._ended = True
                leave_nothing(self.process, self.runtime_dir)


class EarlyDocker(EarlyAgent):
    """The first generation's ``docker run`` (``--Supervisor.placement=docker://…`` on the command line;
    `targets.docker` adopts it). A container outlives its ``docker run``: until the reaper is told
    (at adoption), a kernel that dies leaves it to the agent's lease, which the closed stdin ends."""

    def __init__(self, launch: docker_launch.Launch, process: subprocess.Popen[bytes], runtime_dir: str,
                 session_id: str):
        super().__init__(process, runtime_dir, session_id)
        self.launch = launch  # what it was started with

    def matches(self, settings: Configured, session_id: str) -> bool:
        launch, engines = self.launch, settings.engines
        return (launch.placement == settings.where
                and (launch.docker, launch.docker_options) == (engines.docker, engines.docker_options)
                and launch.link_timeout == settings.link_timeout
                and not settings.memory_limit  # the container's limit, on its command line already
                and launch.args == [f"--Session.session={session_id}", *settings.worker_args,
                                    *settings.worker_options])

    def discard(self, at_exit: bool = False) -> None:
        """The container goes too, by name: it outlives its ``docker run``."""
        held = self._held
        super().discard(at_exit)
        if held:
            import shutil  # noqa: PLC0415 — rare: a container started early and not wanted

            try:
                subprocess.run(self.launch.remove, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # noqa: S603 — the configured docker, no shell
                               stderr=subprocess.DEVNULL, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
            shutil.rmtree(self.runtime_dir, ignore_errors=True)  # its mounted directory too
