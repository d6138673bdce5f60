"""What the frontend's sockets let through unserved: counted, and logged at a bounded rate.

Called by the `Frontend` (frames that fail verification, replays, what is not a subscription on
iopub) and the `Dispatch` (messages the door refuses: answered with an error, or only dropped). A
broken or hostile peer can send thousands of bad frames a second, and a log line each would flood
the kernel's log and cost more than dropping them. So the first one after a quiet spell is logged
at once, whole; those that follow within `INTERVAL` seconds are only counted, by reason, and told
in one line when the interval ends. `%klbr status` shows the totals since the kernel started.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

INTERVAL = 10.0  # seconds between two lines about unserved traffic, at most
_REASONS = 8  # distinct reasons a summary names; the rest are "other reasons"
_WIDTH = 120  # characters of a text kept (a 10 KB msg_type is not logged whole)


def _short(text: str) -> str:
    return text if len(text) <= _WIDTH else text[:_WIDTH] + "..."


class Drops:
    def __init__(self, log: logging.Logger, interval: float = INTERVAL):
        self._log = log
        self._interval = interval
        self.dropped = 0  # messages dropped without an answer, since the kernel started
        self.refused = 0  # messages answered with an error instead of being served
        self.last: str | None = None  # the most recent, whole
        self._pending: Counter[str] = Counter()  # held back since the last line, by reason
        self._timer: asyncio.TimerHandle | None = None  # set while lines are held back

    def drop(self, channel: str, why: str, what: str = "a message") -> None:
        """`what` came in on `channel` and nothing answers it, because of `why`."""
        self.dropped += 1
        self._note(f"{channel}: dropped", what, why)

    def refuse(self, channel: str, why: str, what: str = "a message") -> None:
        """`what` was refused by the door, and got an error reply (inside busy/idle) instead."""
        self.refused += 1
        self._note(f"{channel}: refused", what, why)

    def status(self) -> str:
        """One line for `%klbr status`."""
        if not self.dropped and not self.refused:
            return "none"
        return (f"{self.dropped} messages from the frontend, {self.refused} more answered with an error "
                f"(last: {self.last})")

    def close(self) -> None:
        """At exit: what was held back is told now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._summarise()

    def _note(self, done: str, what: str, why: str) -> None:
        self.last = f"{done} {_short(what)}: {_short(why)}"
        if self._timer is None:
            self._log.warning("%s (more within %g s are counted, and told in one line)", self.last, self._interval)
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)
            return
        reason = f"{done}: {_short(why)}"
        if reason in self._pending or len(self._pending) < _REASONS:
            self._pending[reason] += 1
        else:
            self._pending["other reasons"] += 1

    def _tick(self) -> None:
        # Held back for a whole interval: a quiet one ends the holding back, a busy one is told.
        self._timer = None
        if self._summarise():
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)

    def _summarise(self) -> bool:
        if not self._pending:
            return False
        total = sum(self._pending.values())
        reasons = "; ".join(f"{n} x {reason}" for reason, n in self._pending.most_common())
        self._log.warning("%d more messages from the frontend were not served since the last such line: %s",
                          total, reasons)
        self._pending.clear()
        return True
