"""`python -m klbr_supervisor.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`). Standard library and ipykernel only.
"""

from __future__ import annotations

import runpy
import sys

from .deathsig import die_with

if __name__ == "__main__":
    die_with(int(sys.argv.pop(1)))
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
