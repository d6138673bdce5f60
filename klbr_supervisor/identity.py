"""What and where a worker runs, taken once it serves: `host.inspect`, `%klbr status`, the
generations table (DESIGN.md: identity)."""

from __future__ import annotations

import os
import platform
import socket


def snapshot(pid: int, kernel_info: dict) -> dict:
    """Hostname, platform, arch, interpreter and its version, pid and cwd of the worker `pid` (here)."""
    def link(name: str) -> str | None:
        try:
            return os.readlink(f"/proc/{pid}/{name}")
        except OSError:
            return None

    try:  # as it was started (a venv's python, not the binary it links to)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        argv0 = ""
    return {
        "hostname": socket.gethostname(), "platform": platform.system(), "arch": platform.machine(),
        "interpreter": argv0 if os.path.isabs(argv0) else link("exe"),
        "version": kernel_info.get("language_info", {}).get("version"),
        "pid": pid, "cwd": link("cwd"),
    }
