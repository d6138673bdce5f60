"""What cell code may ask its supervisor: the host service behind `klbr_kernel.host`.

Owned by the `Supervisor`, which tells it when generations start and end. A request is checked in
this order, each failure answered with its code: a known call id is answered from the record (a
client sending again after a silence: the effect happens once); an ended generation's token gets
`stale_generation`; a cell that is not the one running (a thread that outlived its cell) gets
`not_running`; the cell's budget (`max_requests_per_cell`) spent gets `budget_exhausted`; then the
call's own checks (`invalid`, `forbidden`, `too_large`). A call sent again while it is carried out
is answered once, when it is done; one sent again later, from the `AnswerRecord`.

It keeps the `host.run` commands under way, and ends each (its process group: SIGTERM, then SIGKILL
after `kill_grace`) when the cell that started it ends however it ends (`cell_ended`: its reply, an
interrupt's reply; `retire`: the loss of its generation), and at `shutdown`; the reaper watches
their groups, so a SIGKILLed kernel leaves none. It can be driven from a test with no proxy.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Int, Unicode
from traitlets.config import LoggingConfigurable

from ..boot.placement import PlacementError
from ..states import EndReason
from ..store import queries
from ..targets.factory import problem
from . import commands
from .channel import Answer, Credentials, HostChannel, Refusal, Reply, Request
from .record import AnswerRecord

if TYPE_CHECKING:
    import zmq

    from ..boot.reaper import Reaper
    from ..generation import Generation
    from ..running import RunningCell
    from ..states import Ending
    from ..store import Store, StoreError
    from ..supervisor import Supervisor

MAX_KEY = 256  # characters of a kv key
MAX_VALUE = 2**20  # bytes of a kv value's JSON
MAX_NOTE = 65536  # characters of a note

# How a call returns its result (what the cell's call gets, as JSON): once, now or later on the loop.
Done = Callable[[object], None]


class HostService(LoggingConfigurable):
    workspace = Unicode(
        "", config=True,
        help="Directory `host.run` commands run in, or below (default: the notebook's directory, else the kernel's).",
    )
    max_requests_per_cell = Int(128, config=True, help="Host calls one cell may make (then `budget_exhausted`).")
    tcp_ip = Unicode(
        "", config=True,
        help="Address the host channel's TCP socket (CurveZMQ) listens on, for kernels of provisioners of their "
             "own, which may run where this machine's ipc socket does not reach (default: the address this "
             "machine's hostname resolves to).",
    )

    def __init__(self, supervisor: Supervisor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.supervisor = supervisor
        self.channel: HostChannel | None = None
        self._generations: dict[str, Generation] = {}  # token -> live generation
        self._answers = AnswerRecord()  # call id -> its reply
        self._pending: dict[str, set[Answer]] = {}  # call id -> its callers, while it is carried out
        self._runs: dict[commands.Run, tuple[Generation, str]] = {}  # commands under way -> their cell
        # What a cell asked for when it ends (`host.restart`, `host.relocate`): msg_id -> (kind, argument)
        self._after: dict[str, tuple[str, str]] = {}
        self._reaper: Reaper | None = None
        self._budget_cell: str | None = None
        self._budget_used = 0

    def start(self, endpoint: str, context: zmq.Context[zmq.Socket[bytes]], reaper: Reaper | None = None) -> None:
        """Bind the channel (on the loop, once the supervisor runs); `reaper` watches the commands."""
        self.channel = HostChannel(endpoint, context, self._handle, self.log)
        self._reaper = reaper

    def tcp(self) -> tuple[str, str]:
        """The channel's TCP endpoint and its CurveZMQ public key, listening from the first call on
        (a provisioned generation's target asks, `Given.host_tcp`); raises OSError or `zmq.ZMQError`."""
        if self.channel is None:
            msg = "the host channel is not open"
            raise OSError(msg)
        listener = self.channel.listen_tcp(self.tcp_ip or socket.gethostbyname(socket.gethostname()))
        return listener.endpoint, listener.server_key

    def cell_ended(self, cell: RunningCell, stopping: bool = False) -> None:
        """The running `cell` ended with its reply (an interrupted one too): its commands end, and
        what it asked for follows (unless the kernel is `stopping`)."""
        self._stop(lambda gen, msg_id: msg_id == cell.msg_id, "not_running",
                   "the cell that started this command ended, and the command was ended with it")
        action = self._after.pop(cell.msg_id, None)
        if action is not None and not stopping:
            kind, argument = action
            reason = EndReason.RESTART if kind == "restart" else EndReason.RELOCATED
            # At once, before the proxy takes the next cell: that one runs on the new generation.
            cell.generation.closing(reason)
            self.supervisor.start_task(self._renew(reason, argument), f"host.{kind}")

    def _after_cell(self, msg_id: str, kind: str, argument: str) -> None:
        """When the cell `msg_id` ends with its reply, `kind` ("restart", "relocate") follows."""
        self._after[msg_id] = (kind, argument)
        current = self.supervisor.current
        self.supervisor.store.event(f"host_{kind}", {"generation": current.number if current else None,
                                                     "requested": argument})

    async def _renew(self, reason: EndReason, why: str) -> None:
        """The new generation the cell asked for; the current one is closing already."""
        supervisor = self.supervisor
        if reason is EndReason.RELOCATED:
            try:
                await supervisor.relocate(why, check_first=False)  # checked when the cell asked
                return
            except PlacementError as e:  # it was fine when the cell asked; not any more
                self.log.error("host.relocate(%r) could not be carried out: %s", why, e)
                supervisor.store.event("placement_failed", {"to": why, "error": str(e)})
        gen = supervisor.current  # it ends, and the next starts where it was
        if gen is not None and gen.ending is None:
            self.log.info("generation %d ends at its cell's request (%s: %s)", gen.number, reason.value, why)
            await gen.stop(reason, supervisor.kill_grace)  # the supervisor hands over to the spare

    def shutdown(self) -> None:
        """The kernel shuts down: every command ends (within `kill_grace`), so the supervisor can."""
        self._stop(lambda gen, cell: True, "stale_generation", "the kernel shut down; the command was ended")

    def close(self) -> None:
        """The supervisor is done: what may still run is SIGKILLed, and the socket closed."""
        for run in self._runs:
            run.kill()
        if self.channel is not None:
            self.channel.close()

    def admit(self, generation: Generation, credentials: Credentials) -> None:
        """`generation` is starting with `credentials` in its worker's environment."""
        self._generations[credentials.token] = generation
        if self.channel is not None:
            self.channel.admit(credentials)

    def retire(self, credentials: Credentials, ending: Ending | None = None) -> None:
        """Its generation ended (`ending` says why): its late calls are told `stale_generation`,
        its calls in flight are ended, `unavailable` when its link was lost (naming the link)."""
        generation = self._generations.pop(credentials.token, None)
        if self.channel is not None:
            self.channel.retire(credentials.token)
        cell = self.supervisor.cells.cell
        if cell is not None and cell.generation is generation:
            self._after.pop(cell.msg_id, None)  # it ended with its generation: nothing follows
        if ending is not None and ending.reason is EndReason.LINK_LOST and generation is not None:
            why = f"the link to {generation.placement.spec} was lost ({ending.how}); the command was ended"
            ended = self._stop(lambda gen, cell: gen is generation, "unavailable", why)
            if ended:  # its caller cannot be told: the cell log is
                self.supervisor.store.event("host_unavailable", {"generation": generation.number, "calls": ended,
                                                                 "why": why})
        self._stop(lambda gen, cell: gen is generation, "stale_generation",
                   "the generation that started this command ended, and the command was ended with it")

    def _stop(self, which: Callable[[Generation, str], bool], code: str, message: str) -> int:
        """End the commands under way `which` picks (their calls answered `code`); how many."""
        ended = 0
        for run, (generation, cell) in list(self._runs.items()):
            if which(generation, cell):
                run.stop(code, message)
                ended += 1
        return ended

    @property
    def root(self) -> Path:
        """The workspace: configured, else the notebook's directory, else the kernel's working directory."""
        if self.workspace:
            return Path(self.workspace)
        notebook = self.supervisor.notebook
        if notebook and os.path.isabs(notebook) and os.path.isdir(os.path.dirname(notebook)):
            return Path(os.path.dirname(notebook))
        return Path.cwd()

    # -- a request ---------------------------------------------------------------------------------

    def _handle(self, token: str, request: Request, answer: Answer) -> None:
        call = request.get("call")
        if not isinstance(call, str) or not call:
            return answer(_refused(None, "invalid", "a request needs a call id"))
        if call in self._pending:
            self._pending[call].add(answer)  # a caller sending again: still one answer for it
            return
        if (reply := self._answers.get(call)) is not None:
            return answer(reply)
        reply = self._refusal(token, request)
        if reply is None:
            method = getattr(self, f"_call_{request.get('method')}", None)
            args = request.get("args")
            if method is None or not isinstance(args, dict):
                reply = _refused(call, "invalid", f"no host call {request.get('method')!r} with those arguments")
            else:
                self._pending[call] = {answer}
                try:
                    method(call, args, lambda result, c=call: self._done(c, {"call": c, "ok": True, "result": result}))
                except commands.Refused as e:
                    self._done(call, _refused(call, e.code, str(e)))
                except Exception as e:  # a bug in klbr: the call is still answered, the kernel serves on
                    self.log.exception("host call %s failed", request.get("method"))
                    self._done(call, _refused(call, "invalid", f"klbr failed on this call: {type(e).__name__}: {e}"))
                return
        self._record(call, reply)
        answer(reply)

    def _refusal(self, token: str, request: Request) -> Refusal | None:
        call = request["call"]
        generation = self._generations.get(token)
        if generation is None:
            return _refused(call, "stale_generation", "this call comes from a generation that has ended (a process "
                                                      "it left behind); make it from a cell of the current one")
        cell = self.supervisor.cells.cell
        if cell is None or cell.generation is not generation or request.get("cell") != cell.msg_id:
            return _refused(call, "not_running", "the cell this call was made for is not the one running "
                                                 "(a thread that outlived its cell?); end such threads before "
                                                 "their cell ends, or call from the running cell")
        if self._budget_cell != cell.msg_id:
            self._budget_cell, self._budget_used = cell.msg_id, 0
        self._budget_used += 1
        if self._budget_used > self.max_requests_per_cell:
            return _refused(call, "budget_exhausted", f"a cell may make {self.max_requests_per_cell} host calls "
                                                      "(HostService.max_requests_per_cell); the next cell has a new budget")
        return None

    def _done(self, call: str, reply: Reply) -> None:
        self._record(call, reply)
        for answer in self._pending.pop(call, ()):
            answer(reply)

    def _record(self, call: str | None, reply: Reply) -> None:
        if call is not None:
            self._answers.add(call, reply)

    # -- the calls: each gets (call id, args, done(result)); a refusal raises commands.Refused -------

    def _cell(self) -> RunningCell:
        """The cell a call is made for: `_refusal` admitted the call only from the running cell,
        in this same turn of the loop."""
        cell = self.supervisor.cells.cell
        assert cell is not None
        return cell

    def _call_inspect(self, call: str, args: dict[str, Any], done: Done) -> None:
        supervisor = self.supervisor
        cell = self._cell()
        generation = cell.generation
        deadline = cell.deadline
        memory = generation.memory
        if memory is not None:
            memory.sample()  # what the cell asks about is its memory now, not a second ago
        done({
            "session": supervisor.store.session_id,
            "kernel_session": supervisor.session.session,
            "generation": generation.number,
            "placement": generation.placement.spec,
            "identity": generation.identity(),
            "cell": cell.cell_id,
            "time_left": max(0.0, deadline.remaining()) if deadline is not None else None,
            "memory": memory.status() if memory is not None else None,
            "memory_limit": generation.memory_limit,
        })

    def _call_run(self, call: str, args: dict[str, Any], done: Done) -> None:
        cell = self._cell()
        time_left = cell.deadline.remaining() if cell.deadline is not None else None
        running = commands.Run(commands.check(args, self.root, time_left), self.supervisor.kill_grace, self._reaper)
        self._runs[running] = (cell.generation, cell.msg_id)

        async def run() -> None:
            try:
                done(await running.run())
            except commands.Refused as e:
                self._done(call, _refused(call, e.code, str(e)))
            finally:
                del self._runs[running]

        self.supervisor.start_task(run(), "a host command",
                                   lambda e: self._done(call, _refused(call, "invalid", f"the command failed: {e}")))

    def _scope(self) -> str:
        return self.supervisor.notebook or f"session:{self.supervisor.store.session_id}"

    def _call_put(self, call: str, args: dict[str, Any], done: Done) -> None:
        key, value = _key(args), args.get("value")
        if not isinstance(value, str):
            raise commands.Refused(code="invalid", message="the value must be JSON")
        if len(value.encode()) > MAX_VALUE:
            raise commands.Refused(code="too_large", message=f"a value may take at most {MAX_VALUE} bytes of JSON")
        try:
            json.loads(value)
        except ValueError:
            raise commands.Refused(code="invalid", message="the value is not JSON") from None
        store = self.supervisor.store
        if not store.recording:
            raise commands.Refused(code="forbidden", message="the cell log is not available: values cannot be kept")

        def written(error: StoreError | None) -> None:
            if error is None:
                done(None)
            else:
                self._done(call, _refused(call, "forbidden", f"the cell log cannot be written: {error}"))

        if store.kv_put(self._scope(), key, value, written):
            done(None)

    def _call_get(self, call: str, args: dict[str, Any], done: Done) -> None:
        key, store = _key(args), self._readable()
        done(queries.kv_get(store.reader(), self._scope(), key))

    def _call_keys(self, call: str, args: dict[str, Any], done: Done) -> None:
        done(queries.kv_keys(self._readable().reader(), self._scope()))

    def _readable(self) -> Store:
        store = self.supervisor.store
        if not store.recording:
            raise commands.Refused(code="forbidden", message="the cell log is not available: no values are kept")
        return store

    def _call_notify(self, call: str, args: dict[str, Any], done: Done) -> None:
        text = args.get("text")
        if not isinstance(text, str) or not text or len(text) > MAX_NOTE:
            raise commands.Refused(code="invalid",
                                   message=f"a note is a non-empty string of at most {MAX_NOTE} characters")
        cell = self._cell()
        self.supervisor.store.event("note", {"generation": cell.generation.number, "cell": cell.cell_id, "text": text})
        self.supervisor.listener.cell_note(cell.msg_id, text)
        done(None)

    def _call_restart(self, call: str, args: dict[str, Any], done: Done) -> None:
        reason = args.get("reason")
        if not isinstance(reason, str) or not reason:
            raise commands.Refused(code="invalid", message="restart needs a reason")
        self._after_cell(self._cell().msg_id, "restart", reason)
        done(None)

    def _call_relocate(self, call: str, args: dict[str, Any], done: Done) -> None:
        spec, msg_id = args.get("spec"), self._cell().msg_id

        async def relocate() -> None:  # the check may start the interpreter: not on the loop's time
            why = await problem(spec, self.supervisor.ssh, self.supervisor.engines)
            cell = self.supervisor.cells.cell
            if why is not None:
                self._done(call, _refused(call, "invalid", why))
            elif cell is None or cell.msg_id != msg_id:
                self._done(call, _refused(call, "not_running", "the cell ended before the placement was checked"))
            else:
                assert isinstance(spec, str)  # `problem` found none: a placement spec is a string
                self._after_cell(msg_id, "relocate", spec)
                done(None)

        self.supervisor.start_task(relocate(), "host.relocate",
                                   lambda e: self._done(call, _refused(call, "invalid", f"the check failed: {e}")))


def _key(args: dict[str, Any]) -> str:
    key = args.get("key")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise commands.Refused(code="invalid", message=f"a key is a non-empty string of at most {MAX_KEY} characters")
    return key


def _refused(call: str | None, code: str, message: str) -> Refusal:
    return {"call": call, "ok": False, "code": code, "message": message}
