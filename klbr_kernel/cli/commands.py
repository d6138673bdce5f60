"""The `klbr-kernel` command: install the kernelspec, and read the cell log.

A Jupyter application with subcommands, as `jupyter kernelspec` is. The cell-log commands load the
kernel's own configuration (`jupyter_klbr_config.py` on the Jupyter config path) and take the same
options, so they read the database the kernel writes: `c.Store.path` there, and `$KLBR_DB` over it,
as in the kernel; `--Store.path=` (or `--db`) on the command line wins over both.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
from collections.abc import Sequence
from typing import NoReturn

from jupyter_core.application import JupyterApp, base_aliases, base_flags
from traitlets import Bool, Float, Int, Unicode, default

from klbr_supervisor.boot.placement import PlacementError, parse
from klbr_supervisor.store import Store, queries

from .. import unsupported
from .._version import __version__
from .install import install


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for line in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


def _short(text: str | None, width: int = 60) -> str:
    text = (text or "").strip().replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


class KlbrCommand(JupyterApp):
    """What every `klbr-kernel` command shares: the kernel's config file and its version."""

    version = __version__

    @default("config_file_name")
    def _config_file_name_default(self) -> str:
        return "jupyter_klbr_config"  # the kernel's (see `klbr_kernel.app`)

    def exit(self, exit_status: int | str | None = 0) -> NoReturn:
        """`Application.exit`, typed as what it does (traitlets' says it returns None): it raises SystemExit."""
        super().exit(exit_status)
        raise SystemExit(exit_status)  # not reached

    def positional(self, what: str) -> int:
        """The one positional argument, a number; a clear usage error otherwise."""
        if len(self.extra_args) != 1:
            self._usage(f"{self.name} needs exactly one {what}")
        try:
            return int(self.extra_args[0])
        except ValueError:
            self._usage(f"{what} must be a number, not {self.extra_args[0]!r}")

    def _usage(self, why: str) -> NoReturn:
        print(f"{why}\nSee `{self.name} --help`.", file=sys.stderr)
        self.exit(2)


class LogCommand(KlbrCommand):
    """A command that reads (or prunes) the cell log the kernel writes."""

    classes = [Store]
    aliases = {**base_aliases, "db": "Store.path"}
    flags = base_flags

    def connect(self, write: bool = False) -> sqlite3.Connection:
        # On the command line, the path wins over $KLBR_DB (which wins over config files, as in the kernel).
        given = self.cli_config.get("Store", {}).get("path")
        path = given or Store(parent=self).path
        try:
            return queries.connect(path, write=write)
        except sqlite3.Error as e:
            print(f"klbr-kernel: cannot open the cell log {path}: {e}", file=sys.stderr)
            self.exit(1)


class SessionsCommand(LogCommand):
    name = "klbr-kernel sessions"
    description = "List recorded sessions, newest first."
    limit = Int(50, config=True, help="Show at most this many sessions.")
    aliases = {**LogCommand.aliases, "limit": "SessionsCommand.limit"}

    def start(self) -> None:
        rows = queries.sessions(self.connect(), self.limit)
        _table([[r["id"], r["notebook"] or "-", r["started"][:19].replace("T", " "), (r["ended"] and "ended") or "open",
                 r["cells"], r["last_status"] or "-"] for r in rows],
               ["id", "notebook", "started (UTC)", "state", "cells", "last status"])


class CellsCommand(LogCommand):
    name = "klbr-kernel cells"
    description = "List a session's cells: klbr-kernel cells SESSION [--status STATUS] [--limit N]"
    status = Unicode("", config=True, help="Only cells with this status (ok, error, lost, unknown, ...).")
    limit = Int(0, config=True, help="Only the last N cells (0: all).")
    aliases = {**LogCommand.aliases, "status": "CellsCommand.status", "limit": "CellsCommand.limit"}

    def start(self) -> None:
        session = self.positional("SESSION")
        rows = queries.cells(self.connect(), session, self.status or None, self.limit or None)
        _table([[r["id"], r["execution_count"] if r["execution_count"] is not None else "-", r["generation"] or "-",
                 r["status"], _short(r["code"]), _short(r["error"], 50)] for r in rows],
               ["id", "In", "gen", "status", "code", "error"])


class ShowCommand(LogCommand):
    name = "klbr-kernel show"
    description = "A cell's code and recorded outputs: klbr-kernel show CELL"

    def start(self) -> None:
        cell_id = self.positional("CELL")
        row, outputs = queries.cell(self.connect(), cell_id)
        if row is None:
            print(f"klbr-kernel: no cell {cell_id}", file=sys.stderr)
            self.exit(1)
        print(f"cell {row['id']}  session {row['session_id']}  In[{row['execution_count']}]  generation "
              f"{row['generation']}  {row['status']}  {row['started']} → {row['finished'] or '…'}")
        if row["error"]:
            print(f"error: {row['error']}")
        print("--- code")
        print(row["code"])
        for out in outputs:
            content = json.loads(out["content"])
            print(f"--- {out['msg_type']}")
            if out["msg_type"] == "stream":
                print(content.get("text", ""), end="")
            elif out["msg_type"] == "error":
                print(f"{content.get('ename')}: {content.get('evalue')}")
            else:
                data = content.get("data", {})
                print(data.get("text/plain", ", ".join(data) or json.dumps(content)[:200]))
        if row["outputs_truncated"]:
            print(f"--- (outputs past the per-cell limit were not kept; {row['output_bytes']} bytes in all)")


class ExportCommand(LogCommand):
    name = "klbr-kernel export"
    description = "Write a session as a notebook with its recorded outputs: klbr-kernel export SESSION -o OUT.ipynb"
    output = Unicode("", config=True, help="The .ipynb to write.")
    aliases = {**LogCommand.aliases, "o": "ExportCommand.output", "output": "ExportCommand.output"}

    def start(self) -> None:
        session = self.positional("SESSION")
        if not self.output:
            self._usage("klbr-kernel export needs -o OUT.ipynb")
        try:
            nb = queries.export_notebook(self.connect(), session)
        except LookupError as e:
            print(f"klbr-kernel: {e}", file=sys.stderr)
            self.exit(1)
        queries.write_notebook(nb, self.output)
        print(f"Wrote {len(nb['cells'])} cells of session {session} to {self.output}")


class PruneCommand(LogCommand):
    name = "klbr-kernel prune"
    description = "Delete ended sessions older than some days: klbr-kernel prune --older-than DAYS"
    older_than = Float(-1.0, config=True, help="Delete sessions that ended more than this many days ago.")
    aliases = {**LogCommand.aliases, "older-than": "PruneCommand.older_than"}

    def start(self) -> None:
        if self.older_than < 0:
            self._usage("klbr-kernel prune needs --older-than DAYS")
        n = queries.prune(self.connect(write=True), self.older_than)
        print(f"Pruned {n} ended session(s) older than {self.older_than:g} days")


class InstallCommand(KlbrCommand):
    name = "klbr-kernel install"
    description = "Install the klbr kernelspec for this interpreter (with KernelSpecManager)."
    user = Bool(False, config=True, help="Install for the current user.")
    sys_prefix = Bool(False, config=True, help="Install into this environment (sys.prefix).")
    prefix = Unicode("", config=True, help="Install under this prefix.")
    kernel_name = Unicode("klbr", config=True, help="The kernelspec's name.")
    display_name = Unicode("", config=True, help='The display name (default: "Python 3 (klbr)").')
    placement = Unicode("", config=True, help="Where its sessions run (Supervisor.placement), as "
                        "ssh://gpu-box/usr/bin/python3, docker://IMAGE or slurm://PARTITION; written into the "
                        "kernelspec's command line.")
    debugger = Bool(True, config=True, help="Whether its workers have ipykernel's debugger (Supervisor.debugger); "
                    "off, --Supervisor.debugger=False goes on the kernelspec's command line and its metadata "
                    "says no debugger (JupyterLab then shows no debugger toggle).")
    aliases = {**base_aliases, "prefix": "InstallCommand.prefix", "name": "InstallCommand.kernel_name",
               "display-name": "InstallCommand.display_name", "placement": "InstallCommand.placement"}
    flags = {
        **base_flags,
        "user": ({"InstallCommand": {"user": True}}, "Install for the current user."),
        "sys-prefix": ({"InstallCommand": {"sys_prefix": True}}, "Install into this environment (sys.prefix)."),
        "no-debugger": ({"InstallCommand": {"debugger": False}},
                        "Workers without ipykernel's debugger (--Supervisor.debugger=False): JupyterLab shows no debugger toggle, and debugpy never loads."),
    }

    def start(self) -> None:
        if sum([self.user, self.sys_prefix, bool(self.prefix)]) > 1:
            self._usage("--user, --sys-prefix and --prefix exclude each other")
        if self.placement:
            try:
                parse(self.placement)
            except PlacementError as e:
                self._usage(str(e))
        prefix = sys.prefix if self.sys_prefix else (self.prefix or None)
        dest = install(user=self.user, prefix=prefix, name=self.kernel_name, display_name=self.display_name or None,
                       placement=self.placement, debugger=self.debugger)
        print(f"Installed kernelspec {self.kernel_name} in {dest}")


class KlbrKernelCommand(KlbrCommand):
    name = "klbr-kernel"
    description = "The klbr Jupyter kernel and its cell log."
    subcommands = {
        "install": (InstallCommand, InstallCommand.description),
        "sessions": (SessionsCommand, SessionsCommand.description),
        "cells": (CellsCommand, CellsCommand.description),
        "show": (ShowCommand, ShowCommand.description),
        "export": (ExportCommand, ExportCommand.description),
        "prune": (PruneCommand, PruneCommand.description),
    }

    def start(self) -> None:
        if self.subapp is None:
            self.print_subcommands()
            print(f"\n{self.name}: a command is required", file=sys.stderr)
            self.exit(2)
        self.subapp.start()


def main(argv: list[str] | None = None) -> None:
    if sys.platform == "win32":
        unsupported.refuse_command()
    else:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `klbr-kernel show 7 | head` ends quietly
        KlbrKernelCommand.launch_instance(argv)
