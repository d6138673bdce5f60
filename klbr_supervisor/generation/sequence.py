"""The numbers in a worker's message ids, and what it sent that never came.

jupyter_client's `Session` ids each message it makes ``<session>_<pid>_<n>``, counting on every
channel. A worker klbr does not start itself (a kernelspec's, a provisioner's) keeps ipykernel's
iopub high-water mark: while the proxy cannot read (its process starved or stopped), such a worker
drops what it publishes past 1000 waiting messages, silently. Everything it sends on its other
channels reaches the proxy, so a number that never came, among those below the idle that ends a
request, is a message its iopub dropped: outputs, most likely (a status too: then the proxy's nets
close the bracket). klbr's own workers publish without the mark and are not counted (see
`klbr_supervisor.boot.worker`).

Three kinds of number are not drops: a reply still on its way when the idle came (the caller says how
many requests still await theirs, and at most that many are excused), a reply the worker sends
where klbr does not read (a message-mode interrupt's, to jupyter_client's manager: `elsewhere`), and
the idle of a request that never came, which the proxy sent in its place (counted when it gave up on
it: its number, the first missing after the request's reply, may be above the newest that came then,
and was told as the next cell's drop).
Messages from another `Session` of the worker (another id before the pid) are not counted.

Counting starts at the first message that comes on iopub: before the worker has the proxy's
subscription, it publishes to no one (the status of a kernel_info it answered on shell while the
subscription was still on its way, under load), and that is no drop. What came on the other channels
before it is kept, above it. No I/O.
"""

from __future__ import annotations

# Out-of-order numbers held above the last unbroken one before the oldest gap below them is taken
# for a drop: messages on different sockets, or made by one thread and sent by another, arrive a
# few places apart, never thousands.
_HELD = 4096
# Requests whose reply's number is kept (`_replies`): more than are ever awaited at once.
_REPLIES = 64


class Sequence:
    def __init__(self) -> None:
        self._prefix: str | None = None  # "<session>_<pid>" of the worker's first message
        self._counting = False  # a message came on iopub: its subscription is there
        self._upto = -1  # every number up to here came, or was counted (once `_counting`)
        self._held: set[int] = set()  # numbers that came above `_upto`
        self._lost = 0  # numbers counted as dropped, not yet told
        self._elsewhere = 0  # replies the worker sends where klbr does not read, not yet met
        self._replies: dict[str, int] = {}  # request id -> its reply's number, for the newest requests
        self._netted: int | None = None  # the reply's number of a request whose idle never came, till met

    def note(self, msg_id: str, iopub: bool, parent_id: str = "") -> None:
        """A message of the worker's came (on any channel; `iopub`: on iopub; `parent_id`: the
        request it answers)."""
        number = self._number(msg_id)
        if number is None:
            return
        if not iopub and parent_id:
            replies = self._replies
            replies[parent_id] = number
            if len(replies) > _REPLIES:
                del replies[next(iter(replies))]
        if number <= self._upto:
            return
        self._held.add(number)
        if not self._counting:
            if not iopub:
                return
            # The first on iopub: what the worker made before it is not counted (see the docstring).
            self._counting = True
            self._upto = number - 1
            self._held = {n for n in self._held if n >= number}
        self._advance()
        while len(self._held) > _HELD:  # the oldest gap is no reordering: count it, go on past it
            lowest = min(self._held)
            self._lost += lowest - self._upto - 1
            self._upto = lowest - 1
            self._advance()

    def elsewhere(self) -> None:
        """The worker will answer something where klbr does not read (a message-mode interrupt)."""
        self._elsewhere += 1

    def dropped_before(self, msg_id: str | None, awaited: int, request: str = "") -> int:
        """How many messages the worker made before `msg_id` (the idle that ends `request`, which
        came; None: the newest that came, when that idle never did) never came; `awaited`: replies
        to other requests that may still be on their way. Counted once: the next call counts from
        there on."""
        if msg_id is None and request in self._replies:
            self._netted = self._replies[request]  # its idle: not counted, in this count or a later one
        number = self._number(msg_id) if msg_id is not None else max(self._held, default=None)
        missing = 0
        if self._counting and number is not None and number > self._upto:
            came = {n for n in self._held if n < number}
            missing = number - self._upto - 1 - len(came)
            if missing and self._netted is not None:
                idle = next((n for n in range(max(self._upto, self._netted) + 1, number) if n not in came), None)
                if idle is not None:
                    missing -= 1
                    self._netted = None
            self._held = {n for n in self._held if n > number}
            self._upto = number
            self._advance()
        answered = min(missing, self._elsewhere)
        self._elsewhere -= answered
        lost, self._lost = self._lost + max(0, missing - answered - awaited), 0
        return lost

    def _advance(self) -> None:
        """`_upto` past the numbers held right above it."""
        held = self._held
        while self._upto + 1 in held:
            self._upto += 1
            held.discard(self._upto)

    def _number(self, msg_id: str) -> int | None:
        """The count in `msg_id`, when it is the worker's main session's (the first one seen)."""
        prefix, _, digits = msg_id.rpartition("_")
        if not digits.isdigit() or "_" not in prefix:
            return None
        if self._prefix is None:
            self._prefix = prefix
        return int(digits) if prefix == self._prefix else None
