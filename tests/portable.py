"""klbr as a Mac runs it, on Linux: a kernelspec whose kernel, and every Python process it starts, has
what macOS lacks taken away, so `klbr_supervisor.system` takes its portable way for each facility.

- no `os.pidfd_open`, no `prctl` in the C library, and RLIMIT_DATA taken but not enforced (by a
  `sitecustomize` on PYTHONPATH, which every Python process of the kernel but the reaper's
  `python -I -S` reads);
- an empty /proc: the kernel runs in a mount namespace of its own (`unshare`, so root) with a tmpfs
  over /proc. psutil, which on a Mac asks the system itself, is shown the real one elsewhere
  (`psutil.PROCFS_PATH`), or nothing at all (`psutil_sees=False`: nothing here can show another
  process, only that its pid exists).

`refused` instead keeps Linux as it is but has `os.pidfd_open` answer ENOSYS, as under valgrind or
on Linux before 5.3 (a seccomp filter answers EPERM).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SITECUSTOMIZE = '''
"""What macOS lacks, taken away (tests/portable.py)."""
import ctypes
import errno
import os

if os.environ.get("KLBR_TEST_SYSTEM") == "refused":
    def pidfd_open(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")
    os.pidfd_open = pidfd_open
else:
    import resource

    del os.pidfd_open
    setrlimit = resource.setrlimit

    def setrlimit_taken(which, limits):  # macOS takes RLIMIT_DATA and does not enforce it
        if which != resource.RLIMIT_DATA:
            setrlimit(which, limits)

    resource.setrlimit = setrlimit_taken

    class CDLL(ctypes.CDLL):
        def __getattr__(self, name):
            if name == "prctl":
                raise AttributeError(name)
            return super().__getattr__(name)

    ctypes.CDLL = CDLL
    if os.environ.get("KLBR_TEST_PROCFS"):
        import psutil
        psutil.PROCFS_PATH = os.environ["KLBR_TEST_PROCFS"]
'''
# Run by `unshare --mount --propagation private`: the real procfs where psutil is told to look, then
# an empty /proc, then the kernel.
NO_PROC = """
set -e
if [ -n "$KLBR_TEST_PROCFS" ]; then mount -t proc proc "$KLBR_TEST_PROCFS"; fi
mount -t tmpfs -o size=64k,mode=0555 none /proc
exec "$@"
"""


def kernelspec(where: Path, name: str, *, system: str = "portable", psutil_sees: bool = True) -> dict[str, str]:
    """A kernelspec `name` under `where` for a klbr kernel on that system ("portable": as on a Mac;
    "refused": Linux refusing pidfds); the environment that finds it (JUPYTER_PATH)."""
    site = where / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": str(site), "KLBR_TEST_SYSTEM": system}
    argv = [sys.executable, "-m", "klbr_kernel", "-f", "{connection_file}"]
    if system == "portable":
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", NO_PROC, "sh", *argv]
        if psutil_sees:
            procfs = where / "procfs"
            procfs.mkdir(exist_ok=True)
            env["KLBR_TEST_PROCFS"] = str(procfs)
    spec = where / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "env": env, "display_name": f"klbr, {system}", "language": "python",
        "interrupt_mode": "message"}))
    return {"JUPYTER_PATH": os.pathsep.join([str(where), os.environ.get("JUPYTER_PATH", "")])}
