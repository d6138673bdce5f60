"""Where a generation runs, as text: the placement specs, parsed. No I/O: each target checks itself.

A spec is text, as `Supervisor.placement`, `%klbr placement SPEC` and `host.relocate(spec)` take it:

- ``local``: ipykernel on the proxy's own interpreter, or `Supervisor.worker_kernel`'s kernelspec;
- ``python:/abs/path/to/python``: ipykernel on another interpreter or venv of this machine;
- ``kernelspec:NAME``: any installed kernelspec, and with it any jupyter_client provisioner;
- ``ssh://[user@]host[:port]/abs/path/to/python``: ipykernel on a machine reached by ssh;
- ``docker://IMAGE[?options]``: ipykernel in a container of IMAGE, through the `docker` command;
- ``slurm://[PARTITION][?options]``: ipykernel as a Slurm job step on a node the scheduler picks.

Options are ``name=value`` pairs after ``?``, joined by ``&`` (`DOCKER_OPTIONS`, `SLURM_OPTIONS`);
``mount`` may come more than once.

What each means for a launch (its key, a warm spare, how it is checked) is its target's, in
`klbr_supervisor.targets`. Standard library only: `prelaunch` parses an ``ssh://`` spec before the
proxy's own imports, to start that generation's ssh early.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

KINDS = ("local", "python", "kernelspec", "ssh", "docker", "slurm")
# What a docker:// spec may say of its container, and a slurm:// spec of its job (each an option of
# `docker run` or `srun`, given as one word ``--name=value``: a value never becomes an option).
DOCKER_OPTIONS = {"python": "the interpreter in the image (default python3)",
                  "user": "docker run --user (default: the kernel's uid:gid)",
                  "network": "docker run --network (default none: the kernel's sockets are files in a mount)",
                  "gpus": "docker run --gpus", "mount": "docker run --volume, as SRC:DST[:ro] (repeatable)",
                  "pull": "docker run --pull: missing or always (default never: the image must be there)",
                  "workdir": "the kernel's working directory, mounted (default: the kernel's own, the notebook's)"}
SLURM_OPTIONS = {"python": "the interpreter on the node (default python3)", "time": "srun --time",
                 "mem": "srun --mem", "gpus": "srun --gpus", "account": "srun --account", "qos": "srun --qos",
                 "cpus": "srun --cpus-per-task", "constraint": "srun --constraint"}
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")
_PARTITION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._,-]*")
# What an ssh:// spec may hold: its parts go to ssh's command line and the remote shell as words.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_REMOTE_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")


class PlacementError(ValueError):
    """A spec that names no place a generation can run; the text says exactly what is wrong."""


@dataclass(frozen=True)
class Placement:
    spec: str  # as the user wrote it, normalised
    kind: str  # one of KINDS, or "invalid": a spec that names no placement, kept to fail each start
    target: str = ""  # the interpreter's path, or the kernelspec's name
    host: str = ""  # ssh:// only: where, as whom, on which port
    user: str = ""
    port: int | None = None
    options: tuple[tuple[str, str], ...] = ()  # docker:// and slurm://: name=value, in the spec's order

    def option(self, name: str, default: str = "") -> str:
        """The last value the spec gives option `name`, or `default`."""
        values = self.all(name)
        return values[-1] if values else default

    def all(self, name: str) -> list[str]:
        """Every value the spec gives option `name`, in order."""
        return [value for key, value in self.options if key == name]

    @property
    def python(self) -> str:
        """The interpreter of a ``python:`` or ``ssh://`` placement."""
        return self.target

    @property
    def destination(self) -> str:
        """ssh's destination argument: ``[user@]host``."""
        return f"{self.user}@{self.host.strip('[]')}" if self.user else self.host.strip("[]")

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
    if spec.startswith(("docker://", "slurm://")):
        return _parse_engine(spec)
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ("python", "kernelspec"):
        msg = (f"{spec!r} is no placement; use local, python:/abs/path/to/python, "
               "kernelspec:NAME, ssh://[user@]host[:port]/abs/path/to/python, docker://IMAGE or slurm://[PARTITION]")
        raise PlacementError(msg)
    if kind == "python":
        if not os.path.isabs(target):
            msg = f"{spec!r}: the interpreter must be an absolute path, as in python:/usr/bin/python3"
            raise PlacementError(msg)
        return Placement(f"python:{os.path.normpath(target)}", "python", os.path.normpath(target))
    if not target or any(c.isspace() or c == "/" for c in target):
        msg = f"{spec!r}: kernelspec:NAME needs the name of an installed kernelspec"
        raise PlacementError(msg)
    return Placement(spec, "kernelspec", target)


def _parse_ssh(spec: str) -> Placement:
    netloc, slash, path = spec[len("ssh://"):].partition("/")
    if not slash or not path:
        msg = f"{spec!r}: ssh:// needs the interpreter's absolute path after the host, as in ssh://gpu-box/usr/bin/python3"
        raise PlacementError(msg)
    python = os.path.normpath("/" + path)
    user, _, hostport = netloc.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = hostport.partition(":")
    if not _HOST.fullmatch(host):
        msg = f"{spec!r}: {host!r} is not a host name ssh can be given"
        raise PlacementError(msg)
    if user and not _USER.fullmatch(user):
        msg = f"{spec!r}: {user!r} is not a user name ssh can be given"
        raise PlacementError(msg)
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        msg = f"{spec!r}: {port!r} is not a port"
        raise PlacementError(msg)
    if not _REMOTE_PATH.fullmatch(python):
        msg = f"{spec!r}: the interpreter's path may hold only letters, digits and . _ / + -"
        raise PlacementError(msg)
    normal = f"ssh://{user + '@' if user else ''}{host}{':' + port if port else ''}{python}"
    return Placement(normal, "ssh", python, host=host, user=user, port=int(port) if port else None)


def _parse_engine(spec: str) -> Placement:
    kind, _, rest = spec.partition("://")
    target, _, query = rest.partition("?")
    known = DOCKER_OPTIONS if kind == "docker" else SLURM_OPTIONS
    if kind == "docker" and not _IMAGE.fullmatch(target):
        msg = f"{spec!r}: docker:// needs an image, as in docker://python:3.12"
        raise PlacementError(msg)
    if kind == "slurm" and target and not _PARTITION.fullmatch(target):
        msg = f"{spec!r}: {target!r} is not a partition's name"
        raise PlacementError(msg)
    try:
        options = tuple(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        msg = f"{spec!r}: options come as name=value, joined by &"
        raise PlacementError(msg) from None
    for name, value in options:
        if name not in known:
            msg = f"{spec!r}: {name!r} is no {kind}:// option; there are " + ", ".join(sorted(known))
            raise PlacementError(msg)
        if not value or any(c in value for c in "\0\n") or (name == "mount" and len(value.split(":")) not in (2, 3)):
            msg = f"{spec!r}: {name}={value!r} is not a value it takes ({known[name]})"
            raise PlacementError(msg)
    return Placement(spec, kind, target, options=options)
