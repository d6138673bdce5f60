"""JSON lines to and from a helper process over pipes, on the loop, never blocking it.

Used for a provisioner's helper (`provisioned`) and an ssh agent (`ssh`). What the far side cannot
take yet waits in order and goes as the pipe drains; a message marked `droppable` (a lease renewal)
is skipped instead while anything waits, so a stalled far side costs no memory and no lease.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any


class LinePipe:
    def __init__(self, read_fd: int, write_fd: int, on_message: Callable[[dict[str, Any]], None]):
        """`on_message(message)` for each JSON object read from `read_fd` (other lines are ignored).
        Both descriptors become the pipe's own: `close` closes them."""
        self._loop = asyncio.get_running_loop()
        self._in, self._out = read_fd, write_fd
        self._on_message = on_message
        self._buffer = b""
        self._pending = b""
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)
        self._loop.add_reader(read_fd, self.read_now)

    def send(self, droppable: bool = False, **message: Any) -> None:
        if self._out < 0 or (droppable and self._pending):
            return
        waiting = bool(self._pending)
        self._pending += json.dumps(message).encode() + b"\n"
        if not waiting:
            self._flush()

    def read_now(self) -> None:
        """Take in what the pipe holds now (the loop calls this when it is readable)."""
        while self._in >= 0:
            try:
                data = os.read(self._in, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._close_in()
                return
            self._buffer += data
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    self._on_message(message)

    def close(self) -> None:
        """Both ends: the far side reads its input's end."""
        self._close_in()
        if self._out >= 0:
            self._loop.remove_writer(self._out)
            os.close(self._out)
            self._out = -1
        self._pending = b""

    def _flush(self) -> None:
        try:
            sent = os.write(self._out, self._pending)
        except BlockingIOError:
            sent = 0
        except OSError:  # the far side is gone; its exit says so
            sent = len(self._pending)
        self._pending = self._pending[sent:]
        if self._pending:
            self._loop.add_writer(self._out, self._flush)
        else:
            self._loop.remove_writer(self._out)

    def _close_in(self) -> None:
        if self._in >= 0:
            self._loop.remove_reader(self._in)
            os.close(self._in)
            self._in = -1
