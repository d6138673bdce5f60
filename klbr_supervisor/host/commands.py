"""`host.run`: a command on the supervisor's machine, confined to the workspace and bounded.

`check` refuses what must not run, each refusal a `Refused` with its code (`invalid`, `forbidden`);
a `Run` runs what passed: in a process group of its own, stdin from the call or empty, its
output read as it comes and kept up to `max_output` bytes each, its whole group ended (SIGTERM, then
SIGKILL after `kill_grace`) at the timeout or when it is stopped, and whatever it left in its group
killed when it ends. It never blocks the loop (asyncio subprocesses).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from ..boot.reaper import Reaper

MAX_TIMEOUT = 3600.0
MAX_OUTPUT = 4_000_000  # bytes of stdout (and of stderr) one reply carries at the most
# The command waits at this gate (a shell reading one line of its stdin) until the reaper watches its
# group, then becomes the command: a kernel SIGKILLed in between closes the pipe, and the shell exits
# without running anything. Without it, a command started in that window outlived its kernel.
_GATE = ["/bin/sh", "-c", 'read -r _ || exit 125; exec "$@"', "klbr-host-run"]


class Refused(Exception):  # noqa: N818 — a call's answer with its wire code, which the service sends; no fault
    """Raised as `Refused(code=..., message=...)`: `code` is the wire code the call is answered with
    (`invalid`, `forbidden`, ...), `message` the text its caller reads."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class RunResult(TypedDict):
    """What `host.run` returns to the cell (as JSON)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    stdin: bytes | None
    timeout: float
    max_output: int


def _no_nul(text: str) -> bool:
    return "\0" not in text


def check(args: dict[str, Any], workspace: Path, time_left: float | None) -> Command:
    """The command `args` asks for, or `Refused`. `time_left` bounds the timeout by the cell's deadline."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv:
        raise Refused(code="invalid", message="argv must be a non-empty list of strings")
    if not all(isinstance(a, str) for a in argv) or not all(a and _no_nul(a) for a in argv):
        raise Refused(code="invalid", message="every part of argv must be a non-empty string without NUL")
    env = args.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise Refused(code="invalid", message="env must be a dict of strings")
        for key, value in env.items():
            if not isinstance(key, str) or not key or "=" in key or not _no_nul(key):
                raise Refused(code="invalid",
                              message=f"env key {key!r}: it must be a non-empty string without '=' or NUL")
            if not isinstance(value, str) or not _no_nul(value):
                raise Refused(code="invalid", message=f"env value of {key!r}: it must be a string without NUL")
    cwd = args.get("cwd", ".")
    if not isinstance(cwd, str) or not _no_nul(cwd):
        raise Refused(code="invalid", message="cwd must be a string without NUL")
    if os.path.isabs(cwd):
        raise Refused(code="forbidden", message="cwd must be relative to the workspace")
    root = workspace.resolve()
    where = (root / cwd).resolve()  # symlinks followed; then compared part by part, not as strings
    if not where.is_relative_to(root):
        raise Refused(code="forbidden", message=f"cwd {cwd!r} leads outside the workspace {root}")
    if not where.is_dir():
        raise Refused(code="invalid", message=f"cwd {cwd!r} is not a directory in the workspace")
    timeout = args.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise Refused(code="invalid", message=f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    if time_left is not None:
        timeout = max(0.001, min(timeout, time_left))
    max_output = args.get("max_output", 1_000_000)
    if isinstance(max_output, bool) or not isinstance(max_output, int) or not 0 <= max_output <= MAX_OUTPUT:
        raise Refused(code="invalid", message=f"max_output must be 0 to {MAX_OUTPUT} bytes (what one reply carries)")
    stdin = args.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise Refused(code="invalid", message="stdin must be bytes or a string")
    return Command(argv, where, {**os.environ, **(env or {})},
                   stdin.encode("utf-8", "surrogateescape") if stdin is not None else None, float(timeout), max_output)


class Run:
    """One `host.run` under way, made by the `HostService`, which keeps it until it ends and calls
    `stop` when it must end early (its cell ended, its generation was retired, the kernel shuts down).
    Its process group is watched by the `reaper` while it may hold processes, so a SIGKILLed kernel
    leaves none of it either."""

    def __init__(self, command: Command, kill_grace: float, reaper: Reaper | None):
        self.command = command
        self.kill_grace = kill_grace
        self.pgid: int | None = None
        self._reaper = reaper
        self._stopped: Refused | None = None  # why it was stopped: what its caller is told
        self._clock: asyncio.Timeout | None = None  # its timeout, while it runs to it

    def stop(self, code: str, message: str) -> None:
        """End it now as its timeout would (SIGTERM to its group, SIGKILL after `kill_grace`); its
        call is answered `code`. Called on the loop; a no-op once it is ending."""
        if self._stopped is not None:
            return
        self._stopped = Refused(code, message)
        clock = self._clock
        if clock is not None and not clock.expired():
            clock.reschedule(asyncio.get_running_loop().time())

    def kill(self) -> None:
        """SIGKILL its group at once (`HostService.close`, when nothing can wait any more)."""
        if self.pgid is not None:
            _killpg(self.pgid, signal.SIGKILL)

    async def run(self) -> RunResult:
        """Its result as `host.run` returns it, or `Refused` (it could not start, or was stopped)."""
        command, started = self.command, time.monotonic()
        if self._stopped is not None:  # stopped before it started (its cell ended at once)
            raise self._stopped
        _runnable(command)
        try:
            process = await asyncio.create_subprocess_exec(
                *_GATE, *command.argv, cwd=command.cwd, env=command.env, start_new_session=True,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            raise Refused(code="invalid", message=f"cannot run {command.argv[0]!r}: {e.strerror or e}") from None
        self.pgid = process.pid  # start_new_session: its pid is its group's id
        if self._reaper is not None:
            self._reaper.watch(self.pgid)
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None  # PIPEs
        process.stdin.write(b"\n")  # through the gate: the reaper has its group
        try:
            outputs = await asyncio.gather(_bounded(process.stdout, command.max_output),
                                           _bounded(process.stderr, command.max_output), self._finish(process))
        finally:
            if self._reaper is not None:
                self._reaper.forget(self.pgid)  # `_finish` has killed the group
        if self._stopped is not None:
            raise self._stopped
        (stdout, stdout_cut), (stderr, stderr_cut), timed_out = outputs
        return {
            "exit_code": process.returncode, "stdout": stdout.decode("utf-8", "replace"),
            "stderr": stderr.decode("utf-8", "replace"), "timed_out": timed_out, "stdout_truncated": stdout_cut,
            "stderr_truncated": stderr_cut, "duration": round(time.monotonic() - started, 6),
        }

    async def _finish(self, process: asyncio.subprocess.Process) -> bool:
        """Feed stdin, wait for the end; at the timeout (or a `stop`) the whole group gets SIGTERM,
        then SIGKILL. True when the timeout ended it. The clock runs while stdin is fed too, so a
        command that never reads it cannot hold the call past its timeout."""
        command = self.command
        try:
            async with asyncio.timeout(0 if self._stopped else command.timeout) as self._clock:
                assert process.stdin is not None  # a PIPE: the gate's line, then the call's stdin
                try:
                    if command.stdin:
                        process.stdin.write(command.stdin)
                    await process.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                process.stdin.close()
                await process.wait()
            return False
        except TimeoutError:
            self._clock = None
            _killpg(process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(self.kill_grace):
                    await process.wait()
            except TimeoutError:
                _killpg(process.pid, signal.SIGKILL)
                await process.wait()
            return self._stopped is None
        finally:
            self._clock = None
            # What it left running in its group goes with it: nothing outlives the call, nor holds
            # its pipes (the readers end); and so when the call is cancelled (the task group ends).
            _killpg(process.pid, signal.SIGKILL)


async def _bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """All of `stream` is read (the command never blocks on a full pipe); the first `limit` bytes kept."""
    kept, cut = bytearray(), False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        kept += chunk[:max(0, room)]
        cut = cut or len(chunk) > room
    return bytes(kept), cut


def _runnable(command: Command) -> None:
    """`Refused` when `command.argv[0]` names no executable file (a path from the command's cwd, or a
    name on its PATH), as starting it would have said; behind the gate, its shell would only exit 127."""
    name = command.argv[0]
    if os.sep in name:
        path = command.cwd / name
        if not path.is_file():
            raise Refused(code="invalid", message=f"cannot run {name!r}: No such file or directory")
        if not os.access(path, os.X_OK):
            raise Refused(code="invalid", message=f"cannot run {name!r}: Permission denied")
    elif shutil.which(name, path=command.env.get("PATH", os.defpath)) is None:
        raise Refused(code="invalid", message=f"cannot run {name!r}: No such file or directory")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
