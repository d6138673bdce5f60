"""The proxy's kernel_info_reply: answered at once, also before any worker is ready.

Capabilities are the proxy's own (semantics 12): no kernel subshells, the debugger
because debug_request is forwarded to the worker's control channel, when the worker has one: its
own kernel_info says, once it has answered; before, whether debugpy is installed here, unless
`Supervisor.debugger` is off (`configure`).
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from klbr_supervisor.generation import Generation

# The messaging protocol the proxy speaks (not jupyter_client's: this module is imported before it,
# by `standin`, and the proxy implements what it implements).
PROTOCOL_VERSION = "5.4"

# What ipykernel on this interpreter would say; used until the worker has told us its own.
_OWN_LANGUAGE_INFO = {
    "name": "python",
    "version": platform.python_version(),
    "mimetype": "text/x-python",
    "codemirror_mode": {"name": "ipython", "version": sys.version_info.major},
    "pygments_lexer": f"ipython{sys.version_info.major}",
    "nbconvert_exporter": "python",
    "file_extension": ".py",
}

# `Supervisor.debugger`, as far as it is known: the stand-in reads the command line, the app the
# whole configuration (`configure`). Off, no answer before a worker's says there is a debugger.
_debugger_wanted = True


def configure(debugger: bool) -> None:
    """`Supervisor.debugger` as configured (the stand-in's and the proxy's answers from now on)."""
    global _debugger_wanted
    _debugger_wanted = debugger


def has_debugger(worker_info: dict[str, Any], klbr_started: bool = True) -> bool:
    """Whether the worker that answered `worker_info` has ipykernel's debugger: ipykernel 7 lists it
    in `supported_features`; 6.x says nothing, and requires debugpy, so it has one unless klbr kept
    it out (`Supervisor.debugger`), which it does only in a worker it starts (`klbr_started`: not a
    `kernelspec:` or a provisioner's)."""
    if "supported_features" in worker_info or "debugger" in worker_info:
        return "debugger" in worker_info.get("supported_features", ()) or bool(worker_info.get("debugger"))
    return _debugger_wanted or not klbr_started


def debugger_shown(wanted: bool, gen: Generation | None) -> str:
    """`%klbr status`'s debugger row: whether the current worker has one, and why not."""
    off = "off (Supervisor.debugger=False)"
    if gen is None or not gen.kernel_info:
        return "on" if wanted else off
    if has_debugger(gen.kernel_info, gen.target.takes_klbr_options):
        return "on" if wanted else "on: its worker is not one klbr starts (Supervisor.debugger=False)"
    return off if not wanted else "none: no debugpy where its worker runs"


def kernel_info_content(worker_info: dict[str, Any] | None, generation: int | None, placement: str,
                        klbr_started: bool = True) -> dict[str, Any]:
    """`worker_info` is the worker's own kernel_info reply content, once it has given one;
    `klbr_started`: whether klbr started that worker itself (see `has_debugger`)."""
    worker_info = worker_info or {}
    language_info = worker_info.get("language_info") or _OWN_LANGUAGE_INFO
    if worker_info:
        debugger = has_debugger(worker_info, klbr_started)
    else:
        debugger = _debugger_wanted and importlib.util.find_spec("debugpy") is not None
    where = f"generation {generation}" if generation else "first generation starting"
    banner = f"klbr {__version__} — supervised {language_info.get('name', 'python')} {language_info.get('version', '')} ({where}, {placement})"
    if worker_info.get("banner"):
        banner += "\n" + worker_info["banner"]
    return {
        "status": "ok",
        "protocol_version": PROTOCOL_VERSION,
        "implementation": "klbr",
        "implementation_version": __version__,
        "language_info": language_info,
        "banner": banner,
        "help_links": worker_info.get("help_links", []),
        "debugger": debugger,
        "supported_features": ["debugger"] if debugger else [],
    }
