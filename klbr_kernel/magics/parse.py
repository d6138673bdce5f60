"""Parsing `%klbr` cells: a cell made only of `%klbr` lines is the proxy's, never the worker's.

`%%klbr timeout=SECONDS` on a cell's first line runs the rest of the cell with that deadline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klbr_supervisor.memory import parse_size

COMMANDS = ("status", "restart", "placement", "reconnect", "timeout", "history", "replay", "rebuild", "memory")
_LINE = re.compile(r"^%klbr(?:\s+(?P<rest>.*))?$")
_CELL = re.compile(r"^%%klbr\s+timeout\s*=\s*(?P<seconds>\S+)\s*$")
_IN = re.compile(r"^In\[(?P<count>\d+)\]$")


class MagicError(ValueError):
    """A `%klbr` line the proxy cannot carry out; shown to the user as a UsageError."""


@dataclass(frozen=True)
class Magic:
    command: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class ReplaySpec:
    """`%klbr replay [CELL] [--follow]`: a store cell id, or `In[n]` of this session, or neither."""

    cell_id: int | None = None
    count: int | None = None
    follow: bool = False


def replay_spec(args: tuple[str, ...]) -> ReplaySpec:
    """Raises `MagicError` for anything but a cell id, `In[n]`, and `--follow`."""
    follow = "--follow" in args
    rest = [a for a in args if a != "--follow"]
    usage = "usage: %klbr replay [CELL | In[N]] [--follow]   (CELL: a cell id of `%klbr history`)"
    if len(rest) > 1 or len(args) - len(rest) > 1:
        raise MagicError(usage)
    if not rest:
        return ReplaySpec(follow=follow)
    if rest[0].isdigit():
        return ReplaySpec(cell_id=int(rest[0]), follow=follow)
    match = _IN.match(rest[0])
    if match is None:
        raise MagicError(usage)
    return ReplaySpec(count=int(match.group("count")), follow=follow)


@dataclass(frozen=True)
class RebuildSpec:
    """`%klbr rebuild [--plan] [--generation N] [--include-errors]`."""

    plan: bool = False
    generation: int | None = None
    include_errors: bool = False


def rebuild_spec(args: tuple[str, ...]) -> RebuildSpec:
    """Raises `MagicError` for anything but the three options, each at most once."""
    usage = "usage: %klbr rebuild [--plan] [--generation N] [--include-errors]"
    rest, generation = list(args), None
    if "--generation" in rest:
        at = rest.index("--generation")
        if at + 1 >= len(rest) or not rest[at + 1].isdigit():
            raise MagicError(usage + "   (N: a generation's number, `%klbr status` shows the current one)")
        generation = int(rest[at + 1])
        del rest[at:at + 2]
    flags = set(rest)
    if len(flags) != len(rest) or not flags <= {"--plan", "--include-errors"}:
        raise MagicError(usage)
    return RebuildSpec("--plan" in flags, generation, "--include-errors" in flags)


def memory_limit(args: tuple[str, ...]) -> None:
    """Raises `MagicError` unless `args` is nothing, or one limit `Supervisor.memory_limit` takes
    (bytes, or 512M, 8G), or `none` (or 0): no limit."""
    usage = "usage: %klbr memory [LIMIT]   (bytes, or a number with K, M, G or T: 512M, 8G; none or 0: no limit)"
    if len(args) > 1:
        raise MagicError(usage)
    if args and args[0].lower() != "none":
        try:
            parse_size(args[0])
        except ValueError as e:
            msg = f"{e}\n{usage}"
            raise MagicError(msg) from None


def line_magics(code: str) -> list[Magic] | None:
    """The `%klbr` commands of a cell made only of them (blank lines and comments allowed), else None.

    Raises `MagicError` for a `%klbr` cell with an unknown command or bad arguments.
    """
    lines = [line.strip() for line in code.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    matches = [match for match in map(_LINE.match, lines) if match is not None]
    if not lines or len(matches) < len(lines):
        return None
    magics = []
    for match in matches:
        words = (match.group("rest") or "").split()
        if not words:
            msg = f"%klbr needs a command: {', '.join(COMMANDS)}"
            raise MagicError(msg)
        command, args = words[0], tuple(words[1:])
        if command not in COMMANDS:
            msg = f"unknown %klbr command {command!r}; known: {', '.join(COMMANDS)}"
            raise MagicError(msg)
        if command == "timeout":
            if len(args) != 1:
                msg = "usage: %klbr timeout SECONDS   (0 = no limit)"
                raise MagicError(msg)
            _seconds(args[0])
        elif command in ("status", "restart", "reconnect") and args:
            msg = f"%klbr {command} takes no arguments"
            raise MagicError(msg)
        elif command == "placement" and len(args) > 1:
            msg = "usage: %klbr placement [SPEC]"
            raise MagicError(msg)
        elif command == "history" and (len(args) > 1 or (args and not args[0].isdigit())):
            msg = "usage: %klbr history [N]"
            raise MagicError(msg)
        elif command == "replay":
            replay_spec(args)
        elif command == "rebuild":
            rebuild_spec(args)
        elif command == "memory":
            memory_limit(args)
        magics.append(Magic(command, args))
    return magics


def cell_timeout(code: str) -> tuple[float, str] | None:
    """(seconds, body) for a cell that starts with `%%klbr timeout=SECONDS`, else None."""
    if not code.startswith("%%klbr"):
        return None
    first, _, body = code.partition("\n")
    match = _CELL.match(first.strip())
    if not match:
        msg = "usage: %%klbr timeout=SECONDS   (the first line of a cell)"
        raise MagicError(msg)
    return _seconds(match.group("seconds")), body


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        msg = f"not a number of seconds: {text!r}"
        raise MagicError(msg) from None
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        msg = f"seconds must be 0 (no limit) or more: {text!r}"
        raise MagicError(msg)
    return seconds
