"""The host channel's client, placed for a worker whose interpreter has no klbr of its own.

`from klbr_kernel import host` needs a `klbr_kernel` package. A `python:` venv or a kernelspec of
another interpreter has none, and nothing may be installed there. So each such generation gets a
directory of its own in the kernel's 0700 runtime directory, holding a `klbr_kernel` package of two
files: `host.py`, the client's own source (the standard library and pyzmq only, which every
ipykernel has), and an `__init__` (`SHIM`). The directory goes last on the worker's PYTHONPATH.

A real klbr installed there wins: PYTHONPATH comes before site-packages, so the placed package may
be found first; its `__init__` then looks for another `klbr_kernel` on the rest of the path (and
the import system's other finders, which an editable install uses) and, if there is one, runs that
one in its place, as `sys.modules` lets a module replace itself while it is imported.

The client is `klbr_kernel.host`, of the wheel this kernel runs from. The supervisor copies its
source file and never imports it (its import changes how this process starts threads).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil

PACKAGE = "klbr_kernel"
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
def source() -> str:
    """The path of the client's source: `host.py` in the `klbr_kernel` package found here (by the
    import system's finders, which import nothing for a top-level name)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        msg = f"no {PACKAGE} package here: the host client cannot be placed"
        raise LookupError(msg)
    return os.path.join(next(iter(spec.submodule_search_locations)), "host.py")


def place(directory: str) -> str:
    """Write the client package under `directory` (made 0700); the directory to put on the
    worker's path."""
    package = os.path.join(directory, PACKAGE)
    os.makedirs(package, mode=0o700, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w", encoding="utf-8") as f:
        f.write(SHIM)
    shutil.copyfile(source(), os.path.join(package, "host.py"))
    return directory


def on_path(env: dict[str, str], directory: str) -> dict[str, str]:
    """`env` with `directory` last on its PYTHONPATH (whatever the user put there comes first)."""
    before = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": f"{before}{os.pathsep}{directory}" if before else directory}


def remove(directory: str) -> None:
    """The generation has ended: its client goes."""
    shutil.rmtree(directory, ignore_errors=True)
