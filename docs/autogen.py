"""Writes the generated tables of the manual from the traitlets classes' own help.

Run by `make docs`, and in memory by tests/test_docs.py, which fails when a committed page differs
from what this writes. docs/configuration.md gets one row per configurable trait of klbr's classes
(its name, what traitlets says its value is, its default and its `help=`); docs/cli.md one row per
option of each `klbr-kernel` command (from the command's aliases and flags). So a new option, a
changed default or a better help text reaches the manual by running this, never by editing a table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from jupyter_core.application import base_aliases, base_flags
from traitlets import HasTraits, TraitType

from klbr_kernel.app import KlbrKernelApp
from klbr_kernel.cli.commands import KlbrKernelCommand
from klbr_supervisor.host import HostService
from klbr_supervisor.store import Store
from klbr_supervisor.supervisor import Supervisor

DOCS = Path(__file__).parent
START, END = "<!-- autogen:start -->", "<!-- autogen:end -->"
COMMAND = "make docs"  # what a stale page says to run


def _markdown(text: str) -> str:
    """`text` in a table cell: on one line, pipes escaped, `<...>` outside code spans kept as text."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _default(cls: type[HasTraits], name: str, trait: TraitType) -> str:
    # traitlets keeps a class's `@default` methods here: a value computed when an instance is made
    # (from the environment, the Jupyter paths), which the help says in words.
    if name in cls._trait_default_generators:
        return "computed"
    return f"`{trait.default_value_repr()}`"


def _own(cls: type[HasTraits]) -> dict[str, TraitType]:
    """The configurable traits klbr declares on `cls` or its own bases, in the order they are
    declared; those it inherits from Jupyter's application (`log_level`, `config_file`, ...) are
    documented by `--help-all`."""
    configurable = cls.class_traits(config=True)
    ours = [base for base in reversed(cls.__mro__) if base.__module__.startswith("klbr_")]
    return {name: configurable[name] for base in ours for name in vars(base) if name in configurable}


def _dashed(alias: str) -> str:
    return f"`{'-' if len(alias) == 1 else '--'}{alias}`"


def configuration() -> str:
    """docs/configuration.md's table: what `jupyter_klbr_config.py` and the kernel's command line set."""
    rows = ["| option | value | default | meaning |", "|---|---|---|---|"]
    for cls in (Supervisor, Store, HostService, KlbrKernelApp):
        for name, trait in _own(cls).items():
            option = f"{cls.__name__}.{name}"
            aliases = "".join(f" ({_dashed(a)})" for a, target in getattr(cls, "aliases", {}).items()
                              if target == option)
            rows.append(f"| `{option}`{aliases} | {_markdown(trait.info())} | {_default(cls, name, trait)} "
                        f"| {_markdown(trait.help)} |")
    return "\n".join(rows) + "\n"


def cli() -> str:
    """docs/cli.md's table: each `klbr-kernel` command's own options (not Jupyter's common ones),
    one row per setting, with every command and spelling that reaches it."""
    rows: dict[str, dict] = {}  # what an option sets -> its row
    for command, (cls, _) in KlbrKernelCommand.subcommands.items():
        classes = {c.__name__: c for c in (cls, *cls.classes)}
        for alias, target in cls.aliases.items():
            if alias in base_aliases:
                continue
            owner, name = target.split(".")
            trait = classes[owner].class_traits()[name]
            row = rows.setdefault(target, {"commands": [], "options": [], "value": _markdown(trait.info()),
                                           "default": _default(classes[owner], name, trait),
                                           "help": _markdown(trait.help)})
            for key, value in (("commands", command), ("options", _dashed(alias))):
                if value not in row[key]:
                    row[key].append(value)
        for flag, (_, help_text) in cls.flags.items():
            if flag not in base_flags:
                rows[f"{command} --{flag}"] = {"commands": [command], "options": [_dashed(flag)], "value": "a flag",
                                               "default": "off", "help": _markdown(help_text)}
    lines = ["| command | option | value | default | meaning |", "|---|---|---|---|---|"]
    for row in rows.values():
        lines.append(f"| {', '.join(row['commands'])} | {', '.join(row['options'])} | {row['value']} "
                     f"| {row['default']} | {row['help']} |")
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {"configuration.md": configuration, "cli.md": cli}


def render(page: str, table: str) -> str:
    """`page` with `table` between its markers."""
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"


def main() -> None:
    for name, table in PAGES.items():
        path = DOCS / name
        page = path.read_text()
        new = render(page, table())
        if new != page:
            path.write_text(new)
            print(f"wrote the generated table of {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
