"""When a generation starts serving or ends: what waited on it goes on, or is answered here.

An ended generation has delivered everything it sent (the supervisor drains it first, semantics 7);
then, for each request that was waiting on it, by its phase:

- finished (ANSWERED): nothing; its outcome's commit releases it;
- an execute that had its reply: its outcome stands, the proxy closes the bracket with its idle;
- an idempotent request, not retried yet: sent once more to the next generation (semantics 8);
- anything else in flight: answered with the error that names how the worker ended (semantics 2:
  nothing is re-run), and the executes queued behind it are aborted as after any error;
- forwarded comm and control traffic: its bracket is closed (control requests get an error reply).

Its widgets get `comm_close` and a debug session on it ends. A shutdown overrides all of this: what
waited is aborted and nothing is retried (semantics 13).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from klbr_supervisor.generation import Generation
from klbr_supervisor.policy import may_retry
from klbr_supervisor.states import Ending, EndReason

from .outcomes import CellError, ending_error, refusal_error, timeout_error
from .requests import CONTROL_REPLIES, QUEUED, Phase, Request

if TYPE_CHECKING:
    from .proxy import Proxy


class Endings:
    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def ready(self, generation: Generation) -> None:
        """`generation` takes requests: what waited for one goes to it."""
        proxy = self.proxy
        proxy.generation = generation
        held, proxy.held = proxy.held, []
        for req in held:
            proxy.guard(req, proxy.dispatch.forward, req)
        proxy.pump()

    def ended(self, generation: Generation, ending: Ending) -> None:
        """Answer everything that waited on `generation`; retry what is safe to retry."""
        proxy = self.proxy
        was_current = proxy.generation is generation
        proxy.generation = None
        waiting, proxy.waiting = proxy.waiting, {}
        inflight = proxy.queue.inflight
        if ending.reason is EndReason.SHUTDOWN:
            for req in waiting.values():
                proxy.guard(req, proxy.answers.abort, req)
            return
        for req in waiting.values():
            if req is not inflight:
                proxy.guard(req, self._close_forwarded, req, ending, generation)
        self._close_worker_state(generation)
        if inflight is not None and inflight.generation is generation and inflight.phase is Phase.SENT:
            proxy.guard(inflight, self._inflight_ended, inflight, ending, generation)
        elif was_current and ending.reason is EndReason.LOST:
            proxy.delivery.notice = (
                f"klbr: the worker of generation {generation.number} (pid {generation.pid}) "
                f"{ending.how} while idle; its namespace is gone. This cell runs in a new generation.\n"
            )
        if ending.reason is EndReason.START_FAILED:
            # No worker to wait for: everything queued gets the same answer now, never a hang.
            for req in proxy.queue.clear() + proxy.held:
                proxy.guard(req, self._answer_failed_start, req, ending, generation)
            proxy.held.clear()
        elif (refusal := proxy.supervisor.refusal(None)) is not None:  # a crash loop, a lost link
            held, proxy.held = proxy.held, []
            for req in held:  # comm and control traffic that waited for a generation
                proxy.guard(req, proxy.answers.refuse_forwarded, req, refusal_error(refusal))
            proxy.pump()  # everything queued is refused with its error

    def _close_forwarded(self, req: Request, ending: Ending, generation: Generation) -> None:
        """comm and control traffic the worker never finished: close its bracket."""
        req.move(Phase.ANSWERED)
        content = None
        if req.channel == "control" and req.msg_type in CONTROL_REPLIES:
            content = {"status": "error", **self.error(ending, generation, req).content()}
        self.proxy.replies.own(req, content)
        req.move(Phase.DONE)

    def _close_worker_state(self, generation: Generation) -> None:
        proxy = self.proxy
        parent = proxy.last_execute.header if proxy.last_execute else {}
        for comm_id in sorted(proxy.open_comms):
            # Its widgets lived in the dead worker: tell the frontend they are gone.
            proxy.frontend.send_iopub("comm_close", {"comm_id": comm_id, "data": {}}, parent)
        proxy.open_comms.clear()
        if proxy.debugging:
            proxy.frontend.send_iopub("debug_event", {"type": "event", "seq": 0, "event": "terminated", "body": {}}, parent)
            proxy.debugging = False

    def _inflight_ended(self, req: Request, ending: Ending, generation: Generation) -> None:
        proxy = self.proxy
        if req.reply is not None and req.msg_type == "execute_request":
            proxy.delivery.close_bracket(req)
        elif ending.reason is not EndReason.START_FAILED and may_retry(req.msg_type, req.retried):
            req.retried = True  # idempotent: once more on the next generation
            req.reply = req.idle = None
            req.move(Phase.QUEUED)
            proxy.queue.put_back(req)
        else:
            proxy.answers.here(req, error=self.error(ending, generation, req))

    def _answer_failed_start(self, req: Request, ending: Ending, generation: Generation) -> None:
        if req.channel == "shell" and req.msg_type in QUEUED:
            self.proxy.answers.here(req, error=self.error(ending, generation, req))
        else:
            self._close_forwarded(req, ending, generation)

    def error(self, ending: Ending, generation: Generation, req: Request) -> CellError:
        """The error that tells `req` how its generation ended."""
        supervisor = self.proxy.supervisor
        if ending.reason is EndReason.DEADLINE and req.msg_type == "execute_request":
            return timeout_error(req.count or supervisor.counts.last + 1, supervisor.policy.timeout_for(req.timeout),
                                 killed=True, generation=generation.number, pid=generation.pid, how=ending.how)
        count = req.count if req.count is not None else supervisor.counts.last + 1
        cell = f"cell [{count}]" if req.msg_type == "execute_request" and req.counts else "this request"
        return ending_error(ending, generation=generation.number, pid=generation.pid, cell=cell)
