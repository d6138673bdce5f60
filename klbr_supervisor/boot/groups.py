"""A process started in a session of its own, ended with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess


def end_process(process: subprocess.Popen[bytes]) -> None:
    """Kill `process` (started with ``start_new_session=True``) and its group; reap it, close its pipes."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe:
            pipe.close()
