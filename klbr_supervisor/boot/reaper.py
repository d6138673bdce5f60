"""A watchdog process that kills every generation's process group when the proxy is gone.

ipykernel's parent poller is a Python thread, so a worker hung in C code would outlive a SIGKILLed
proxy; PR_SET_PDEATHSIG reaches only the worker itself, not what it started. The reaper holds the read
end of a pipe whose write end lives only in the proxy: when the proxy dies, however it dies, the
read sees EOF and the reaper SIGKILLs the groups it was told about. Started by `Reaper.start` in its own
session (so a killpg of the proxy's group cannot take it down first); stdlib only, for a fast start.

Protocol on stdin, one line each: ``+PGID`` (watch) or ``-PGID`` (forget); ``+["argv", ...]`` or
``-[...]``: a command to run at the end, or not (a container's ``docker rm -f``, a job's ``scancel``:
what an engine runs for a generation does not die with any process of this machine). The one
argument is the proxy's runtime directory (connection files, ipc sockets): removed too, so even a
SIGKILLed proxy leaves nothing in the temp directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    commands: list[list[str]] = []
    for line in sys.stdin.buffer:
        op, what = line[:1], line[1:].strip()
        try:
            watched: int | list[str] = json.loads(what) if what.startswith(b"[") else int(what)
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
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
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
    if len(sys.argv) > 1:
        shutil.rmtree(sys.argv[1], ignore_errors=True)


class Reaper:
    """The proxy's handle on its reaper process. Created once by the `Supervisor`."""

    def __init__(self, process: subprocess.Popen[bytes]):
        self._process = process

    @classmethod
    def start(cls, runtime_dir: str) -> Reaper:
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
        self._write(f"+{json.dumps(argv)}\n")

    def never(self, argv: list[str]) -> None:
        self._write(f"-{json.dumps(argv)}\n")

    def close(self) -> None:
        """Stop the reaper (it kills whatever it still watches) and reap it."""
        if self._process.stdin and not self._process.stdin.closed:
            self._process.stdin.close()
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
