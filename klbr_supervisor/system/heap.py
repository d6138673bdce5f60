"""Freed memory given back to the system after a flood of output (`give_back`). Standard library only.

Linux (glibc): `malloc_trim(0)`, which returns the free pages of every arena, inside the heap as well
as at its top. glibc keeps what is freed for reuse, and large blocks freed one after another (a
flood's messages, each up to 256 KiB) raise its threshold for giving a block a mapping of its own, so
later ones come from the heap, which does not shrink while a block near its top lives: after three
cells that printed 50 MiB and 100,000 lines each, the proxy held 10 MiB more than before them
(2026-12-06). Elsewhere (macOS, whose allocator hands free pages back by itself; a C library without
`malloc_trim`): nothing. The worker's bootstrap, which runs where klbr may not be installed, does the
same for its worker on its own (`boot.bootstrap.memory_back_after_floods`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    return trim


_TRIM = _malloc_trim()


def give_back() -> bool:
    """Return the heap's free pages to the system, where the C library can; whether it could."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
