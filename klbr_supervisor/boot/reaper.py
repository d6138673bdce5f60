"""A watchdog process that kills every generation's process group when the proxy is gone.

ipykernel's parent poller is a Python thread, so a worker hung in C code would outlive a SIGKILLed
proxy; PR_SET_PDEATHSIG reaches only the worker itself, not what it started. The reaper holds the read
end of a pipe whose write end lives only in the proxy: when the proxy dies, however it dies, the
read sees EOF and the reaper SIGKILLs the groups it was told about. Started by `Reaper.start` in its own
session (so a killpg of the proxy's group cannot take it down first); stdlib only, for a fast start.
While it waits it holds no more than an interpreter without site and `os`: what it needs only at the
end (json for a command, subprocess, shutil) is imported then, and the signal dispositions are set
through `_signal` (the `signal` module's enums cost ~1 MiB): 3.2 MiB of PSS instead of 5.9, in every
kernel (docs/decisions/64-small-reaper.md).

Protocol on stdin, one line each: ``+PGID`` (watch) or ``-PGID`` (forget); ``+["argv", ...]`` or
``-[...]``: a command to run at the end, or not (a container's ``docker rm -f``, a job's ``scancel``:
what an engine runs for a generation does not die with any process of this machine). The one
argument is the proxy's runtime directory (connection files, ipc sockets): removed too, so even a
SIGKILLed proxy leaves nothing in the temp directory.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module under `signal`, without its enums
import os
import sys

TYPE_CHECKING = False  # as typing's (mypy reads it so), without importing typing here
if TYPE_CHECKING:
    import subprocess


def main() -> None:
    for sig in (_signal.SIGINT, _signal.SIGHUP, _signal.SIGTERM):
        _signal.signal(sig, _signal.SIG_IGN)
    groups: set[int] = set()
    commands: list[list[str]] = []
    for line in sys.stdin.buffer:
        op, what = line[:1], line[1:].strip()
        try:
            watched: int | list[str] = _argv(what) if what.startswith(b"[") else int(what)
        except ValueError:
            continue
        if isinstance(watched, int):
            (groups.add if op == b"+" else groups.discard)(watched)
        elif op == b"+":
            commands.append(watched)
        elif watched in commands:
            commands.remove(watched)
    for pgid in groups:
        try:
            os.killpg(pgid, _signal.SIGKILL)
        except OSError:
            pass
    if commands:
        _run(commands)
    if len(sys.argv) > 1:
        import shutil  # noqa: PLC0415 — at the end only (see the module's docstring)

        shutil.rmtree(sys.argv[1], ignore_errors=True)


def _argv(line: bytes) -> list[str]:
    import json  # noqa: PLC0415 — only a kernel with an engine's command sends one

    argv: list[str] = json.loads(line)
    return argv


def _line(argv: list[str]) -> str:
    import json  # noqa: PLC0415 — the kernel's side of `_argv`

    return json.dumps(argv)


def _run(commands: list[list[str]]) -> None:
    """Each command at the end, at once, waited for up to 30 s each."""
    import subprocess  # noqa: PLC0415 — at the end only

    running = []
    for argv in commands:
        try:
            running.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # noqa: S603 — the argv its kernel gave
                                            stderr=subprocess.DEVNULL, start_new_session=True))
        except OSError:
            pass
    for process in running:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


class Reaper:
    """The proxy's handle on its reaper process. Created once by the `Supervisor`."""

    def __init__(self, process: subprocess.Popen[bytes]):
        self._process = process

    @classmethod
    def start(cls, runtime_dir: str) -> Reaper:
        import subprocess  # noqa: PLC0415 — the module runs as the reaper too, which needs it only at the end

        process = subprocess.Popen(  # noqa: S603 — this interpreter and this file, no shell
            # As a script, without site: it starts while the first worker does, and should cost it
            # as little CPU as it can (a few ms instead of an interpreter with site-packages).
            [sys.executable, "-I", "-S", os.path.abspath(__file__), runtime_dir],
            stdin=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        return cls(process)

    def watch(self, pgid: int) -> None:
        self._write(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._write(f"-{pgid}\n")

    def at_end(self, argv: list[str]) -> None:
        """Run `argv` when the kernel is gone, however it died (unless `never` comes first)."""
        self._write(f"+{_line(argv)}\n")

    def never(self, argv: list[str]) -> None:
        self._write(f"-{_line(argv)}\n")

    def close(self) -> None:
        """Stop the reaper (it kills whatever it still watches) and reap it."""
        if self._process.stdin and not self._process.stdin.closed:
            self._process.stdin.close()
        import subprocess  # noqa: PLC0415 — see `start`

        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _write(self, line: str) -> None:
        stdin = self._process.stdin
        assert stdin is not None  # `start` opened it
        try:
            stdin.write(line.encode())
            stdin.flush()
        except (OSError, ValueError):
            pass  # the reaper is gone; PDEATHSIG still covers each worker itself


if __name__ == "__main__":
    main()
