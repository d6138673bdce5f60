"""When a starting worker serves, and the requests a generation sends its worker on its own.

Ready is: kernel_info answered, iopub subscribed (proved by a message on it: ipykernel's
`iopub_welcome`, or the status of a request), and stdin connected (see `channels`: only then can
an `input_request` reach the proxy). The generation's own requests (these kernel_info probes, the
execution-count sync) are answered to nobody but the generation: their replies and iopub are its
bookkeeping, never the frontend's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyter_client.session import Session

from ..messages.wire import Wire
from .channels import WorkerChannels

# Seconds before kernel_info is asked again, when it was answered before iopub proved subscribed.
_REPROBE = 0.05


class Readiness:
    def __init__(self, name: str, session: Session, channels: WorkerChannels, log: logging.Logger):
        self._name = name
        self._session = session
        self._channels = channels
        self._log = log
        self._loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.kernel_info: dict[str, Any] = {}
        self.own_ids: set[str] = set()  # msg_ids of the generation's own requests
        self.unanswered: set[str] = set()  # those whose reply has not come (yet)
        self._asked: dict[str, asyncio.Future[Wire]] = {}  # those whose reply someone awaits
        self.iopub_seen = False  # a message came on iopub: its subscription is there

    def probe(self) -> None:
        """Ask kernel_info; readiness is its reply plus proof that iopub is subscribed."""
        self.send_own(self._session.msg("kernel_info_request"))

    def send_own(self, msg: dict[str, Any]) -> None:
        """Send a request of the generation's own on shell (its answers come back to `reply`)."""
        self.own_ids.add(msg["header"]["msg_id"])
        self.unanswered.add(msg["header"]["msg_id"])
        self._channels.send("shell", self._session.serialize(msg))

    async def ask(self, msg: dict[str, Any], timeout: float) -> Wire | None:
        """Send a request of the generation's own and await its reply (None if none came in time)."""
        answer: asyncio.Future[Wire] = self._loop.create_future()
        self._asked[msg["header"]["msg_id"]] = answer
        self.send_own(msg)
        try:
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None  # a coroutine runs in one
            if task.cancelling():
                raise  # the task itself is cancelled
            return None  # the generation ended: no answer will come
        finally:
            self._asked.pop(msg["header"]["msg_id"], None)

    def iopub(self) -> None:
        """A message came on iopub: the subscription is there (told until `iopub_seen`)."""
        if not self.iopub_seen:
            self.iopub_seen = True
            self.check()

    def reply(self, wire: Wire) -> None:
        """A shell reply to one of `own_ids`."""
        self.unanswered.discard(wire.parent_id)
        answer = self._asked.get(wire.parent_id)
        if answer is not None and not answer.done():
            answer.set_result(wire)
            return
        if wire.msg_type == "kernel_info_reply":
            self.kernel_info = wire.content
            self.check()
        elif wire.msg_type == "execute_reply" and wire.content.get("status") != "ok":
            self._log.warning("%s: could not continue the execution count: %s", self._name, wire.content)

    def check(self) -> None:
        """Ready once kernel_info is answered, iopub subscribed and stdin connected."""
        if self.ready.done() or not self.kernel_info:
            return
        if self.iopub_seen:
            if self._channels.connected("stdin"):
                self.ready.set_result(None)
        else:
            # Replied before our subscription reached its iopub (a kernel without iopub_welcome):
            # ask again; the status of that request proves iopub works.
            self._loop.call_later(_REPROBE, self._probe_if_waiting)

    def cancel(self) -> None:
        """The generation ended (before it served, or while it asked something)."""
        if not self.ready.done():
            self.ready.cancel()
        for answer in self._asked.values():
            answer.cancel()

    def _probe_if_waiting(self) -> None:
        if not self.ready.done():
            self.probe()
