"""How a process ended, in the words a notebook user reads."""

from __future__ import annotations

import signal

# Names people recognise for the signals that end kernels, instead of "killed by signal 11"; by
# name, as not every system has every signal (Windows has no SIGBUS).
_PLAIN = {
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGFPE": "floating-point exception",
    "SIGILL": "illegal instruction",
    "SIGABRT": "aborted",
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
    if sig.name in _PLAIN:
        return f"{_PLAIN[sig.name]} ({sig.name})"
    return f"killed by signal {signum} ({sig.name})"
