"""A watchdog process that kills every generation's process group when the proxy is gone.

ipykernel's parent poller is a Python thread, so a worker hung in C code would outlive a SIGKILLed
proxy; PR_SET_PDEATHSIG reaches only the worker itself, not what it started. The reaper holds the read
end of a pipe whose write end lives only in the proxy: when the proxy dies, however it dies, the
read sees EOF and the reaper SIGKILLs the groups it was told about. Started by `Reaper.start` in its own
session (so a killpg of the proxy's group cannot take it down first); stdlib only, for a fast start.

Protocol on stdin, one line each: ``+PGID`` (watch) or ``-PGID`` (forget). The one argument is the
proxy's runtime directory (connection files, ipc sockets): removed too, so even a SIGKILLed proxy
leaves nothing in the temp directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        try:
            op, pgid = line[:1], int(line[1:])
        except ValueError:
            continue
        if op == b"+":
            groups.add(pgid)
        elif op == b"-":
            groups.discard(pgid)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
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
