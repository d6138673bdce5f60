"""How a process ended, in the words a notebook user reads."""

from __future__ import annotations

import signal

# Names people recognise for the signals that end kernels, instead of "killed by signal 11".
_PLAIN = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGFPE: "floating-point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGABRT: "aborted",
}


def describe_exit(returncode: int | None) -> str:
    """Describe a `subprocess` returncode: negative means killed by that signal."""
    if returncode is None:
        return "still running"
    if returncode >= 0:
        return f"exited with status {returncode}"
    signum = -returncode
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"killed by signal {signum}"
    if sig in _PLAIN:
        return f"{_PLAIN[sig]} ({sig.name})"
    return f"killed by signal {signum} ({sig.name})"
