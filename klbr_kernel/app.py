"""`python -m klbr_kernel -f CONNECTION_FILE`: the kernel process Jupyter starts.

Configuration is traitlets, the Jupyter convention: ``--Supervisor.cell_timeout=600`` on the command
line, or ``jupyter_klbr_config.py`` anywhere on the Jupyter config path. Options on the command line
for any other class (IPython's, ipykernel's: ``--InteractiveShell.ast_node_interactivity=all``,
``--pylab``) go to every worker (see `options`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shlex
import signal
import typing as t

from jupyter_client.session import Session
from jupyter_core.application import JupyterApp, base_aliases
from traitlets import Any, Bunch, Int, TraitError, Unicode, default, validate

from klbr_supervisor.boot import prelaunch
from klbr_supervisor.boot.early import Early
from klbr_supervisor.host import HostService
from klbr_supervisor.store import Store
from klbr_supervisor.supervisor import Supervisor

from . import options, parent
from ._version import __version__
from .frontend import encryption, kernel_info, standin
from .proxy import Proxy


class KlbrKernelApp(JupyterApp):
    name = "jupyter-klbr"  # so the config file is jupyter_klbr_config.py
    version = __version__
    description = "The klbr proxy kernel: a supervised ipykernel that always answers."
    classes = [Supervisor, Store, HostService]

    connection_file = Unicode("", config=True, help="The connection file the frontend wrote.")
    max_message_size = Int(
        standin.MAX_MESSAGE_SIZE, config=True,
        help="The longest frame, in bytes, the kernel takes on shell, control and stdin (an execute's "
             "code or content is one frame); libzmq disconnects a sender whose frame is longer, and its "
             "request is never answered. -1: no limit. (iopub and the heartbeat take a few KiB.) On the kernel's "
             "command line (the kernelspec's argv) only: the sockets are bound before config files are read, so "
             "a config file's value is reported in the log, not applied.")

    # What `boot.prelaunch` started before the imports (`__main__` hands it over), for generation 1.
    first_worker = Any(None, allow_none=True)

    aliases = {**base_aliases, "f": "KlbrKernelApp.connection_file"}

    @validate("max_message_size")
    def _valid_size(self, proposal: Bunch) -> int:
        value: int = proposal["value"]
        if value != -1 and value < 1 << 20:
            msg = f"max_message_size must be at least 1 MiB (1048576), or -1 for no limit; got {value}"
            raise TraitError(msg)
        return value

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.WARNING

    def own_sections(self) -> frozenset[str]:
        """The config sections that are klbr's: its classes', and the frontend's `Session`'s (the
        proxy's session; a worker's is klbr's to set)."""
        return options.own_sections(type(self), *self.classes, Session)

    def flatten_flags(self) -> tuple[dict[str, t.Any], dict[str, t.Any]]:
        """traitlets' tables for reading the command line (`parse_command_line` calls this first),
        with ipykernel's flags and aliases under klbr's own when the line needs them."""
        flags, aliases = super().flatten_flags()
        if options.names_not_ours(self.argv, flags, aliases):
            their_flags, their_aliases = options.ipykernel_tables()
            flags, aliases = {**their_flags, **flags}, {**their_aliases, **aliases}
        return flags, aliases

    def worker_options(self) -> list[str]:
        """What the command line (as traitlets read it) has for the workers, ``--Class.trait=value``."""
        passed, withheld = options.for_workers(self.cli_config, self.own_sections())
        if withheld:
            self.log.warning("klbr kernel: not passed to workers (klbr sets their connection): %s",
                             shlex.join(withheld))
        return passed

    def _check_frame_cap(self) -> None:
        """The stand-in bound shell, control and stdin with the cap it read from the command line
        itself, before traitlets was imported (`standin.max_message_size`): checked here against what
        traitlets read. A config file's other value comes too late to apply (binding again would lose
        what is in flight), and is reported; a command line read two ways is a bug in klbr, reported
        louder. Either way the sockets keep the cap they were bound with."""
        bound = standin.bound_max_message_size()
        if bound is None or bound == self.max_message_size:
            return
        if "KlbrKernelApp.max_message_size" in self.cli_config:
            self.log.error("klbr kernel: the early front read KlbrKernelApp.max_message_size on the command line as "
                           "%d, traitlets as %d. Shell, control and stdin take frames up to %d bytes.",
                           bound, self.max_message_size, bound)
        else:
            self.log.warning("KlbrKernelApp.max_message_size = %d from a config file is not applied: it takes "
                             "effect on the kernel's command line (the kernelspec's argv). Shell, control and "
                             "stdin take frames up to %d bytes.", self.max_message_size, bound)

    def _log_lines_say_when_and_who(self) -> None:
        """Every line of the kernel's log says when, to the millisecond, and which kernel (its id, as
        the server names it in its own log: the connection file is `kernel-ID.json`, shortened to
        eight characters): a server's log mixes the lines of all its kernels."""
        name = os.path.splitext(os.path.basename(self.connection_file))[0]
        kernel = name.removeprefix("kernel-")[:8].replace("%", "%%")
        when = "%(asctime)s.%(msecs)03d"
        self.log_datefmt = DATE_FORMAT
        self.log_format = f"[%(name)s {when} kernel {kernel}]%(highlevel)s %(message)s"
        formatter = logging.Formatter(f"[klbr {when} kernel {kernel} %(levelname)s %(name)s] %(message)s", DATE_FORMAT)
        for handler in logging.getLogger().handlers:  # klbr's modules' records (`main`'s basicConfig)
            handler.setFormatter(formatter)

    def start(self) -> None:
        # The level on the loggers themselves, so per-cell debug calls build no records at all: the
        # app's, and those of klbr's modules (whose records reach the same stderr through the root).
        level = t.cast(int | str, self.log_level)  # the trait's Enum holds levels and their names
        for logger in (self.log, logging.getLogger("klbr_kernel"), logging.getLogger("klbr_supervisor")):
            logger.setLevel(level)
        if not self.connection_file:
            self.log.critical("klbr kernel: -f CONNECTION_FILE is required")
            self.exit(2)
        self._log_lines_say_when_and_who()
        problem: str | None
        try:
            with open(self.connection_file) as f:
                info = json.load(f)
        except (OSError, ValueError) as e:
            info, problem = None, f"cannot be read ({getattr(e, 'strerror', None) or e})"
        else:
            problem = prelaunch.connection_problem(info) or encryption.problem(info)
        if problem is not None:
            if self.first_worker is not None:
                self.first_worker.discard()  # spawned before the file was checked for encryption
            self.log.critical("klbr kernel: %s: %s; refusing to start", self.connection_file, problem)
            self.exit(2)
        if not info.get("key"):
            self.log.warning("klbr kernel: %s has an empty key: messages are not signed, and anyone who can "
                             "reach its sockets can run code as you. Jupyter writes a key unless told not to.",
                             self.connection_file)
        session = Session(
            key=info.get("key", "").encode(),
            signature_scheme=info.get("signature_scheme", "hmac-sha256"),
            username="kernel",
            parent=self,
        )
        # The session the stand-in's answers and the prelaunched worker already speak as, if any.
        worker = self.first_worker
        session_id = standin.session_id() or (worker.session_id if worker is not None else None)
        if session_id is not None:
            session.session = session_id
        self._check_frame_cap()
        worker_options = self.worker_options()
        if worker_options:
            self.log.info("klbr kernel: every worker gets %s", shlex.join(worker_options))
        try:
            asyncio.run(self._serve(info, session, tuple(worker_options)))
        except* standin.BindError as refused:
            self.log.critical("klbr kernel: %s: %s; refusing to start", self.connection_file, refused.exceptions[0])
            self.exit(2)

    async def _serve(self, info: dict[str, t.Any], session: Session, worker_options: tuple[str, ...]) -> None:
        # jupyter_server names the notebook a kernel serves; the cell log keys history by it.
        proxy = Proxy(info, session, parent=self, notebook=os.environ.get("JPY_SESSION_NAME") or None,
                      max_message_size=self.max_message_size, worker_options=worker_options,
                      first_worker=self.first_worker)
        kernel_info.configure(proxy.supervisor.debugger)  # config files included, before any answer of the proxy's
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, proxy.request_shutdown)
        loop.add_signal_handler(signal.SIGINT, proxy.request_interrupt)
        parent.watch(loop, proxy.request_shutdown)
        # What start-up built lives as long as the kernel: keep it out of every later collection,
        # so a full collection in the middle of a cell walks only what cells allocate. (No collect
        # first: the imports left no garbage, and it would cost 20 ms before the sockets are bound.)
        gc.freeze()
        await proxy.run()


DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def main(first_worker: Early | None = None) -> None:
    """`first_worker`: what `boot.prelaunch.start` started, if anything."""
    logging.basicConfig(level=logging.WARNING, format="[klbr %(levelname)s %(name)s] %(message)s")
    KlbrKernelApp.launch_instance(first_worker=first_worker)
