"""The `klbr-kernel` command: install the kernelspec, and read the cell log."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

COMMANDS = ("install", "sessions", "cells", "show", "export", "prune")


def _db_path(args: argparse.Namespace) -> str:
    if args.db:
        return args.db
    from klbr_supervisor.store import Store

    return Store().path


def _open(args: argparse.Namespace, write: bool = False) -> sqlite3.Connection:
    from klbr_supervisor.store.queries import connect

    path = _db_path(args)
    try:
        return connect(path, write=write)
    except sqlite3.Error as e:
        sys.exit(f"klbr-kernel: cannot open the cell log {path}: {e}")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for line in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())


def _short(text: str | None, width: int = 60) -> str:
    text = (text or "").strip().replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _install(args: argparse.Namespace) -> int:
    from .install import install

    prefix = sys.prefix if args.sys_prefix else args.prefix
    dest = install(user=args.user, prefix=prefix, name=args.name, display_name=args.display_name)
    print(f"Installed kernelspec {args.name} in {dest}")
    return 0


def _sessions(args: argparse.Namespace) -> int:
    from klbr_supervisor.store.queries import sessions

    rows = sessions(_open(args), args.limit)
    _table([[r["id"], r["notebook"] or "-", r["started"][:19].replace("T", " "), r["ended"] and "ended" or "open",
             r["cells"], r["last_status"] or "-"] for r in rows],
           ["id", "notebook", "started (UTC)", "state", "cells", "last status"])
    return 0


def _cells(args: argparse.Namespace) -> int:
    from klbr_supervisor.store.queries import cells

    rows = cells(_open(args), args.session, args.status, args.limit)
    _table([[r["id"], r["execution_count"] if r["execution_count"] is not None else "-", r["generation"] or "-",
             r["status"], _short(r["code"]), _short(r["error"], 50)] for r in rows],
           ["id", "In", "gen", "status", "code", "error"])
    return 0


def _show(args: argparse.Namespace) -> int:
    from klbr_supervisor.store.queries import cell

    row, outputs = cell(_open(args), args.cell)
    if row is None:
        print(f"klbr-kernel: no cell {args.cell}", file=sys.stderr)
        return 1
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
    return 0


def _export(args: argparse.Namespace) -> int:
    from klbr_supervisor.store.queries import export_notebook, write_notebook

    try:
        nb = export_notebook(_open(args), args.session)
    except LookupError as e:
        print(f"klbr-kernel: {e}", file=sys.stderr)
        return 1
    write_notebook(nb, args.output)
    print(f"Wrote {len(nb['cells'])} cells of session {args.session} to {args.output}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from klbr_supervisor.store.queries import prune

    n = prune(_open(args, write=True), args.older_than)
    print(f"Pruned {n} ended session(s) older than {args.older_than:g} days")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="klbr-kernel", description="The klbr Jupyter kernel and its cell log.")
    sub = p.add_subparsers(dest="command", required=True)

    inst = sub.add_parser("install", help="install the klbr kernelspec for this interpreter")
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into this environment (sys.prefix)")
    where.add_argument("--prefix", help="install under this prefix")
    inst.add_argument("--name", default="klbr", help="kernelspec name (default: klbr)")
    inst.add_argument("--display-name", help='display name (default: "Python 3 (klbr)")')
    inst.set_defaults(run=_install)

    def log_command(name: str, help: str, run) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help)
        cmd.add_argument("--db", help="the cell log (default: $KLBR_DB or <jupyter data dir>/klbr/klbr.sqlite3)")
        cmd.set_defaults(run=run)
        return cmd

    ls = log_command("sessions", "list recorded sessions, newest first", _sessions)
    ls.add_argument("--limit", type=int, default=50)
    cl = log_command("cells", "list a session's cells", _cells)
    cl.add_argument("session", type=int)
    cl.add_argument("--status", help="only cells with this status (ok, error, lost, unknown, ...)")
    cl.add_argument("--limit", type=int, help="only the last N cells")
    sh = log_command("show", "a cell's code and recorded outputs", _show)
    sh.add_argument("cell", type=int)
    ex = log_command("export", "write a session as a notebook with its recorded outputs", _export)
    ex.add_argument("session", type=int)
    ex.add_argument("-o", "--output", required=True, help="the .ipynb to write")
    pr = log_command("prune", "delete ended sessions older than some days", _prune)
    pr.add_argument("--older-than", type=float, required=True, metavar="DAYS")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.exit(args.run(args))
