"""The host client as a package to place on the path of a worker whose interpreter has no klbr.

`from klbr_kernel import host` needs a `klbr_kernel` package. A `python:` venv, a kernelspec of
another interpreter or an `ssh://` remote has none, and nothing may be installed there. So the
supervisor writes, for each such generation, the `files` of a package of two modules into a
directory of that generation (the kernel's 0700 runtime directory here, the agent's 0700 directory
on a remote) and puts that directory last on the worker's PYTHONPATH: the `host` package, the
client's own source (the standard library and pyzmq only, which every ipykernel has), and an
`__init__` for `klbr_kernel` (`SHIM`). The supervisor is handed them by the proxy (and by `__main__` for a first worker started
early), knows nothing of what they hold, and never imports them: importing the client changes how
the importing process starts threads.

A real klbr installed there wins: PYTHONPATH comes before site-packages, so the placed package may
be found first; its `__init__` then looks for another `klbr_kernel` on the rest of the path (and
the import system's other finders, which an editable install uses) and, if there is one, runs that
one in its place, as `sys.modules` lets a module replace itself while it is imported.
"""

from __future__ import annotations

import functools
import os

SHIM = '''\
"""klbr's host client, placed by the kernel for this worker; a klbr installed here is used instead."""

import importlib.machinery
import importlib.util
import os
import sys


def _installed():
    """The spec of another `klbr_kernel` this interpreter can import, or None."""
    placed = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != placed]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(__name__, path if finder is importlib.machinery.PathFinder else None)
        if spec is not None and spec.origin != __file__:
            return spec
    return None


_spec = _installed()
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module  # what the import statement returns: the installed klbr
    _spec.loader.exec_module(_module)
'''


@functools.cache
def files() -> dict[str, str]:
    """The package's files, by their path below the directory that goes on the worker's path."""
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.basename(here)
    client = os.path.join(here, "host")
    placed = {f"{package}/__init__.py": SHIM}
    for name in sorted(os.listdir(client)):
        if name.endswith(".py"):
            with open(os.path.join(client, name), encoding="utf-8") as f:
                placed[f"{package}/host/{name}"] = f.read()
    return placed
