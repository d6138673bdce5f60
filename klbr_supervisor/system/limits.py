"""A worker's memory limit, and what holds it: RLIMIT_DATA, which klbr's bootstrap sets on the worker
(`boot.worker`), where the system enforces it; elsewhere the memory watch's samples (`memory`).

Linux enforces RLIMIT_DATA on every private writable mapping (since 4.7): an allocation past it fails
in the worker, a Python one with MemoryError in the cell. macOS takes the limit and does not count
what malloc maps. Which holds is tried once per kernel, in a child of its own: a limit set, and an
allocation past it asked for (never touched, so nothing becomes resident either way).
"""

from __future__ import annotations

import functools
import subprocess
import sys

# Run as `python -c` (with its site: whatever the environment does to the interpreter, the probe
# sees too): exit 0 when the allocation past the limit failed.
PROBE = """
import resource, sys
limit = 256 << 20
hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
try:
    bytes(2 * limit)
except MemoryError:
    sys.exit(0)
sys.exit(1)
"""


@functools.cache
def enforced() -> bool:
    """Whether this system fails an allocation past RLIMIT_DATA; asked once per kernel (about 20 ms)."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, timeout=30, check=False)  # noqa: S603 — this interpreter, our probe
    except (OSError, subprocess.TimeoutExpired):
        return False  # nothing tells: the watch holds it, which costs nothing where the system does too
    return done.returncode == 0
