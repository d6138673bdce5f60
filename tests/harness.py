"""The proxy alone, in-process: its real parts (`klbr_kernel.proxy.Proxy`, a real cell log on a SQLite
file) between a stand-in frontend and a stand-in supervisor, as tests/test_supervisor.py drives the
supervisor with a stand-in listener. A test plays both ends: it sends what a frontend sends, plays
the worker's messages in the order it wants, ends a generation when it wants, and reads what the
frontend got. Nothing waits for a process or a timer: a race is set up message by message, and
runs in milliseconds.

    async with proxy(tmp_path) as h:
        msg = h.execute("1")
        h.worker.busy(msg); h.worker.reply(msg, {"status": "ok", "execution_count": 1}); h.worker.idle(msg)
        await h.settled()
        assert h.frontend.seen(msg) == [("iopub", "status"), ("shell", "execute_reply"), ("iopub", "status")]

The stand-in supervisor fails a test that calls it back while it hands a generation's end over.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jupyter_client.session import Session

from klbr_kernel.frontend.drops import Drops
from klbr_kernel.proxy import Proxy
from klbr_supervisor.messages.wire import Wire
from klbr_supervisor.policy import Refusal
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.store import Store

KEY = b"harness-key"
CLIENT = b"client-identity"


class Frontend:
    """Stands in for the proxy's `Frontend`: records what the frontend would get, in order, as
    (channel, msg_type, parent msg_id, content); `on_event(event)`, if set, sees each as it goes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []
        self.subscriptions = 1  # a frontend is subscribed to iopub
        self.outbox = None
        self.server_keys = None
        self.drops = Drops(logging.getLogger("harness"))
        self.gone = False  # the frontend that asked has disconnected: replies find no one
        self.on_event: Callable[[tuple[str, str, str, dict[str, Any]]], None] | None = None
        self._session = Session(key=KEY)

    def bind(self, on_message: Callable[[str, Wire], None]) -> None:
        self.on_message = on_message

    def close(self) -> None:
        self.drops.close()

    def _note(self, channel: str, msg_type: str, parent: dict[str, Any], content: dict[str, Any]) -> None:
        event = (channel, msg_type, str(parent.get("msg_id", "")), content)
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def reply(self, channel: str, idents: list[Any], msg_type: str, content: dict[str, Any], parent: dict[str, Any],
              metadata: dict[str, Any] | None = None) -> bool:
        self._note(channel, msg_type, parent, content)
        return not self.gone

    def send_iopub(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None,
                   topic: bytes | None = None, keep: bool = False) -> None:
        self._note("iopub", msg_type, parent or {}, content)

    def status(self, state: str, parent: dict[str, Any]) -> None:
        self.send_iopub("status", {"execution_state": state}, parent)

    def forward(self, channel: str, idents: list[Any], frames: list[Any]) -> bool:
        wire = Wire.parse(frames)
        self._note(channel, wire.msg_type, wire.parent, wire.content)
        return not self.gone

    def publish(self, wire: Wire) -> None:
        self._note("iopub", wire.msg_type, wire.parent, wire.content)

    def seen(self, msg: dict[str, Any]) -> list[tuple[str, str]]:
        """What the frontend got about `msg` (a request the test sent), as (channel, msg_type)."""
        return [(channel, msg_type) for channel, msg_type, parent, _ in self.events if parent == msg["header"]["msg_id"]]

    def contents(self, msg: dict[str, Any], msg_type: str) -> list[dict[str, Any]]:
        return [content for _, kind, parent, content in self.events
                if parent == msg["header"]["msg_id"] and kind == msg_type]


class Generation:
    """Stands in for a generation: what the proxy's parts read of one."""

    def __init__(self, number: int):
        self.number = number
        self.pid = 1000 + number
        self.next_count = 1
        self.kernel_info = {"language_info": {"name": "python"}}
        self.memory = None
        self.ending: Ending | None = None

    @property
    def alive(self) -> bool:
        return self.ending is None

    @property
    def counts_drops(self) -> bool:
        """A worker klbr starts itself: its iopub drops nothing, so nothing is counted."""
        return False

    def identity(self) -> dict[str, Any]:
        return {"pid": self.pid}


class Supervisor:
    """Stands in for the `Supervisor`: a real store, and generations that are what the test says.
    Records what the proxy sends its worker (`sent`: (channel, msg_type, msg_id)); any call while a
    generation's end is handed over fails the test (`called_back`)."""

    def __init__(self, listener: Any, store: Store):
        self.listener = listener
        self.store = store
        self.notebook = None
        self.interrupt_grace = 3.0  # a setting, as the real one's
        self.where = SimpleNamespace(spec="local")
        self.current: Generation | None = None
        self.sent: list[tuple[str, str, str]] = []
        self.called_back: list[str] = []  # what the proxy called while it was told of an end
        self.started = 0  # calls of ensure_started
        self.poisoned: set[str] = set()
        self.halted: Refusal | None = None  # a crash loop or a lost link: what every request is told
        self._handing_over = False
        self._numbers = iter(range(1, 1000))
        self._stopped = asyncio.Event()

    def _call(self, what: str) -> None:
        if self._handing_over:
            self.called_back.append(what)

    # -- what the test does -------------------------------------------------------------------------

    def ready(self) -> Generation:
        """A new generation serves: the listener is told."""
        self.current = Generation(next(self._numbers))
        self.halted = None
        self.listener.generation_ready(self.current)
        return self.current

    def end(self, reason: EndReason = EndReason.LOST, how: str = "killed by signal 9 (SIGKILL)",
            refusal: Refusal | None = None) -> Generation:
        """The current generation ends: the listener is told, as the `Succession` tells it."""
        gen = self.current
        assert gen is not None
        gen.ending = Ending(reason, -9, how)
        self.current = None
        self.halted = refusal  # until a generation is ready again
        self._handing_over = True
        try:
            self.listener.generation_ended(gen, gen.ending, refusal)
        finally:
            self._handing_over = False
        return gen

    # -- what the proxy calls -----------------------------------------------------------------------

    async def run(self) -> None:
        await self._stopped.wait()

    def refusal(self, code: str | None) -> Refusal | None:
        self._call("refusal")
        if self.current is None and self.halted is not None:
            return self.halted
        return Refusal("poisoned", 2) if code is not None and code in self.poisoned else None

    def ensure_started(self) -> None:
        self._call("ensure_started")
        self.started += 1

    def send(self, channel: str, frames: list[Any]) -> bool:
        self._call("send")
        wire = Wire.parse(frames)
        self.sent.append((channel, wire.msg_type, wire.msg_id))
        return self.current is not None

    def send_execute(self, frames: list[Any], *, msg_id: str, code: str, counts: bool, timeout: float | None,
                     cell_id: int | None = None, sync: Any = None, silent: bool = False) -> Any:
        self._call("send_execute")
        self.sent.append(("shell", "execute_request", msg_id))
        return SimpleNamespace(timed_out=False, deadline=None)

    async def interrupt(self) -> None:
        self._call("interrupt")

    async def shutdown(self) -> None:
        self._call("shutdown")
        if self.current is not None:
            self.end(EndReason.SHUTDOWN, "shut down")
        self._stopped.set()


class Worker:
    """Plays the current generation's worker: its messages, with the frontend's key and the proxy's
    session id (a local worker's), about a request the test sent."""

    def __init__(self, harness: Harness, session_id: str):
        self._harness = harness
        self._session = Session(key=KEY, session=session_id, username="kernel")

    def _deliver(self, channel: str, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        msg = self._session.msg(msg_type, content, parent=parent["header"])
        topic = [f"kernel.{msg_type}".encode()] if channel == "iopub" else []
        wire = Wire.parse(topic + self._session.serialize(msg))
        generation = self._harness.supervisor.current
        assert generation is not None, "no generation serves"
        self._harness.proxy.worker_message(generation, channel, wire)

    def busy(self, parent: dict[str, Any]) -> None:
        self._deliver("iopub", "status", {"execution_state": "busy"}, parent)

    def idle(self, parent: dict[str, Any]) -> None:
        self._deliver("iopub", "status", {"execution_state": "idle"}, parent)

    def execute_input(self, parent: dict[str, Any], count: int) -> None:
        self._deliver("iopub", "execute_input", {"code": parent["content"].get("code", ""), "execution_count": count},
                      parent)

    def stream(self, parent: dict[str, Any], text: str) -> None:
        self._deliver("iopub", "stream", {"name": "stdout", "text": text}, parent)

    def reply(self, parent: dict[str, Any], content: dict[str, Any]) -> None:
        msg_type = parent["header"]["msg_type"].rsplit("_", 1)[0] + "_reply"
        self._deliver("shell", msg_type, content, parent)

    def runs(self, parent: dict[str, Any], count: int, text: str | None = None) -> None:
        """The start of a cell as a worker runs it: busy, its execute_input, an output if `text`."""
        self.busy(parent)
        self.execute_input(parent, count)
        if text is not None:
            self.stream(parent, text)


class Harness:
    def __init__(self, path: Path):
        self.store = Store(path=str(path / "log.sqlite3"))
        self._path = path / "log.sqlite3"
        self.frontend = Frontend()
        self.client = Session(key=KEY, username="user")
        proxy_session = Session(key=KEY, username="kernel")
        self.proxy = Proxy({"kernel_name": "klbr"}, proxy_session, frontend=self.frontend,
                           make_supervisor=lambda listener: Supervisor(listener, self.store))
        self.supervisor: Supervisor = self.proxy.supervisor
        self.worker = Worker(self, proxy_session.session)

    # -- the frontend's side ------------------------------------------------------------------------

    def request(self, msg_type: str, content: dict[str, Any], channel: str = "shell",
                msg: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send `msg_type` (or `msg` as it is, again) as a frontend does; returns the message."""
        msg = msg or self.client.msg(msg_type, content)
        wire = Wire.parse(self.client.serialize(msg, ident=[CLIENT]))
        self.frontend.on_message(channel, wire)
        return msg

    def execute(self, code: str, **content: Any) -> dict[str, Any]:
        return self.request("execute_request", {"code": code, "silent": False, "store_history": True,
                                                "user_expressions": {}, "allow_stdin": False, **content})

    # -- waiting, by turns of the loop and the store's commits, never by time ------------------------

    async def settled(self, turns: int = 20) -> None:
        """Until what the messages so far set off has run: the store's writes committed, and the
        callbacks they scheduled (a released request's pump runs on the next turn)."""
        for _ in range(turns):
            await self.proxy.cell_log.settled()
            await asyncio.sleep(0)

    def row(self, msg: dict[str, Any]) -> sqlite3.Row | None:
        """The cell log's row of `msg`, as another reader of the file sees it (what is committed)."""
        with sqlite3.connect(self._path) as conn:
            conn.row_factory = sqlite3.Row
            return conn.execute("SELECT * FROM cells WHERE msg_id = ? ORDER BY id DESC", (msg["header"]["msg_id"],)
                                ).fetchone()


@asynccontextmanager
async def proxy(path: Path) -> AsyncIterator[Harness]:
    """A proxy between stand-ins, running, with its first generation serving; shut down after."""
    harness = Harness(path)
    assert harness.store.open(uuid=str(uuid.uuid4()), notebook=None, kernel=None)
    running = asyncio.create_task(harness.proxy.run())
    await asyncio.sleep(0)  # `run` has bound the frontend and made its task group
    harness.supervisor.ready()
    try:
        yield harness
    finally:
        harness.proxy.request_shutdown()
        await asyncio.wait_for(running, 10)
        harness.store.close()
