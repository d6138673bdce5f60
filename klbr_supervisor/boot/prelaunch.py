"""Starting the default worker before the proxy's own imports, and handing it over afterwards.

Importing jupyter_client alone costs 120-300 ms here; the worker (ipykernel) takes longer still to
start. `start` runs first thing in `python -m klbr_kernel`, with the standard library only: it writes
the first generation's connection file and spawns ipykernel on this interpreter, so worker and
proxy start in parallel. What it started (`early.Prelaunched`) is handed down, app -> proxy -> supervisor
-> generation 1's target, which adopts the process through jupyter_client
(`targets.local.PrelaunchedProvisioner`), so the generation is managed like any other. A
configuration that asks for another worker discards it; so does the exit of a kernel that never got
that far.

With ``--Supervisor.placement=ssh://…`` on the command line (a kernelspec for a remote machine), it
starts that generation's ssh instead (`EarlySsh`, see `ssh_launch`): connecting, and the remote
kernel's own start, overlap the proxy's imports as a local worker's start does; `targets.ssh`
adopts it. So with ``docker://…`` and its ``docker run`` (`EarlyDocker`, see `docker_launch`),
which `targets.docker` adopts.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys

from .early import Early, EarlyAgent, EarlyDocker, EarlySsh, Prelaunched, leave_nothing

# Imports here are the few the spawn needs (no dataclasses, tempfile, uuid, ctypes): each ms before
# the spawn is a ms on the first cell. Not even typing: mypy reads this name as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

# Options that choose a different first worker: no prelaunch when they are on the command line.
_OTHER_WORKER = ("Supervisor.worker_kernel", "Supervisor.placement", "Supervisor.ipython_history")
# What an ipykernel worker is started with unless `Supervisor.ipython_history` is on, or the user's
# own worker options say what IPython's history is (`history_args`): no IPython history database.
# The cell log is the history; In, _ih, %history and %rerun still work in memory.
NO_IPYTHON_HISTORY = ("--HistoryManager.enabled=False",)
# What an ipykernel worker klbr starts is given with `Supervisor.debugger` off: its bootstrap takes it
# off the command line and keeps debugpy out (`bootstrap.keep_debugger_out`, which says the same word:
# nothing is imported here before the spawn). In traitlets' form, under a section no ipykernel class
# has, so an ipykernel that is not klbr's bootstrap (a kernelspec's) ignores it.
NO_DEBUGGER = ("--KlbrWorker.debugger=False",)
# The traitlets sections of klbr's own classes (and of the classes they derive from), and the names of
# the app's flags and aliases: what the kernel's command line says to these is klbr's, the rest is
# the workers' (`klbr_kernel.options`). Written out here because nothing may be imported before the
# spawn; tests/test_worker_options.py checks them against the app.
KLBR_SECTIONS = frozenset({
    "KlbrKernelApp", "JupyterApp", "Application", "SingletonConfigurable", "LoggingConfigurable",
    "Configurable", "HasTraits", "HasDescriptors", "Supervisor", "SupervisorSettings", "Store",
    "HostService", "Session"})
KLBR_NAMES = frozenset({"debug", "show-config", "show-config-json", "generate-config", "y", "log-level",
                        "config", "f"})


def worker_options(argv: list[str]) -> list[str] | None:
    """The options for the workers on this command line, as the proxy will read them with traitlets
    (`klbr_kernel.options`): each ``--Class.trait=value`` of a class not klbr's, in the same order.
    None when there is anything else the prelaunch does not read (an ipykernel flag or alias, a value
    after a space): the first worker then waits for the proxy, which reads them."""
    found = []
    for arg in argv:
        if arg == "--":
            break
        if not arg.startswith("-"):
            continue  # a value (of -f, of one of klbr's options), or a word traitlets leaves aside
        name, eq, _ = arg.lstrip("-").partition("=")
        if name in KLBR_NAMES or name.split(".", 1)[0] in KLBR_SECTIONS:
            continue
        if not (arg.startswith("--") and eq and "." in name):
            return None
        found.append(arg)
    return sorted(found, key=lambda option: option.partition("=")[0])


def history_args(options: Iterable[str], keep_history: bool = False) -> tuple[str, ...]:
    """What klbr adds to an ipykernel worker's command line about IPython's history, given the user's
    worker `options` (``--Class.trait=value``): `NO_IPYTHON_HISTORY`, unless history is kept
    (`Supervisor.ipython_history`) or the user says what it is. ``HistoryManager.enabled`` said by the
    user replaces klbr's; so does a ``hist_file`` that names a database, which the user expects to be
    written. ``hist_file=:memory:`` alone (what nbclient passes, so that no two kernels share a
    sqlite file) keeps klbr's: no database at all, which is what it asks for, and the in-session
    history works the same."""
    for option in options:
        name, _, text = option[2:].partition("=")
        section, _, trait = name.rpartition(".")
        if section in ("HistoryManager", "HistoryAccessor") and (
                trait == "enabled" or (trait == "hist_file" and text.strip("'\"") != ":memory:")):
            return ()
    return () if keep_history else NO_IPYTHON_HISTORY


def debugger_args(debugger: bool) -> tuple[str, ...]:
    """What klbr adds to an ipykernel worker's command line about its debugger: `NO_DEBUGGER` when
    `Supervisor.debugger` is off."""
    return () if debugger else NO_DEBUGGER


def debugger_given(argv: list[str]) -> bool | None:
    """`--Supervisor.debugger` as the command line says it (True when it does not), as traitlets
    reads a Bool; None when it is said more than once or not as true/false/1/0 (the app's to read
    and report)."""
    given = values(argv, "Supervisor.debugger")
    if not given:
        return True
    if len(given) > 1 or given[0].lower() not in ("true", "false", "1", "0"):
        return None
    return given[0].lower() in ("true", "1")


def host_environ(runtime_dir: str) -> dict[str, str]:
    """A generation's host channel credentials, as its worker finds them in its environment."""
    return {"KLBR_HOST_ENDPOINT": host_endpoint(runtime_dir),
            "KLBR_HOST_TOKEN": os.urandom(16).hex(), "KLBR_HOST_KEY": os.urandom(32).hex()}


def host_endpoint(runtime_dir: str) -> str:
    """The host channel's socket, alone in a directory of its own (made here, 0700), which a
    container mounts: a socket file mounted before it is bound would be made a directory by docker,
    and a ``docker run`` started early (`EarlyDocker`) comes before the channel binds."""
    path = os.path.join(runtime_dir, "channel")
    os.makedirs(path, 0o700, exist_ok=True)
    return f"ipc://{os.path.join(path, 'host')}"


def worker_command(connection_file: str, *args: str) -> list[str]:
    """The default worker: ipykernel on this interpreter, armed to die with this process (see
    `klbr_supervisor.boot.worker`)."""
    return [sys.executable, "-m", "klbr_supervisor.boot.worker", str(os.getpid()), "-f", connection_file, *args]


def _private_dir() -> str:
    """A new 0700 directory in the temp dir, as tempfile.mkdtemp(prefix="klbr-") makes."""
    # /tmp is tempfile's last resort too; the directory is 0700 and a fresh name.
    base = os.environ.get("TMPDIR") or os.environ.get("TEMP") or os.environ.get("TMP") or "/tmp"  # noqa: S108
    while True:
        path = os.path.join(base, "klbr-" + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def new_id() -> str:
    """A random session id in uuid4's shape."""
    h = bytearray(os.urandom(16))
    h[6] = (h[6] & 0x0F) | 0x40
    h[8] = (h[8] & 0x3F) | 0x80
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def connection_problem(info: object) -> str | None:
    """Why a connection file (as JSON read) cannot be served, or None: not an object, a key that is
    not text, a port that is no port number, a scheme that cannot sign."""
    if not isinstance(info, dict):
        return "it is not a JSON object"
    if not isinstance(info.get("key", ""), str):
        return "its key is not a string"
    for name in PORTS:
        port = info.get(name, 0)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            return f"its {name} {port!r} is not a port number"
    return signature_problem(info)


def signature_problem(info: dict[str, Any]) -> str | None:
    """Why the connection file's `signature_scheme` cannot sign messages, or None. Jupyter's schemes
    are ``hmac-<hash>`` (hmac-sha256 by default); anything else is refused, never guessed at."""
    scheme = info.get("signature_scheme", "hmac-sha256")
    if not isinstance(scheme, str) or not scheme.startswith("hmac-"):
        return f"signature_scheme {scheme!r} is not hmac-<hash> (as hmac-sha256)"
    import hashlib  # noqa: PLC0415 — only here: a bad file is rare, and the spawn below waits for no import

    if scheme[5:] not in hashlib.algorithms_available:
        return f"signature_scheme {scheme!r} names a hash this Python does not have"
    return None


def connection_file_arg(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("-f", "--f") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("-f=", "--f=")):
            return arg.split("=", 1)[1]
    return None


def values(argv: list[str], name: str) -> list[str]:
    """Every value option `--name` has on the command line (``--name=V`` or ``--name V``), in order,
    as traitlets reads a text: ``~`` expanded, one pair of surrounding quotes taken off."""
    found = []
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            found.append(arg.split("=", 1)[1])
        elif arg == f"--{name}" and i + 1 < len(argv):
            found.append(argv[i + 1])
    found = [os.path.expanduser(v) for v in found]
    return [v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v for v in found]


def start(argv: list[str], client: dict[str, str] | None = None) -> Early | None:
    """Called first by `python -m klbr_kernel -f FILE`: spawn generation 1 if it will be the default,
    or its ssh or docker run if the command line names an ssh:// or docker:// placement (its agent
    places the host `client`'s files there); what was started, for the app to hand down (None: nothing was, and the supervisor
    starts generation 1 itself)."""
    path = connection_file_arg(argv)
    spec = (values(argv, "Supervisor.placement") or [""])[-1]
    agent = spec.startswith(("ssh://", "docker://"))  # a placement whose first command starts early too
    other = [opt for opt in _OTHER_WORKER if not (opt == "Supervisor.placement" and agent)]
    if path is None or any(opt in arg for arg in argv for opt in other) or os.environ.get("KLBR_NO_PRELAUNCH"):
        return None
    options = worker_options(argv)
    debugger = debugger_given(argv)
    if options is None or debugger is None:
        return None  # options for the worker that only the proxy reads: it starts the first one itself
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None  # the app reports a bad connection file properly
    if connection_problem(info):
        return None  # the app refuses to start, and says why
    try:
        runtime = _private_dir()
    except OSError:
        return None  # no usable temp dir here: the supervisor starts the worker itself (tempfile looks further)
    # The proxy's session id from now on (see `klbr_kernel.frontend.standin`), so its worker's headers need no rewrite.
    session_id = new_id()
    # After -f FILE, as `SupervisorSettings.worker_args` orders them (`Prelaunched.matches` compares).
    args = [f"--Session.session={session_id}", *history_args(options), *debugger_args(debugger), *options]
    if spec:
        early = _start_agent(argv, info, runtime, session_id, args, client or {})
        if early is not None:
            atexit.register(early.discard, at_exit=True)  # for a kernel that never gets as far as adopting it
        return early
    worker = {
        "transport": "ipc", "ip": os.path.join(runtime, "gen1"),
        "shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
        "key": info.get("key", ""), "signature_scheme": info.get("signature_scheme", "hmac-sha256"),
        "kernel_name": "",
    }
    conn = os.path.join(runtime, "worker-1.json")
    with open(os.open(conn, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump(worker, f)
    host = host_environ(runtime)
    process = subprocess.Popen(  # noqa: S603 — this interpreter and boot.worker, no shell
        worker_command(conn, *args), stderr=subprocess.PIPE, start_new_session=True, env={**os.environ, **host})
    prelaunched = Prelaunched(process, runtime, conn, session_id, host, args)
    atexit.register(prelaunched.discard, at_exit=True)  # for a kernel that never gets as far as adopting it
    return prelaunched


def _start_agent(argv: list[str], info: dict[str, Any], runtime: str, session_id: str, args: list[str],
                 client: dict[str, str]) -> EarlyAgent | None:
    """The first generation's ssh or ``docker run``, as the command line's placement says; its kernel
    is started with `args` and the host channel."""
    # Agents only: the local spawn waits for none of these.
    from . import docker_launch, ssh_launch  # noqa: PLC0415
    from .agent_launch import LINK_TIMEOUT  # noqa: PLC0415
    from .placement import PlacementError, parse  # noqa: PLC0415

    engine = "docker" if (values(argv, "Supervisor.placement") or [""])[-1].startswith("docker://") else "ssh"
    given = {name: values(argv, f"Supervisor.{name}") for name in ("placement", f"{engine}_command", "link_timeout")}
    options = values(argv, f"Supervisor.{engine}_options")
    if any(len(v) > 1 for v in given.values()) or (len(options) == 1 and options[0][:1] in "[("):
        leave_nothing(None, runtime)  # what traitlets refuses, or reads as a Python literal: the app's to read
        return None
    host = host_environ(runtime)
    try:
        started = (parse(given["placement"][0]), ssh_launch.split((given[f"{engine}_command"] or [engine])[0], engine),
                   options, float(given["link_timeout"][0]) if given["link_timeout"] else LINK_TIMEOUT)
        key, scheme = os.urandom(32).hex(), info.get("signature_scheme", "hmac-sha256")
        early: EarlyAgent
        if engine == "docker":
            docker = docker_launch.Launch(*started, runtime, 1, key, scheme, args)
            docker.host_channel, docker.client = host, client
            early = EarlyDocker(docker, docker.spawn(), runtime, session_id)
        else:
            ssh = ssh_launch.Launch(*started, os.path.join(runtime, "ssh1"), key, scheme, args)
            ssh.host_channel, ssh.client = host, client
            early = EarlySsh(ssh, ssh.spawn(), runtime, session_id)
    except (PlacementError, ValueError, OSError):
        leave_nothing(None, runtime)
        return None  # the supervisor starts it, and says what is wrong
    early.host_channel = host  # the supervisor's channel admits it
    return early
