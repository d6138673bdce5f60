"""Where a generation runs: the placement specs, what each one means for a launch, and their checks.

A spec is text, as `Supervisor.placement`, `%klbr placement SPEC` and `host.relocate(spec)` take it:

- ``local``: ipykernel on the proxy's own interpreter, or `Supervisor.worker_kernel`'s kernelspec;
- ``python:/abs/path/to/python``: ipykernel on another interpreter or venv of this machine;
- ``kernelspec:NAME``: any installed kernelspec, and with it any jupyter_client provisioner.

A worker on this machine under this user (``local``, ``python:``) shares the frontend's key, so its
messages are relayed untouched, and keeps a warm spare. Every other one gets a fresh key per
generation, which the generation verifies and re-signs (see `generation`), and no spare: a spare
there costs a pod or a remote process.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from .launch import WorkerSpecs

KINDS = ("local", "python", "kernelspec")
# What a provisioner is given of the kernel's environment (its kernelspec's `env` comes on top):
# what code needs to find its tools, libraries, GPUs and network, not the kernel's secrets.
_MINIMAL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
                "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "VIRTUAL_ENV",
                "CONDA_PREFIX", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "SSL_CERT_FILE",
                "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY",
                "HTTPS_PROXY", "NO_PROXY")


class PlacementError(ValueError):
    """A spec that names no place a generation can run; the text says exactly what is wrong."""


@dataclass(frozen=True)
class Placement:
    spec: str  # as the user wrote it, normalised
    kind: str  # one of KINDS
    target: str = ""  # the interpreter's path, or the kernelspec's name

    @property
    def shares_key(self) -> bool:
        """On this machine under this user: the frontend's key, and messages relayed untouched."""
        return self.kind in ("local", "python")

    @property
    def warm(self) -> bool:
        """Whether a warm spare is worth keeping by default."""
        return self.kind in ("local", "python")

    def environ(self) -> dict[str, str]:
        """Its worker's environment: the kernel's, on this machine under this user; a minimal one
        for a provisioner (which may forward what it gets to another host)."""
        if self.shares_key:
            return dict(os.environ)
        return {name: os.environ[name] for name in _MINIMAL_ENV if name in os.environ}

    def __str__(self) -> str:
        return self.spec


LOCAL = Placement("local", "local")


def parse(spec: str) -> Placement:
    """The `Placement` a spec names; `PlacementError` for one that is malformed."""
    spec = (spec or "").strip()
    if spec == "local":
        return LOCAL
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ("python", "kernelspec"):
        if spec.startswith("ssh://"):
            raise PlacementError(f"{spec!r}: ssh:// placement is not available in this version")
        raise PlacementError(f"{spec!r} is no placement; use local, python:/abs/path/to/python "
                             "or kernelspec:NAME")
    if kind == "python":
        if not os.path.isabs(target):
            raise PlacementError(f"{spec!r}: the interpreter must be an absolute path, as in python:/usr/bin/python3")
        return Placement(f"python:{os.path.normpath(target)}", "python", os.path.normpath(target))
    if not target or any(c.isspace() or c == "/" for c in target):
        raise PlacementError(f"{spec!r}: kernelspec:NAME needs the name of an installed kernelspec")
    return Placement(spec, "kernelspec", target)


async def check(placement: Placement, kernelspecs) -> None:
    """Whether a generation can start there at all, before the current one is ended for it.

    `kernelspecs` is a `KernelSpecManager`. Raises `PlacementError` saying what is missing: the
    interpreter, ipykernel in it, or the kernelspec."""
    if placement.kind == "python":
        path = placement.target
        if not os.path.exists(path):
            raise PlacementError(f"{placement}: {path} does not exist")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PlacementError(f"{placement}: {path} is not an executable interpreter")
        await _has_ipykernel(placement, path)
    elif placement.kind == "kernelspec":
        names = await asyncio.to_thread(kernelspecs.find_kernel_specs)
        if placement.target not in names:
            known = ", ".join(sorted(names)) or "none"
            raise PlacementError(f"{placement}: no kernelspec named {placement.target!r} is installed "
                                 f"(installed: {known})")


async def problem(spec) -> str | None:
    """Why `spec` is no placement a generation can run on, or None (`host.relocate` asks)."""
    if not isinstance(spec, str):
        return "a placement spec is a string, as in python:/usr/bin/python3"
    try:
        await check(parse(spec), WorkerSpecs())
    except PlacementError as e:
        return str(e)
    return None


async def _has_ipykernel(placement: Placement, path: str) -> None:
    """Ask the interpreter itself: `import ipykernel_launcher` without running it (find_spec)."""
    probe = ("import importlib.util, sys\n"
             "sys.exit(0 if importlib.util.find_spec('ipykernel_launcher') else 3)\n")
    try:
        proc = await asyncio.create_subprocess_exec(
            path, "-c", probe, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise PlacementError(f"{placement}: {path} cannot be run: {e.strerror or e}") from None
    try:
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PlacementError(f"{placement}: {path} did not answer within 30 s") from None
    if proc.returncode == 3:
        raise PlacementError(f"{placement}: {path} has no ipykernel; install it there "
                             f"({path} -m pip install ipykernel)")
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise PlacementError(f"{placement}: {path} is not a Python interpreter that klbr can use: {tail[0]}")
