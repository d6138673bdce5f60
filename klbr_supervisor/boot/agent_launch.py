"""What starts an agent (`agent`) where a generation's kernel runs: the command it runs there, and
what goes first on its stdin (the agent's source, then its start message with the generation's key).

Standard library only: `ssh_launch` starts the first generation's ssh before the proxy's imports.
The ``ssh://``, ``docker://`` and ``slurm://`` targets each build the command that reaches the place
(ssh, ``docker run -i``, ``srun``), and start the agent through it with `spawn`.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import zlib
from collections.abc import Callable

from .groups import end_process

with open(os.path.join(os.path.dirname(__file__), "agent.py")) as _f:
    AGENT = _f.read()
# What the interpreter there runs: the agent comes as the first line of its stdin.
READ_FIRST_LINE = "import sys;exec(sys.stdin.readline())"
# The ports the agent writes into an ipc connection file: its sockets are ``k-{port}``.
CHANNELS = {"shell": 1, "iopub": 2, "stdin": 3, "control": 4, "hb": 5}
LINK_TIMEOUT = 15.0  # `Supervisor.link_timeout`'s default
LEASE_EVERY = 1.0  # seconds between lease renewals
# What a pipe takes before a write waits for its reader: Linux's default, macOS's for a large write.
PIPE_CAPACITY = 65536
HOST_ENDPOINT = "KLBR_HOST_ENDPOINT"


def first_line(script: str) -> str:
    """The first line of stdin, which `READ_FIRST_LINE` runs: `script`, whole."""
    return f"exec(compile({script!r}, 'klbr', 'exec'))\n"


def start_line(start: dict[str, object]) -> str:
    """The agent's start message as the line after its source: compressed (the worker's bootstrap
    and the host client's files are ~65 KB of text, ~20 KB so), so that both lines go into an
    empty pipe at once: the command (ssh, srun, ``docker run``) reads its stdin only once it is
    connected, and a write that waited for that would hold the proxy's loop."""
    packed = base64.b64encode(zlib.compress(json.dumps(start).encode(), 9)).decode()
    return json.dumps({"start_z": packed}) + "\n"


def lease_of(link_timeout: float) -> float:
    """How long the agent keeps its kernel without a renewal: `link_timeout` (0: no limit)."""
    return link_timeout if link_timeout > 0 else 3600.0


def spawn(argv: list[str], start: Callable[[], dict[str, object]], env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """Run `argv` (whose interpreter runs `READ_FIRST_LINE`) in a session of its own (what it starts
    goes with it), and give the agent it starts its source and `start()`, made while it starts;
    raises OSError when `argv` cannot be run."""
    process = subprocess.Popen(  # noqa: S603 — a configured command, no shell
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(os.environ) if env is None else env, start_new_session=True)
    try:
        first = memoryview((first_line(AGENT) + start_line(start())).encode())
        assert process.stdin is not None  # opened as a pipe just above
        try:
            while first:  # into an empty pipe: all of it at once (`PIPE_CAPACITY`), or else never cut short
                first = first[os.write(process.stdin.fileno(), first):]
        except BrokenPipeError:
            pass  # it has ended already: its exit status and stderr say why
    except BaseException:
        end_process(process)
        raise
    return process
