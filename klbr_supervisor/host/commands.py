"""`host.run`: a command on the supervisor's machine, confined to the workspace and bounded.

`check` refuses what must not run, each refusal a `Refused` with its code (`invalid`, `forbidden`);
`run` runs what passed: in a process group of its own, stdin from the call or /dev/null, its output
read as it comes and kept up to `max_output` bytes each, its whole group ended (SIGTERM, then
SIGKILL after `kill_grace`) at the timeout, and whatever it left in its group killed when it ends.
It never blocks the loop (asyncio subprocesses).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MAX_TIMEOUT = 3600.0
MAX_OUTPUT = 4_000_000  # bytes of stdout (and of stderr) one reply carries at the most


class Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


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


def check(args: dict, workspace: Path, time_left: float | None) -> Command:
    """The command `args` asks for, or `Refused`. `time_left` bounds the timeout by the cell's deadline."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv:
        raise Refused("invalid", "argv must be a non-empty list of strings")
    if not all(isinstance(a, str) for a in argv) or not all(a and _no_nul(a) for a in argv):
        raise Refused("invalid", "every part of argv must be a non-empty string without NUL")
    env = args.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise Refused("invalid", "env must be a dict of strings")
        for key, value in env.items():
            if not isinstance(key, str) or not key or "=" in key or not _no_nul(key):
                raise Refused("invalid", f"env key {key!r}: it must be a non-empty string without '=' or NUL")
            if not isinstance(value, str) or not _no_nul(value):
                raise Refused("invalid", f"env value of {key!r}: it must be a string without NUL")
    cwd = args.get("cwd", ".")
    if not isinstance(cwd, str) or not _no_nul(cwd):
        raise Refused("invalid", "cwd must be a string without NUL")
    if os.path.isabs(cwd):
        raise Refused("forbidden", "cwd must be relative to the workspace")
    root = workspace.resolve()
    where = (root / cwd).resolve()  # symlinks followed; then compared part by part, not as strings
    if not where.is_relative_to(root):
        raise Refused("forbidden", f"cwd {cwd!r} leads outside the workspace {root}")
    if not where.is_dir():
        raise Refused("invalid", f"cwd {cwd!r} is not a directory in the workspace")
    timeout = args.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise Refused("invalid", f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    if time_left is not None:
        timeout = max(0.001, min(timeout, time_left))
    max_output = args.get("max_output", 1_000_000)
    if isinstance(max_output, bool) or not isinstance(max_output, int) or not 0 <= max_output <= MAX_OUTPUT:
        raise Refused("invalid", f"max_output must be 0 to {MAX_OUTPUT} bytes (what one reply carries)")
    stdin = args.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise Refused("invalid", "stdin must be bytes or a string")
    return Command(argv, where, {**os.environ, **(env or {})},
                   stdin.encode("utf-8", "surrogateescape") if stdin is not None else None, float(timeout), max_output)


async def run(command: Command, kill_grace: float) -> dict:
    """Run `command`; its result as `host.run` returns it."""
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *command.argv, cwd=command.cwd, env=command.env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE if command.stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise Refused("invalid", f"cannot run {command.argv[0]!r}: {e.strerror or e}") from None
    outputs = await asyncio.gather(_bounded(process.stdout, command.max_output),
                                   _bounded(process.stderr, command.max_output),
                                   _finish(process, command, kill_grace))
    (stdout, stdout_cut), (stderr, stderr_cut), timed_out = outputs
    return {
        "exit_code": process.returncode, "stdout": stdout.decode("utf-8", "replace"),
        "stderr": stderr.decode("utf-8", "replace"), "timed_out": timed_out, "stdout_truncated": stdout_cut,
        "stderr_truncated": stderr_cut, "duration": round(time.monotonic() - started, 6),
    }


async def _bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """All of `stream` is read (the command never blocks on a full pipe); the first `limit` bytes kept."""
    kept, cut = bytearray(), False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        kept += chunk[:max(0, room)]
        cut = cut or len(chunk) > room
    return bytes(kept), cut


async def _finish(process: asyncio.subprocess.Process, command: Command, kill_grace: float) -> bool:
    """Feed stdin, wait for the end; at the timeout the whole group gets SIGTERM, then SIGKILL.
    True when the timeout ended it."""
    if command.stdin is not None:
        try:
            process.stdin.write(command.stdin)
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        process.stdin.close()
    try:
        async with asyncio.timeout(command.timeout):
            await process.wait()
        timed_out = False
    except TimeoutError:
        timed_out = True
        _killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(kill_grace):
                await process.wait()
        except TimeoutError:
            _killpg(process.pid, signal.SIGKILL)
            await process.wait()
    # What it left running in its group goes with it: nothing outlives the call, nor holds its pipes.
    _killpg(process.pid, signal.SIGKILL)
    return timed_out


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
