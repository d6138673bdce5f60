"""What and where a worker runs, taken once it serves: `host.inspect`, `%klbr status`, the
generations table (docs/host-callbacks.md: `host.inspect`)."""

from __future__ import annotations

import ast
import json
import os
import platform
import socket
from typing import TYPE_CHECKING, Any

from ..system import facts

if TYPE_CHECKING:
    from jupyter_client.session import Session

    from .readiness import Readiness

# What a Python worker that may run elsewhere is asked, as a user expression of a silent execute:
# its own answer, from wherever it runs.
EXPRESSION = ("__import__('json').dumps({'hostname': __import__('socket').gethostname(), "
              "'platform': __import__('platform').system(), 'arch': __import__('platform').machine(), "
              "'interpreter': __import__('sys').executable, 'pid': __import__('os').getpid(), "
              "'cwd': __import__('os').getcwd()})")


def snapshot(pid: int, kernel_info: dict[str, Any]) -> dict[str, Any]:
    """Hostname, platform, arch, interpreter and its version, pid and cwd of the worker `pid` (here)."""
    started = facts.started(pid)
    argv0 = started.argv[0] if started.argv else ""  # as it was started: a venv's python, not the binary it links to
    return {
        "hostname": socket.gethostname(), "platform": platform.system(), "arch": platform.machine(),
        "interpreter": argv0 if os.path.isabs(argv0) else started.executable,
        "version": kernel_info.get("language_info", {}).get("version"),
        "pid": pid, "cwd": started.cwd,
    }


def from_answer(content: dict[str, Any], kernel_info: dict[str, Any]) -> dict[str, Any] | None:
    """The identity in an execute_reply to `EXPRESSION` (as user expression ``identity``), or None."""
    try:
        text = content["user_expressions"]["identity"]["data"]["text/plain"]
        answer = json.loads(ast.literal_eval(text))
    except (KeyError, TypeError, ValueError, SyntaxError):
        return None
    if not isinstance(answer, dict):
        return None
    keys = ("hostname", "platform", "arch", "interpreter", "pid", "cwd")
    return {**{k: answer.get(k) for k in keys}, "version": kernel_info.get("language_info", {}).get("version")}


async def ask_identity(readiness: Readiness, session: Session) -> dict[str, Any] | None:
    """Ask a Python worker that may run elsewhere where it runs (None: not Python, or no answer)."""
    if readiness.kernel_info.get("language_info", {}).get("name") != "python":
        return None
    answer = await readiness.ask(session.msg("execute_request", {
        "code": "", "silent": True, "store_history": False, "user_expressions": {"identity": EXPRESSION},
        "allow_stdin": False}), timeout=10)
    return from_answer(answer.content, readiness.kernel_info) if answer is not None else None
