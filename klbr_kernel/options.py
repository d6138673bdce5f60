"""The kernel's command line, as klbr's and as its workers': which options stay, which go on.

A frontend, nbclient's ``extra_arguments`` or a kernelspec put IPython and ipykernel options on a
kernel's command line as they would for ipykernel: ``--HistoryManager.hist_file=:memory:`` (what
nbclient's own suite passes), ``--InteractiveShell.ast_node_interactivity=all``, ``--pylab``. traitlets
reads the whole line (`KlbrKernelApp.parse_command_line`); what it read for a class klbr configures
(`KlbrKernelApp`, `Supervisor`, `Store`, `HostService`, the frontend's `Session`, and the classes
they derive from) stays klbr's, and every other section goes to each generation's worker, written
back as ``--Class.trait=value`` (`for_workers`). The app's `KlbrKernelApp.flatten_flags` adds
ipykernel's own flags and aliases (``--pylab``, ``--matplotlib=X``, ``--cache-size N``) only when the
line has a name that is not klbr's (`names_not_ours`): importing them costs 50-150 ms of the start.
Called by the app, once, before the supervisor exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_client.connect import ConnectionFileMixin
from traitlets.config import Config
from traitlets.config.loader import DeferredConfigList

# How a worker is reached is klbr's to choose (its connection file, in klbr's runtime directory):
# `--ip=0.0.0.0` and friends, meant for a kernel's own sockets, never reach it.
_CONNECTION_SECTIONS = frozenset({"IPKernelApp", "ConnectionFileMixin"})
_CONNECTION_TRAITS = frozenset(ConnectionFileMixin.class_trait_names(config=True))


def own_sections(*classes: type) -> frozenset[str]:
    """The config sections that configure `classes`: their names and their bases' (traitlets applies
    a section to a class and to every class derived from it)."""
    return frozenset(base.__name__ for cls in classes for base in cls.mro() if base is not object)


def names_not_ours(argv: list[str], flags: Iterable[str | tuple[str, ...]], aliases: Iterable[str | tuple[str, ...]]
                   ) -> bool:
    """Whether `argv` has an option named neither ``Class.trait`` nor one of klbr's flags and aliases:
    one that only ipykernel's tables can read. (A false yes costs only their import.)"""
    ours = {key for table in (flags, aliases) for keys in table
            for key in (keys if isinstance(keys, tuple) else (keys,))}
    for arg in argv:
        if arg == "--":
            return False
        name = arg.lstrip("-").partition("=")[0]
        if arg.startswith("-") and name and "." not in name and name not in ours:
            return True
    return False


def ipykernel_tables() -> tuple[dict[str, Any], dict[str, Any]]:
    """ipykernel's own flags and aliases (its `IPKernelApp`'s), as the worker reads its command line."""
    from ipykernel.kernelapp import IPKernelApp  # noqa: PLC0415 — 50-150 ms, paid only by a line that needs it

    traits = IPKernelApp.class_traits()
    flags, aliases = traits["flags"].default(), traits["aliases"].default()
    assert isinstance(flags, dict) and isinstance(aliases, dict)  # what a Dict trait holds
    return flags, aliases


def _texts(value: object) -> list[str]:
    """A value traitlets read, as command-line text: what was typed, as it was typed, for an option
    (several for one given several times); a flag's value (a Python object) as traitlets reads it back."""
    if isinstance(value, DeferredConfigList):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [str(value)]
    return [repr(value)]


def for_workers(cli_config: Config, own: frozenset[str]) -> tuple[list[str], list[str]]:
    """The command line's options for the workers, as ``--Class.trait=value`` (ordered by name; a
    trait given several times keeps its order), and those withheld: a worker's connection is klbr's.
    A name that is no ``Class.trait`` (an alias nobody knows) is left out: traitlets has already said
    it "will have no effect"."""
    options: list[str] = []
    withheld: list[str] = []

    def walk(path: str, section: dict[str, Any]) -> None:
        for key, value in section.items():
            if isinstance(value, (Config, dict)):
                walk(f"{path}.{key}", value)
                continue
            words = [f"--{path}.{key}={text}" for text in _texts(value)]
            connection = path in _CONNECTION_SECTIONS and key in _CONNECTION_TRAITS
            (withheld if connection else options).extend(words)

    for name, section in cli_config.items():
        if name not in own and isinstance(section, (Config, dict)):
            walk(name, section)
    return sorted(options, key=lambda option: option.partition("=")[0]), withheld
