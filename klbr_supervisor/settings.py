"""What a `Supervisor` is configured with: `Supervisor.*` on the kernel's command line or in
`jupyter_klbr_config.py` (docs/configuration.md). traitlets applies a section to a class and its
subclasses, so `Supervisor.cell_timeout` sets the trait declared here."""

from __future__ import annotations

import math

from traitlets import Bool, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable
from traitlets.utils.bunch import Bunch

from .boot.agent_launch import LINK_TIMEOUT
from .boot.placement import Placement
from .boot.prelaunch import debugger_args, history_args
from .boot.ssh_launch import split
from .memory import parse_size
from .targets.base import Engines
from .targets.factory import kind_for


class SupervisorSettings(LoggingConfigurable):
    worker_kernel = Unicode(
        "", config=True,
        help="Kernelspec name of the workbench (an ipykernel); empty means ipykernel on the proxy's own interpreter.",
    )
    placement = Unicode(
        "local", config=True,
        help="Where the first generation runs: local, python:/abs/path/to/python, kernelspec:NAME, "
             "ssh://[user@]host[:port]/abs/path/to/python, docker://IMAGE[?options] or slurm://[PARTITION][?options]; "
             "`%klbr placement SPEC` moves the session later.",
    )
    startup_timeout = Float(60.0, config=True, help="Seconds a new generation has to answer kernel_info.")
    cell_timeout = Float(0.0, config=True, help="Seconds a cell may run (0 = no limit); `%klbr timeout` overrides it.")
    interrupt_grace = Float(
        3.0, config=True,
        help="Seconds an interrupted cell has to end before its generation is killed (WorkerKilled).",
    )
    kill_grace = Float(0.5, config=True, help="Seconds between SIGTERM and SIGKILL when a generation is ended.")
    standby = Bool(
        None, allow_none=True, config=True,
        help="Keep one warm spare generation to take over at once (default: on for local and python: "
             "placements, off for the rest, where a spare costs a pod or a remote process).",
    )
    standby_delay = Float(
        1.0, config=True,
        help="Seconds after a generation is ready before its spare starts (so it does not slow the first cells).",
    )
    standby_idle_timeout = Float(
        600.0, config=True,
        help="Seconds with no cell running after which the warm spare is stopped, giving its memory back "
             "(an idle kernel then costs what one with standby off costs); the next cell starts it again, "
             "standby_delay after it is sent. 0 keeps the spare as long as the kernel runs.",
    )
    restart_limit = Int(5, config=True, help="Automatic new generations allowed per restart_window.")
    restart_window = Float(300.0, config=True, help="Seconds over which restart_limit counts.")
    ipython_history = Bool(
        False, config=True,
        help="Let ipykernel workers keep IPython's own history database (history.sqlite). Off by default: "
             "the cell log is the history, and each cell skips a second SQLite write (~1.5 ms of CPU). "
             "A HistoryManager.enabled, or a HistoryManager.hist_file other than :memory:, on the "
             "kernel's command line decides instead.",
    )
    debugger = Bool(
        True, config=True,
        help="Workers klbr starts (local, python:, ssh://, docker:// and slurm:// placements) have ipykernel's "
             "debugger (debugpy, for JupyterLab's debugger panel) when it is installed there; its modules (about "
             "7 MiB a worker) load when a frontend first uses the debugger or its variable explorer. False "
             "starts them without debugpy: no debugger, kernel_info says so (`debugger: false`), it never "
             "loads, and `import debugpy` in a cell fails. JupyterLab shows "
             "its debugger toggle by the kernelspec's metadata: `klbr-kernel install --no-debugger` writes a "
             "kernelspec that says no debugger and sets this. A kernelspec: or provisioner worker is not "
             "klbr's to start: it keeps its own debugger.",
    )
    link_timeout = Float(
        LINK_TIMEOUT, config=True,
        help="Seconds a worker that does not share the frontend's key (kernelspec:, ssh://, docker:// and "
             "slurm:// placements) may be silent, heartbeat included, before its link counts as lost "
             "(PlacementLost; 0 = never); also the lease of the agent that runs an ssh://, docker:// or "
             "slurm:// kernel.",
    )
    ssh_command = Unicode(
        "ssh", config=True,
        help="The ssh client ssh:// placements run (words, as a shell splits them), with the kernel's "
             "environment, so ~/.ssh/config, agents and ProxyJump apply.",
    )
    ssh_options = List(
        Unicode(), config=True,
        help="Arguments added to every ssh:// connection, before the destination (e.g. -F CONFIG, -i KEY).",
    )
    docker_command = Unicode(
        "docker", config=True,
        help="The docker client docker:// placements run (words, as a shell splits them), with the kernel's "
             "environment, so DOCKER_HOST and docker contexts apply (podman's Docker-compatible socket too).",
    )
    docker_options = List(
        Unicode(), config=True,
        help="Arguments added to every docker:// container's `docker run`, before the image (e.g. --gpus=all, "
             "--volume=/data:/data:ro, --shm-size=1g); the spec's own options come after them.",
    )
    srun_command = Unicode(
        "srun", config=True,
        help="The srun slurm:// placements run (words, as a shell splits them), with the kernel's environment "
             "(SLURM_CONF, an allocation's SLURM_JOB_ID: srun then makes a step of it).",
    )
    slurm_options = List(
        Unicode(), config=True,
        help="Arguments added to every slurm:// job's srun (e.g. --time=8:00:00, --mem=16G, --gpus=1, "
             "--account=ACCOUNT); the spec's own options come after them.",
    )
    memory_limit = Unicode(
        "", config=True,
        help="The most memory each generation's worker may allocate (bytes, or 512M, 8G; empty = no "
             "limit), on local, python:, ssh:// and slurm:// placements: set as the worker's RLIMIT_DATA before ipykernel "
             "starts, so an allocation past it raises MemoryError in the cell and the namespace survives. "
             "Per process (each child inherits its own), private writable memory only (thread stacks "
             "count; mapped files do not); the prelaunched first worker is not used. Where the system does "
             "not enforce RLIMIT_DATA (macOS), klbr's memory samples do: a worker found past it is ended. On "
             "docker:// it is the container's limit (docker run --memory), and a kernel the engine kills for "
             "it ends WorkerLost saying so.",
    )
    poison_after = Int(
        2, config=True,
        help="Refuse code whose worker died under it this many times in a row (0 = never refuse).",
    )

    @validate("memory_limit")
    def _valid_memory_limit(self, proposal: Bunch) -> str:
        value: str = proposal["value"]
        try:
            parse_size(value or 0)
        except ValueError as e:
            why = f"Supervisor.memory_limit: {e}"
            raise TraitError(why) from None
        return value

    @validate("standby_idle_timeout", "standby_delay")
    def _not_negative(self, proposal: Bunch) -> float:
        value: float = proposal["value"]
        if not 0 <= value < math.inf:
            why = f"Supervisor.{proposal['trait'].name}: {value:g} is not a number of seconds, 0 or more"
            raise TraitError(why)
        return value

    @property
    def memory_limit_bytes(self) -> int | None:
        """`memory_limit` in bytes; None for no limit."""
        return parse_size(self.memory_limit or 0) or None

    # The placement generations run on now: `placement` parsed, then wherever `relocate` moved the
    # session (set by the `Supervisor`).
    where: Placement

    @property
    def standby_on(self) -> bool:
        """`standby` as configured, else whether the current placement's kind keeps a spare by default."""
        return self.standby if self.standby is not None else kind_for(self.where, self.worker_kernel).warm

    # The user's options for the workers (``--Class.trait=value``, from the kernel's command line:
    # `klbr_kernel.options`), which every generation's worker gets after klbr's own.
    worker_options: tuple[str, ...] = ()

    @property
    def worker_args(self) -> tuple[str, ...]:
        """What klbr itself adds to its ipykernel workers' command line, after the session id and
        before `worker_options`: IPython's history, as configured and as those options say, and
        whether its bootstrap keeps debugpy out (`debugger`)."""
        return (*history_args(self.worker_options, self.ipython_history), *debugger_args(self.debugger))

    @property
    def engines(self) -> Engines:
        """The docker and srun commands and their options, as `docker://` and `slurm://` launches take them."""
        return Engines(split(self.docker_command, "docker"), list(self.docker_options),
                       split(self.srun_command, "srun"), list(self.slurm_options))

    @property
    def ssh(self) -> tuple[list[str], list[str]]:
        """ssh's command and the options added to it, as `ssh://` launches and checks take them."""
        return split(self.ssh_command), list(self.ssh_options)
