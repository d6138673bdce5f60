"""Where a generation runs: the placement specs, what each one means for a launch, and their checks.

A spec is text, as `Supervisor.placement`, `%klbr placement SPEC` and `host.relocate(spec)` take it:

- ``local``: ipykernel on the proxy's own interpreter, or `Supervisor.worker_kernel`'s kernelspec;
- ``python:/abs/path/to/python``: ipykernel on another interpreter or venv of this machine;
- ``kernelspec:NAME``: any installed kernelspec, and with it any jupyter_client provisioner;
- ``ssh://[user@]host[:port]/abs/path/to/python``: ipykernel on a machine reached by ssh (see `ssh`).

A worker on this machine under this user (``local``, ``python:``) shares the frontend's key, so its
messages are relayed untouched, and keeps a warm spare. Every other one gets a fresh key per
generation, which the generation verifies and re-signs (see `generation`), and no spare: a spare
there costs a pod or a remote process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# `parse` runs before the proxy's own imports when `prelaunch` starts an ssh:// worker early: asyncio
# and jupyter_client (`launch`) are imported by the checks that need them.

KINDS = ("local", "python", "kernelspec", "ssh")
# What an ssh:// spec may hold: its parts go to ssh's command line and the remote shell as words.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_REMOTE_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")
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
    host: str = ""  # ssh:// only: where, as whom, on which port
    user: str = ""
    port: int | None = None

    @property
    def python(self) -> str:
        """The interpreter of a ``python:`` or ``ssh://`` placement."""
        return self.target

    @property
    def destination(self) -> str:
        """ssh's destination argument: ``[user@]host``."""
        return f"{self.user}@{self.host.strip('[]')}" if self.user else self.host.strip("[]")

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
    if spec.startswith("ssh://"):
        return _parse_ssh(spec)
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ("python", "kernelspec"):
        raise PlacementError(f"{spec!r} is no placement; use local, python:/abs/path/to/python, "
                             "kernelspec:NAME or ssh://[user@]host[:port]/abs/path/to/python")
    if kind == "python":
        if not os.path.isabs(target):
            raise PlacementError(f"{spec!r}: the interpreter must be an absolute path, as in python:/usr/bin/python3")
        return Placement(f"python:{os.path.normpath(target)}", "python", os.path.normpath(target))
    if not target or any(c.isspace() or c == "/" for c in target):
        raise PlacementError(f"{spec!r}: kernelspec:NAME needs the name of an installed kernelspec")
    return Placement(spec, "kernelspec", target)


def _parse_ssh(spec: str) -> Placement:
    netloc, slash, path = spec[len("ssh://"):].partition("/")
    if not slash or not path:
        raise PlacementError(f"{spec!r}: ssh:// needs the interpreter's absolute path after the host, as in "
                             "ssh://gpu-box/usr/bin/python3")
    python = os.path.normpath("/" + path)
    user, _, hostport = netloc.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = hostport.partition(":")
    if not _HOST.fullmatch(host):
        raise PlacementError(f"{spec!r}: {host!r} is not a host name ssh can be given")
    if user and not _USER.fullmatch(user):
        raise PlacementError(f"{spec!r}: {user!r} is not a user name ssh can be given")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise PlacementError(f"{spec!r}: {port!r} is not a port")
    if not _REMOTE_PATH.fullmatch(python):
        raise PlacementError(f"{spec!r}: the interpreter's path may hold only letters, digits and . _ / + -")
    normal = f"ssh://{user + '@' if user else ''}{host}{':' + port if port else ''}{python}"
    return Placement(normal, "ssh", python, host=host, user=user, port=int(port) if port else None)


async def check(placement: Placement, kernelspecs, ssh: tuple[list[str], list[str]] = (["ssh"], [])) -> None:
    """Whether a generation can start there at all, before the current one is ended for it.

    `kernelspecs` is a `KernelSpecManager`. Raises `PlacementError` saying what is missing: the
    interpreter, ipykernel in it, or the kernelspec."""
    import asyncio

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
    elif placement.kind == "ssh":
        from .ssh import check as reachable

        why = await reachable(placement, *ssh)
        if why is not None:
            raise PlacementError(f"{placement}: {why}")


async def problem(spec, ssh: tuple[list[str], list[str]] = (["ssh"], [])) -> str | None:
    """Why `spec` is no placement a generation can run on, or None (`host.relocate` asks)."""
    if not isinstance(spec, str):
        return "a placement spec is a string, as in python:/usr/bin/python3"
    from .launch import WorkerSpecs

    try:
        await check(parse(spec), WorkerSpecs(), ssh)
    except PlacementError as e:
        return str(e)
    return None


async def _has_ipykernel(placement: Placement, path: str) -> None:
    """Ask the interpreter itself: `import ipykernel_launcher` without running it (find_spec)."""
    import asyncio

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
