"""What the proxy's parts call back into the `Proxy` for: its error boundary and its queue's pump.

The one back-reference among the parts, and a genuine one: answering a failure from whatever state
it left a request in (`Proxy.internal_error`) takes every part, so no part can own it, and every
part must reach it (a message or a callback of the store or a timer enters a part, which hands what
its handling raised to `fail`). The pump is the dispatch's (`Dispatch.pump`), reached through here
because what ends a request (`OwnAnswers.release`) comes before the dispatch in the order the parts
are built, and lets the next request start.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..requests.request import Request


class Boundary(Protocol):
    def fail(self, req: Request | None, exc: Exception) -> None:
        """What handling a message or callback raised: `req`, if it concerned one, is answered
        with an InternalError; otherwise the failure is logged."""

    def guard(self, req: Request | None, handle: Callable[..., Any], *args: Any) -> None:
        """Call `handle(*args)`; if it raises, `fail` answers `req`."""

    def start(self, work: Coroutine[Any, Any, Any], what: str, req: Request | None = None) -> None:
        """Background work (an interrupt, a shutdown, a `%klbr` cell); if it fails, `req` is answered."""

    def pump(self) -> None:
        """Start the next queued request, if the queue is free."""
