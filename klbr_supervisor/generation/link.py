"""The link to a worker that may run elsewhere: word from it, or silence that means it is lost.

A worker that shares the frontend's key runs here, as a process whose end the kernel sees at once
(its pidfd). Any other one may run where only its sockets reach (a provisioner's container, another
host): its heartbeat is pinged, and any message it sends on any channel also counts as word from it.
Silence for `timeout` seconds with no exit reported is a lost link (docs/placement.md: a lost link is not a
crash). ipykernel answers its heartbeat from a thread of its own in C (a ZMQ device), so a cell that
holds the GIL does not silence it; a stopped process or a cut network does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import zmq

from ..messages.sockets import LoopSocket
from .channels import curve_client


def endpoint(info: dict[str, Any], channel: str) -> str:
    """The URL of a worker's `channel` from its connection info (ipc here; tcp from a provisioner)."""
    port = info[f"{channel}_port"]
    if info.get("transport", "tcp") == "ipc":
        return f"ipc://{info['ip']}-{port}"
    return f"tcp://{info['ip']}:{port}"


class LinkWatch:
    def __init__(self, name: str, context: zmq.Context[zmq.Socket[bytes]], heartbeat: str, timeout: float,
                 on_lost: Callable[[float], None], server_key: str = ""):
        """Pings `heartbeat` from now on (a CurveZMQ client of `server_key`, if any);
        `on_lost(seconds_silent)` is called once, on the loop."""
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        curve_client(sock, server_key)
        sock.connect(heartbeat)
        self._channel = LoopSocket(f"{name}.hb", sock, self.heard)
        self._timeout = timeout
        self._on_lost = on_lost
        self._heard_at = time.monotonic()
        self._beat_at = self._heard_at
        self._interval = min(1.0, timeout / 4)
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._beat()

    def heard(self, frames: list[zmq.Frame] | None = None) -> None:
        """Word from the worker: a heartbeat answer, or any message it sent."""
        self._heard_at = time.monotonic()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._channel.close()

    def _beat(self) -> None:
        self._timer = None
        now = time.monotonic()
        if now - self._beat_at > 2 * self._interval + 1:
            # This process itself did not run (stopped, or starved): no pings went out meanwhile, so
            # that silence says nothing about the worker. It gets its whole timeout from now.
            self._heard_at = now
        self._beat_at = now
        silent = now - self._heard_at
        if silent >= self._timeout:
            self._channel.close()
            self._on_lost(silent)
            return
        self._channel.send([b"ping"])
        self._timer = self._loop.call_later(self._interval, self._beat)
