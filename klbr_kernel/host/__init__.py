"""Cell code talks to its supervisor: `from klbr_kernel import host` (the calls: `client`).

This package runs inside workers, never in the kernel process (importing it changes how the
importing process starts threads); the kernel hands the supervisor its files for workers without
klbr (`klbr_kernel.client_package`).
"""

from . import handovers
from .client import CODES, HostError, get, inspect, keys, notify, put, relocate, restart, run

# Cell code imports this: from now on, a thread it starts and work it hands to a pool make their
# calls for the cell they were handed over in (a thread that outlives its cell is `not_running`).
handovers.follow()

__all__ = ["CODES", "HostError", "get", "inspect", "keys", "notify", "put", "relocate", "restart", "run"]
