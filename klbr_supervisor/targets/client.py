"""The host channel's client, placed for a worker whose interpreter may have no klbr of its own.

The supervisor is handed the client as files (`Given.client`: a package's files by their path
below the directory that goes on the worker's path; the kernel says what they hold and how a klbr
installed there still wins) and places them, for each generation that `places_client`, in a
directory of its own in the kernel's 0700 runtime directory, last on the worker's PYTHONPATH.
The directory goes with its generation. The agent of an `ssh://`, `docker://` or `slurm://`
generation does the same where its kernel runs (`boot.agent`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping


def place(directory: str, files: Mapping[str, str]) -> str:
    """Write `files` under `directory` (its directories made 0700); the directory to put on the
    worker's path."""
    for name, text in files.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return directory


def on_path(env: dict[str, str], directory: str) -> dict[str, str]:
    """`env` with `directory` last on its PYTHONPATH (whatever the user put there comes first)."""
    before = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": f"{before}{os.pathsep}{directory}" if before else directory}


def remove(directory: str) -> None:
    """The generation has ended: its client goes."""
    shutil.rmtree(directory, ignore_errors=True)
