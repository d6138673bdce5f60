"""What the proxy's parts call back into the `Proxy` for: its error boundary and its queue's pump.

The one back-reference among the parts, and a genuine one: answering a failure from whatever state
it left a request in (`Proxy.internal_error`) and starting the next queued request (`Proxy.pump`)
take every part, so no part can own them, and every part must reach them (a callback of the store
or a timer enters behind the boundary; a finished request lets the next one start).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..requests.request import Request


class Boundary(Protocol):
    def guard(self, req: Request | None, handle: Callable[..., Any], *args: Any) -> None:
        """Call `handle(*args)`; if it raises, `req` is answered with an InternalError."""

    def guarded(self, req: Request, handle: Callable[..., Any]) -> Callable[..., None]:
        """`handle` as a callback (of the store, a timer) behind the boundary for `req`."""

    def start(self, work: Coroutine[Any, Any, Any], what: str, req: Request | None = None) -> None:
        """Background work (an interrupt, a shutdown, a `%klbr` cell); if it fails, `req` is answered."""

    def pump(self) -> None:
        """Start the next queued request, if the queue is free."""
