"""The JupyterLab extension in the sdist and the wheel: hatchling's custom build hook.

hatchling loads this file for every build of klbr (`[tool.hatch.build.hooks.custom]` in pyproject.toml):
`pip install .`, `pip install git+...`, `python -m build` (the sdist, then the wheel from it), an
editable install. A bundle already built (`labextension/dist`: by `make labextension`, or carried by
the sdist) is shipped as it is. Without one, a standard build builds it from the TypeScript with
Node.js and jlpm, as `make labextension` does; jlpm is jupyter-builder's (JupyterLab's own yarn),
a build dependency only then. A machine without Node.js gets the kernel, and one line saying the
extension was not built and how to get it. An editable install never builds: `make labextension`
builds and places it in the dev venv, and `make`'s install stays fast.

hatch-jupyter-builder's hook builds the same way, but fails the build where Node.js is missing (its
ensured targets) and cannot leave the extension's shared data out; this hook does both in its stead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "labextension"
BUNDLE = f"{SOURCE}/dist"
SHARE = "share/jupyter/labextensions/klbr-jupyterlab"
# What rspack and vite, which build and test the extension, ask for (their `engines`).
NODE_AT_LEAST = (20, 19)
JLPM = "jupyter-builder>=1.0.2"  # the first jupyter-builder JupyterLab 4's jlpm comes from


def node_problem() -> str | None:
    """Why this machine cannot build the extension, or None when its Node.js can."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        return "no Node.js on PATH"
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()  # noqa: S603 — PATH's node
    found = re.match(r"v(\d+)\.(\d+)", out)
    if found is None or (int(found[1]), int(found[2])) < NODE_AT_LEAST:
        return f"Node.js {out or '(no version)'} is older than {'.'.join(map(str, NODE_AT_LEAST))}"
    return None


class LabExtensionHook(BuildHookInterface[BuilderConfig]):
    """Builds the bundle when a standard build has none, and ships it: as shared data in the wheel, as
    an artifact in the sdist (so a wheel built from the sdist needs no Node.js)."""

    def _built(self) -> bool:
        return os.path.isfile(os.path.join(self.root, BUNDLE, "package.json"))

    def dependencies(self) -> list[str]:
        """Asked before any build, editable or not (hatchling does not say which)."""
        return [JLPM] if not self._built() and node_problem() is None else []

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not self._built() and version == "standard" and node_problem() is None:
            self._build()
        if not self._built():
            why = node_problem() or "an editable install does not build it"
            how = ("run `make labextension`" if version == "editable" else
                   f"install Node.js {'.'.join(map(str, NODE_AT_LEAST))} or newer and install klbr-kernel again")
            self.app.display_warning(f"klbr-kernel: the JupyterLab extension was not built ({why}); the kernel "
                                     f"works without it. To get it, {how}.")
        elif self.target_name == "sdist":
            build_data["artifacts"].append(f"/{BUNDLE}")
        else:
            build_data["shared_data"][BUNDLE] = SHARE
            build_data["shared_data"][f"{SOURCE}/install.json"] = f"{SHARE}/install.json"

    def _build(self) -> None:
        jlpm = shutil.which("jlpm")
        if jlpm is None:
            msg = f"jlpm is not on PATH: the build needs {JLPM}"
            raise RuntimeError(msg)
        self.app.display_waiting("klbr-kernel: building the JupyterLab extension (jlpm install, jlpm build)")
        cwd = os.path.join(self.root, SOURCE)
        env = {**os.environ, "YARN_ENABLE_TELEMETRY": "0"}
        for command in (["install", "--immutable"], ["build"]):  # as `make labextension` runs them
            subprocess.run([jlpm, *command], cwd=cwd, env=env, check=True)  # noqa: S603 — jupyter-builder's jlpm
