"""A cell of `%klbr` lines carried out and answered.

A cell made only of `%klbr` lines is the proxy's (see `magics.parse`): the proxy starts it from the
queue, or at once for a replay, and `MagicCells.run` answers it like any cell (its count, its
outputs recorded, its reply once its row is committed).
"""

from __future__ import annotations

from klbr_supervisor.supervisor import Supervisor

from ..cell_log.recording import CellLog
from ..frontend.sockets import Frontend
from ..magics.commands import magic_output
from ..magics.parse import rebuild_spec, replay_spec
from ..magics.rebuild import Rebuild, RebuildStopped
from ..magics.replay import Replay
from ..requests.outcomes import CellError
from ..requests.request import Phase, Request
from .own import OwnAnswers


class MagicCells:
    def __init__(self, own: OwnAnswers, replay: Replay, rebuild: Rebuild, supervisor: Supervisor, cell_log: CellLog,
                 frontend: Frontend):
        self._own = own
        self._replay = replay
        self._rebuild = rebuild
        self._supervisor = supervisor
        self._cell_log = cell_log
        self._frontend = frontend

    async def run(self, req: Request) -> None:
        """A cell of `%klbr` lines (phase PROXY), carried out by the supervisor (`magic_output`) or
        the `replay` or the `rebuild`; what each line prints is shown as it is done, then the cell is answered."""
        error = None
        # A notice of the cell a replay shows is not given in the replay's own cell.
        self._replay.acted_on(req.magics or ())
        self._own.begin(req)
        if req.magic_error:
            error = CellError("UsageError", f"Nothing ran, and the namespace is as it was: {req.magic_error}")
        else:
            command = ""
            try:
                for magic in req.magics or ():
                    command = magic.command
                    if magic.command == "replay":
                        await self._replay.run(req, replay_spec(magic.args))
                        continue
                    if magic.command == "rebuild":
                        await self._rebuild.run(req, rebuild_spec(magic.args))
                        continue
                    text = await magic_output(magic, self._supervisor, self._cell_log, self._frontend)
                    if text and not req.silent:
                        self._own.output(req, "stream", {"name": "stdout", "text": text})
            except ValueError as e:  # MagicError, and a bad argument
                error = CellError("UsageError", f"`%klbr {command}` was not carried out: {e}")
            except RebuildStopped as e:  # a cell of the plan did not end ok
                error = e.error
        if req.phase is Phase.PROXY:  # not answered meanwhile (a shutdown)
            self._own.here(req, error=error)
