"""The `klbr-kernel` command."""

from __future__ import annotations

import argparse
import sys

COMMANDS = ("install",)


def _install(args: argparse.Namespace) -> int:
    from .install import install

    prefix = sys.prefix if args.sys_prefix else args.prefix
    dest = install(user=args.user, prefix=prefix, name=args.name, display_name=args.display_name)
    print(f"Installed kernelspec {args.name} in {dest}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="klbr-kernel", description="The klbr Jupyter kernel.")
    sub = p.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install the klbr kernelspec for this interpreter")
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into this environment (sys.prefix)")
    where.add_argument("--prefix", help="install under this prefix")
    inst.add_argument("--name", default="klbr", help="kernelspec name (default: klbr)")
    inst.add_argument("--display-name", help='display name (default: "Python 3 (klbr)")')
    inst.set_defaults(run=_install)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.exit(args.run(args))
