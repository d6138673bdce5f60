"""A provisioner the tests control: its kernel is reached through a forwarder it can cut.

Found by jupyter_client through the entry point beside this file (tests put this directory on the
kernel's PYTHONPATH; nothing is installed). It runs ipykernel as jupyter_client's local provisioner
does, but reports ports of its own that forward, byte for byte, to the kernel's: a network between
them. Writing ``cut`` to the FIFO ``CONTROL/cut`` cuts that network: every connection is closed
and the ports refuse new ones, while the kernel runs on. Its `poll()` flaps (alive, dead, alive...),
as gateway_provisioners' remote ones do during a network cut: klbr must not believe it.
Each launch appends the kernel's pid to ``CONTROL/launches``, each `kill` to ``CONTROL/kills``.
With ``remote`` set, it keeps its kernel's process to itself, as a provisioner of a pod or of
another host does: nobody else can see that process end or kill it; only its own calls (`kill`,
`send_signal`) reach it. With ``hang_signals``, `send_signal` never returns (a signal sent over a
network that is gone), while `kill` still works.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import socket
import threading

from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")


class CuttableProvisioner(LocalProvisioner):
    control = Unicode("", config=True, help="The directory of the `cut` FIFO and the `launches` file.")
    remote = Bool(False, config=True, help="Keep the kernel's process out of sight (no `process`).")
    hang_signals = Bool(False, config=True, help="send_signal (interrupt, terminate) never returns.")
    _own = None

    @property
    def process(self):
        return None if self.remote else self._own

    @process.setter
    def process(self, value):
        self._own = value

    @property
    def has_process(self) -> bool:
        return self._own is not None

    async def send_signal(self, signum: int) -> None:
        if self.hang_signals:
            await asyncio.Event().wait()
        self._signal(signum)

    async def kill(self, restart: bool = False) -> None:
        with open(os.path.join(self.control, "kills"), "a") as f:
            f.write(f"{self._own.pid if self._own is not None else ''}\n")
        self._signal(9)

    def _signal(self, signum: int) -> None:
        if self._own is not None and self._own.poll() is None:
            os.killpg(self._own.pid, signum)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(15)

    async def wait(self):
        return self._own.wait() if self._own is not None else None

    async def pre_launch(self, **kwargs):
        # The kernel listens on ipc files (no TCP port of its own that a forwarder's could take
        # between jupyter_client choosing it and the kernel binding it), read from a connection
        # file of its own: the manager's gets the forwarder's ports, as a remote kernel's would.
        km = self.parent
        km.transport = "ipc"
        km.ip = os.path.join(self.control, "k")
        kwargs = await super().pre_launch(**kwargs)
        own = os.path.join(self.control, "kernel.json")
        shutil.copyfile(km.connection_file, own)
        kwargs["cmd"] = [own if arg == km.connection_file else arg for arg in kwargs["cmd"]]
        return kwargs

    async def launch_kernel(self, cmd, **kwargs):
        # independent: no JPY_PARENT_PID, so the kernel does not end by itself when the helper does;
        # only a kill reaches it, as a pod's or a remote host's kernel
        self._own = launch_kernel(cmd, independent=True, **LocalProvisioner._scrub_kwargs(kwargs))
        self.pid = self.pgid = self._own.pid  # jupyter_client's launcher starts a new session
        self.cwd = kwargs.get("cwd") or os.getcwd()
        info = self.connection_info
        forwarder = Forwarder(info, os.path.join(self.control, "cut"))
        with open(os.path.join(self.control, "launches"), "a") as f:
            f.write(f"{self._own.pid}\n")
        self._polls = 0
        return {**info, "transport": "tcp", "ip": "127.0.0.1", **{f"{c}_port": forwarder.ports[c] for c in CHANNELS}}

    async def poll(self):
        self._polls = getattr(self, "_polls", 0) + 1
        return 0 if self._polls % 2 else None  # "dead" every other time, whatever the truth


class Forwarder:
    """One thread: listening sockets for each channel, piped to the kernel's own ports."""

    def __init__(self, info: dict, fifo: str):
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, socket.socket] = {}
        self.ports = {}
        for channel in CHANNELS:
            listener = socket.create_server(("127.0.0.1", 0))
            listener.setblocking(False)
            self.ports[channel] = listener.getsockname()[1]
            self._selector.register(listener, selectors.EVENT_READ, ("accept", f"{info['ip']}-{info[channel + '_port']}"))
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
        self._fifo = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never an EOF between writers
        self._selector.register(self._fifo, selectors.EVENT_READ, ("cut",))
        threading.Thread(target=self._run, daemon=True, name="cuttable-forwarder").start()

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                what = key.data
                if what[0] == "cut":
                    if b"cut" in os.read(self._fifo, 100):
                        self._cut()
                        return
                elif what[0] == "accept":
                    self._accept(key.fileobj, what[1])
                else:
                    self._pipe(key.fileobj)

    def _accept(self, listener, path: str) -> None:
        try:
            near, _ = listener.accept()
        except BlockingIOError:
            return
        far = socket.socket(socket.AF_UNIX)
        try:
            far.connect(path)
        except OSError:  # the kernel has not bound it yet: as a refused connection, tried again
            far.close()
            near.close()
            return
        for sock in (near, far):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, ("pipe",))
        self._peers[near], self._peers[far] = far, near

    def _pipe(self, sock) -> None:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        peer = self._peers.get(sock)
        if not data or peer is None:
            self._drop(sock)
            return
        peer.setblocking(True)  # a test's traffic is small: waiting for room is fine here
        try:
            peer.sendall(data)
        except OSError:
            self._drop(sock)
            return
        peer.setblocking(False)

    def _drop(self, sock) -> None:
        for s in (sock, self._peers.pop(sock, None)):
            if s is not None:
                self._peers.pop(s, None)
                try:
                    self._selector.unregister(s)
                except (KeyError, ValueError):
                    pass
                s.close()

    def _cut(self) -> None:
        """The network between klbr and the kernel is gone: nothing passes, nothing connects."""
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
        self._peers.clear()
