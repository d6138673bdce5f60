"""A target: where one generation's worker runs, and the one seam between it and its generation.

Every placement kind is a subclass in a module of its own (`local`, `python`, `kernelspec`,
`provisioned`, `ssh`, `docker`, `slurm`; the last three share `agent`); `factory` picks the kind a parsed spec names. A `Generation` holds one
instance and uses nothing of it but what this class declares, so "how does X start" is this file,
then X's module.

The lifecycle (abstract: each kind serves it): `launch` (the connection info, or a `LaunchError`
saying why not), `interrupt`, `signal` (SIGTERM asks the worker to end, SIGKILL ends it), `keep` and
`tail` (its stderr's last lines), `release` and `close` once it has ended, `pid`, and one end
reported once, through the `on_exit` given to `launch`: an exit status, or None when no exit could
be seen (its helper or its ssh ended first; `confirmed` and `lost_how` then say what is known, and
the generation calls that a lost link).

What a kind declares, read by the generation and the supervisor (never the spec's text):

- `shares_key`: its worker runs here under this user and gets the frontend's key and the proxy's
  session, so its frames are relayed untouched; any other gets a fresh key per generation, is
  re-signed both ways (`resign`) and has its link watched (`link`);
- `warm`: a warm spare is kept by default (`Supervisor.standby` unset); elsewhere a spare costs a
  pod or a remote process;
- `starts_early`: generation 1 can be started before the proxy's imports (`boot.prelaunch`), and
  this kind adopts what was started (the `early` it is given);
- `asks_identity`: where and what it runs is asked of the worker itself, which may run elsewhere,
  instead of read from /proc here;
- `remote`: its process may not be ours to see exit;
- `host_channel`: how the host channel (`klbr_supervisor.host`) reaches its worker: "environ", its
  endpoint and credentials in the worker's environment (an ipc path, which reaches it on this
  machine); "forwarded", the credentials handed to what starts it elsewhere, the endpoint a socket
  forwarded back to this machine's (`ssh`); "mounted", the credentials handed to what starts it, the
  endpoint this machine's socket, mounted at the same path (`docker`); "tcp", the credentials and
  the TCP endpoint's CurveZMQ key in its environment (named KERNEL_* so a provisioner forwards them:
  `provisioned`; or handed to what starts it: `slurm`); or None: not at all (the worker is told why);
- `places_client`: its interpreter may have no klbr, so each generation gets the host client placed
  last on its worker's path (`client`; a klbr installed there wins);
- `takes_klbr_options`: its worker is an ipykernel klbr starts, which gets the proxy's session id and
  klbr's own options before the user's (any other gets the user's only, after its own argv);
- `limits_memory`: `Supervisor.memory_limit` reaches its worker, in its environment: klbr's bootstrap
  sets it on itself (RLIMIT_DATA, before ipykernel starts), or its engine enforces it (a container's
  limit); `oom_killed` then says, at its end, whether the engine killed it for memory;
- `drops_iopub`: its worker is not klbr's bootstrap, so its iopub keeps ipykernel's high-water mark
  and may drop what it publishes while the proxy cannot read: its message numbers are counted for
  what never came (`sequence`); `interrupts_by_message`: its interrupt is a control message a
  manager sends on a socket of its own, so the worker answers where the generation does not read;
- `check`: whether a generation can start there at all, asked before a session moves there;
  `checked_by_launch`: its launch says the same itself, so the first start does not check apart.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, TypedDict

from jupyter_client.session import Session

from ..boot.placement import Placement
from . import client

if TYPE_CHECKING:
    import zmq

    from ..boot.early import Early
    from ..boot.reaper import Reaper

OnExit = Callable[[int | None], None]
SshCommand = tuple[list[str], list[str]]  # ssh's words and the options added to them
# What a worker that does not share the frontend's key is given of the kernel's environment (its
# kernelspec's `env` comes on top): what code needs to find its tools, libraries, GPUs and
# network, not the kernel's secrets (a provisioner may forward what it gets to another host).
MINIMAL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
               "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "VIRTUAL_ENV",
               "CONDA_PREFIX", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "SSL_CERT_FILE",
               "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY",
               "HTTPS_PROXY", "NO_PROXY")


@dataclass(frozen=True)
class Engines:
    """The commands `docker://` and `slurm://` generations run, and what each adds to them."""

    docker: list[str] = field(default_factory=lambda: ["docker"])
    docker_options: list[str] = field(default_factory=list)
    srun: list[str] = field(default_factory=lambda: ["srun"])
    slurm_options: list[str] = field(default_factory=list)


NO_ENGINES = Engines()  # their defaults: what a check is given when nothing configures them


class CommonArgs(TypedDict):
    """The keywords every target is given, whatever else its kind takes by name."""

    session: Session
    given: Given


class GenerationArgs(CommonArgs):
    """The keywords `factory.target_for` passes on to a target, beside its placement."""

    early: NotRequired[Early | None]


class TargetArgs(GenerationArgs):
    """Every keyword `Target.__init__` takes, as its subclasses pass them on."""

    worker_kernel: NotRequired[str]


class LaunchError(Exception):
    """The worker could not be launched; the text says why."""


@dataclass(frozen=True)
class Given:
    """What the supervisor gives the target of each generation."""

    number: int  # the generation's
    runtime_dir: str  # the kernel's own 0700 directory: connection files, ipc sockets
    reaper: Reaper  # watches every local process group, in case the kernel dies
    context: zmq.Context[zmq.Socket[bytes]]  # the supervisor's; a target shadows it, with no ZMQ threads of its own
    log: logging.Logger
    ssh: SshCommand = (["ssh"], [])
    link_timeout: float = 15.0
    engines: Engines = field(default_factory=Engines)
    # The host client, for a worker that may have no klbr (`places_client`): a package's files by
    # their path below the directory that goes on its path (see `client`); none: nothing placed.
    client: Mapping[str, str] = field(default_factory=dict)
    # The host channel's TCP endpoint and CurveZMQ public key, for a worker only TCP may reach
    # (`HostService.tcp`; raises OSError or zmq.ZMQError); none: no TCP channel.
    host_tcp: Callable[[], tuple[str, str]] | None = None
    # `Supervisor.debugger`: whether a worker klbr starts keeps debugpy (its bootstrap is told by
    # `worker_args`); the kernelspec a kind builds for it says so in its metadata.
    debugger: bool = True


class Target(ABC):
    shares_key: ClassVar[bool] = False
    warm: ClassVar[bool] = False
    starts_early: ClassVar[bool] = False
    asks_identity: ClassVar[bool] = True
    remote: ClassVar[bool] = False
    host_channel: ClassVar[str | None] = "environ"
    takes_klbr_options: ClassVar[bool] = False
    limits_memory: ClassVar[bool] = False
    drops_iopub: ClassVar[bool] = True
    oom_killed = False  # its worker's end came with an OOM kill its engine counted (not a guess)
    checked_by_launch: ClassVar[bool] = False

    def __init__(self, placement: Placement, *, session: Session, given: Given, worker_kernel: str = "",
                 early: Early | None = None):
        """Created by the supervisor for one generation (see `factory.target_for`); `session` is the
        proxy's (its key, scheme and session id), `early` what `boot.prelaunch` started for it."""
        if early is not None and not self.starts_early:
            message = f"{type(self).__name__} cannot adopt a worker started early"
            raise ValueError(message)
        self.placement = placement
        self.kernel_name = ""  # the kernelspec it launches (klbr's own names for its built-in ones)
        self.session = session if self.shares_key else Session(
            key=os.urandom(32).hex().encode("ascii"), signature_scheme=session.signature_scheme,
            username=session.username)
        self.given = given
        self.confirmed = False  # an end with no exit status: whether its kill was confirmed
        self.lost_how = ""  # an end with no exit status: how it came
        self.client_dir = ""  # where its host client was placed (`places_client`), until `close`

    @property
    def places_client(self) -> bool:
        """Whether its worker's interpreter may have no klbr (see `client`); none does here."""
        return False

    @property
    def interrupts_by_message(self) -> bool:
        """Whether its interrupt is answered where the generation does not read (see the docstring)."""
        return False

    @classmethod
    async def check(cls, placement: Placement, ssh: SshCommand, engines: Engines = NO_ENGINES) -> None:
        """Raise `PlacementError` saying what is missing there (the interpreter, ipykernel, the
        kernelspec, the host); `relocate` asks it before the current generation ends for it."""

    def environ(self) -> dict[str, str]:
        """Its worker's environment, before the host channel's credentials."""
        return {name: os.environ[name] for name in MINIMAL_ENV if name in os.environ}

    def environment(self, host: dict[str, str]) -> dict[str, str]:
        """What its worker is started with: `environ`, and the host channel's credentials `host`
        when they reach it (never in argv: they, and its key, are secrets), with the client
        placed on its path where it `places_client`; else why there is no channel."""
        if self.host_channel != "environ":  # what its client says, if it has one
            return {**self.environ(), "KLBR_HOST_UNAVAILABLE": f"{self.placement.spec} offers no host channel"}
        env = {**self.environ(), **host}
        if self.places_client and self.given.client:
            self.client_dir = client.place(os.path.join(self.given.runtime_dir, f"client{self.given.number}"),
                                           self.given.client)
            env = client.on_path(env, self.client_dir)
        return env

    def remove_client(self) -> None:
        """Its generation has ended (`close`): the client placed for it goes."""
        if self.client_dir:
            client.remove(self.client_dir)
            self.client_dir = ""

    def arguments(self, session_id: str, klbr_options: tuple[str, ...], options: tuple[str, ...]) -> list[str]:
        """Its worker's words after its own command line: the proxy's session id and klbr's own
        options when it takes them, then the user's `options` (on every kind)."""
        own = [f"--Session.session={session_id}", *klbr_options] if self.takes_klbr_options else []
        return [*own, *options]

    @abstractmethod
    async def launch(self, extra_arguments: list[str], env: dict[str, str], on_exit: OnExit) -> dict[str, Any]:
        """Start the worker with `extra_arguments` after its own command line; its connection info.
        From then on its end is reported once, to `on_exit`. Raises `LaunchError`."""

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """Its worker's process here, if it has one."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Interrupt what the worker runs (as its kernelspec says: SIGINT, or a control message)."""

    @abstractmethod
    def signal(self, sig: int) -> None:
        """SIGTERM asks the worker to end, SIGKILL ends it; nothing before it is launched."""

    @abstractmethod
    def keep(self, data: bytes) -> None:
        """Add to its stderr tail (what the worker published about no request)."""

    @abstractmethod
    def tail(self) -> str:
        """The last lines of its stderr."""

    @abstractmethod
    async def release(self) -> None:
        """Its end has been reported: what it leaves here (files, a manager's sockets) goes."""

    @abstractmethod
    def close(self) -> None:
        """Its generation has ended: whatever it started goes too."""
