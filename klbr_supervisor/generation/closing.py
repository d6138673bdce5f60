"""A generation's end while it is under way: why it ends, decided once, and the `Ending` it makes.

`Generation` opens one as it enters ENDING. The first reason asked for wins (a restart, a kill after
the interrupt ladder, a lost link, a shutdown); a worker that exits with nobody having asked leaves
the reason open, and its end decides it: LOST for a worker that served, START_FAILED for one that
never did. No I/O: what is known at the end comes in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..exits import describe_exit
from ..states import Ending, EndReason

# Ends a new generation would follow automatically: with no exit seen (a worker elsewhere whose
# kill was not confirmed), the first may still run, so they count as a lost link instead.
_REPLACED = frozenset({EndReason.LOST, EndReason.KILLED, EndReason.DEADLINE})


@dataclass
class Closing:
    reason: EndReason | None = None  # None: nobody asked; the end decides
    silence: str = ""  # how its link fell silent, if it did: the words of a lost link
    memory: str = ""  # what its memory says of an exit nobody asked for (`memory.verdict`)

    def ask(self, reason: EndReason | None) -> None:
        """`reason` is why it ends, unless one was asked for already."""
        if self.reason is None:
            self.reason = reason

    def now(self, how: str, tail: str = "") -> Ending:
        """It ends with no exit to wait for (it never launched, or its link is gone)."""
        return Ending(self.reason or EndReason.START_FAILED, None, how, tail)

    def ending(self, returncode: int | None, *, served: bool, confirmed: bool, lost_how: str,
               tail: str = "") -> Ending:
        """Its worker has ended with `returncode` (None: no exit could be seen; `confirmed`: its kill
        was, and `lost_how` says how the end came)."""
        reason = self.reason or (EndReason.LOST if served else EndReason.START_FAILED)
        if returncode is None and reason in _REPLACED and not confirmed:
            reason = EndReason.LINK_LOST  # it may still run: no exit was seen, no kill confirmed
        if reason is EndReason.LINK_LOST:
            how = self.silence or lost_how
        elif returncode is None:
            how = lost_how
        else:
            how = describe_exit(returncode)
            if self.memory and reason is EndReason.LOST:
                how = f"{how}, {self.memory}"
        return Ending(reason, returncode, how, tail)
