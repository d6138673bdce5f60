"""`klbr_supervisor.boot` runs with the standard library only: before the kernel's imports (the
prelaunch), as a watchdog under ``python -I -S`` (the reaper), in front of any kernelspec's command
(deathsig), or on a remote host that has no klbr (the ssh agent). Each of its modules is imported here
by an interpreter that cannot import any third-party package, and is read for the imports it defers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "klbr_supervisor" / "boot"
MODULES = sorted(f"klbr_supervisor.boot.{path.stem}" for path in BOOT.glob("*.py") if path.stem != "__init__")
# The seam's parts a worker arms before anything else is imported (`boot.worker`, `boot.deathsig`),
# or that claim the standard library only: boot may import them, and they import as boot does.
SEAM = ("klbr_supervisor.system", "klbr_supervisor.system.death", "klbr_supervisor.system.watch")
# Run with no site-packages (-S), no user site or environment (-I): only the standard library, and
# the source tree added by hand.
BARE = [sys.executable, "-I", "-S"]
IMPORT = """\
import importlib, json, sys
sys.path.insert(0, {root!r})
before = set(sys.modules)
importlib.import_module({module!r})
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _ours_or_stdlib(name: str) -> bool:
    return (name.split(".", maxsplit=1)[0] in sys.stdlib_module_names or name in ("klbr_supervisor", "klbr_supervisor.boot")
            or name.startswith("klbr_supervisor.boot.") or name in SEAM)


def test_the_bare_interpreter_has_no_third_party_package():
    """What makes the test below mean something: pyzmq (which the venv has) is not importable there."""
    __import__("zmq")
    done = subprocess.run([*BARE, "-c", "import zmq"], check=False, capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'zmq'" in done.stderr, done.stderr


@pytest.mark.parametrize("module", MODULES + list(SEAM[1:]))
def test_a_boot_module_imports_with_the_standard_library_only(module):
    done = subprocess.run([*BARE, "-c", IMPORT.format(root=str(ROOT), module=module)], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    outside = [name for name in json.loads(done.stdout) if not _ours_or_stdlib(name)]
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", MODULES)
def test_what_a_boot_module_imports_later_is_the_standard_library_or_boot_too(module):
    """Imports inside functions (the prelaunch defers some, for its start) run only on some paths."""
    path = BOOT / f"{module.rsplit('.', 1)[1]}.py"
    outside = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            outside += [alias.name for alias in node.names if not _ours_or_stdlib(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and not _ours_or_stdlib(node.module or ""):
                outside.append(node.module)
            elif node.level > 1:  # out of boot, into the rest of klbr_supervisor
                outside.append("." * node.level + (node.module or ""))
    assert not outside, f"{module} imports {outside}"
