"""`python -m klbr_supervisor.boot.worker PARENT_PID ARGS...`: the default workbench, ipykernel, as klbr starts it.

The same as ``python -m ipykernel_launcher ARGS...``, with the death signal armed first, in this
process (see `deathsig`), then klbr's changes to how ipykernel runs (see `bootstrap`). A worker on
an interpreter without klbr runs the same bootstrap, sent as its source text (`BOOTSTRAP`) to
``python -c``. Standard library only until the bootstrap imports ipykernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import bootstrap
from .bootstrap import MEMORY_LIMIT, NOTICE
from .deathsig import die_with

__all__ = ["BOOTSTRAP", "MEMORY_LIMIT", "NOTICE"]

# The bootstrap, for ``python -c BOOTSTRAP -f CONNECTION_FILE ...`` (a `python:` worker, an `ssh://`,
# `docker://` or `slurm://` one, sent in its agent's start): its source, compiled under a file name
# of its own (not `-c`'s "<string>", which a cell's `exec` has too), run as a script there: it
# starts the worker.
BOOTSTRAP = (f"exec(compile({Path(bootstrap.__file__).read_text(encoding='utf-8')!r}, "
             f"{bootstrap.SOURCE_NAME!r}, 'exec'))")


if __name__ == "__main__":
    # Under its own name too: ipykernel 7's debugger hides the frames of the modules loaded as the
    # kernel starts, and runpy takes "__main__" for the launcher, so this file's frame (under every
    # cell's) showed in JupyterLab's call stack.
    sys.modules.setdefault(__spec__.name, sys.modules[__name__])
    die_with(int(sys.argv.pop(1)))
    bootstrap.main()
