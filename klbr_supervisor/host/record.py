"""The answers the `HostService` has given, for calls sent again: each call is carried out once.

A client that hears nothing for a while sends its call again with the same id (`klbr_kernel.host`),
and is answered from here. What is kept is bounded by bytes, not by count: a `host.run` reply can
carry 8 MB. Past `max_bytes` (or `max_replies`), the oldest large replies go first, then the oldest
small ones; of a reply that went, only the fact that it was given is kept (up to `max_forgotten`
call ids), so a call sent again is told so (`too_large`, or `timeout` for an old small one) and is
never carried out twice.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .channel import Reply

LARGE = 65536  # bytes (roughly) from which a reply is large: it goes before any small one


class AnswerRecord:
    def __init__(self, max_bytes: int = 4_000_000, max_replies: int = 4096, max_forgotten: int = 16384):
        self.max_bytes = max_bytes
        self.max_replies = max_replies
        self.max_forgotten = max_forgotten
        self._small: OrderedDict[str, tuple[Reply, int]] = OrderedDict()  # call id -> (reply, its size)
        self._large: OrderedDict[str, tuple[Reply, int]] = OrderedDict()
        self._forgotten: OrderedDict[str, int] = OrderedDict()  # call id -> the size of the reply it had
        self.bytes = 0  # the sizes of the replies kept

    def __contains__(self, call: str) -> bool:
        return call in self._small or call in self._large or call in self._forgotten

    def get(self, call: str) -> Reply | None:
        """The reply `call` was given, or what to tell it now that the reply is gone; None if unknown."""
        kept = self._small.get(call) or self._large.get(call)
        if kept is not None:
            return kept[0]
        size = self._forgotten.get(call)
        if size is None:
            return None
        code = "too_large" if size >= LARGE else "timeout"
        return {"call": call, "ok": False, "code": code,
                "message": f"this call was carried out and answered once; its answer (about {size} bytes) is no "
                           "longer kept to be sent again, and the call is not carried out again"}

    def add(self, call: str, reply: Reply) -> None:
        """`call` was answered `reply` (called once per call id)."""
        size = _size(reply)
        (self._large if size >= LARGE else self._small)[call] = (reply, size)
        self.bytes += size
        while self.bytes > self.max_bytes or len(self._small) + len(self._large) > self.max_replies:
            gone, (_, gone_size) = (self._large or self._small).popitem(last=False)
            self.bytes -= gone_size
            self._forgotten[gone] = gone_size
        while len(self._forgotten) > self.max_forgotten:
            self._forgotten.popitem(last=False)


def _size(value: object) -> int:
    """Roughly the bytes `value` takes as JSON: its strings' lengths and a little for the rest
    (cheap on a reply of megabytes: it never encodes it)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return 2 + sum(_size(k) + _size(v) + 2 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 2 + sum(_size(v) + 1 for v in value)
    return 8
