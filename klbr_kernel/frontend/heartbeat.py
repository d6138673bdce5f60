"""The heartbeat channel: echo every ping, in a thread of its own (as ipykernel does).

It answers for the proxy, which stays up whatever its workers do; worker health is watched on the
worker processes themselves.
"""

from __future__ import annotations

import threading

import zmq

from . import encryption

# The longest ping echoed, in bytes; a longer one disconnects its sender instead of being held and
# sent back whole. Clients ping with a few bytes (jupyter_client: b"ping").
PING_MAX = 4096


class Heartbeat(threading.Thread):
    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], url: str, server_keys: tuple[bytes, bytes] | None = None):
        """`server_keys`: the connection file's curve keys, which make the socket a CURVE server."""
        super().__init__(name="klbr-heartbeat", daemon=True)
        self._context = context
        self._socket = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.maxmsgsize = PING_MAX
        encryption.serve(self._socket, server_keys)
        self._socket.bind(url)
        self._control_url = f"inproc://klbr-heartbeat-{id(self)}"
        self._control = context.socket(zmq.PAIR)
        self._control.bind(self._control_url)

    def run(self) -> None:
        steer = self._context.socket(zmq.PAIR)
        steer.connect(self._control_url)
        try:
            zmq.proxy_steerable(self._socket, self._socket, None, steer)
        except zmq.ZMQError:
            pass
        finally:
            steer.close(linger=0)
            self._socket.close(linger=0)

    def stop(self) -> None:
        """Called by the proxy at shutdown, from the loop thread."""
        self._control.send(b"TERMINATE")
        self.join(timeout=1)
        self._control.close(linger=0)
