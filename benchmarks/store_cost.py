"""What the cell log costs the proxy process per trivial cell, the store alone: seconds to A/B a
store change, where `proxy_cost.py --callgrind` takes a minute.

Each cell makes the calls the proxy makes for a trivial execute, in its order, through the same
objects (`Resends.duplicate` and so `CellLog.recorded_execute`, then `CellLog.start`, a turn of the
loop, `CellLog.finish` with an execute_reply's content, `Brackets.replied`), on a `Store` over a file
of its own, inside a running asyncio loop. The requests are stand-ins with the attributes those
calls read: a jupyter_client msg_id and client session, a signed digest, `pass`.

    .venv/bin/python benchmarks/store_cost.py [--cells 2000]   CPU seconds per cell (noisy)
    .venv/bin/python benchmarks/store_cost.py --callgrind      instructions per cell (exact to ~0.1%)

With --callgrind it runs itself twice under valgrind's callgrind, with `--cells` and with `--cells`
plus `--more` cells, every thread counted (the writer's checkpoints too), and prints the difference
per cell: start-up, imports and warm-up cancel out. `--clients N` spreads the cells over N client
sessions taking turns; `--existing N` first fills the file with N cells of another session (an
old file: the index pages a cell touches are then not all in the cache); `--jupyterlab` sends
them as JupyterLab does (uuid msg_ids, a frontend cell id in the metadata: cells_frontend too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from klbr_kernel.cell_log.recording import CellLog
from klbr_kernel.proxy.brackets import Brackets
from klbr_kernel.requests.execute import Execute
from klbr_supervisor.store import Store


class _Wire:
    def __init__(self, metadata: bytes):
        self.body = (b"", b"", b"", metadata, b"")  # metadata (body[3]): what `frontend_cell_id` reads


class _Execute:
    """A trivial execute_request as `Resends`, `Brackets` and `CellLog` read it: its own state is
    klbr's `Execute`, the rest what they read of a `Request`."""

    msg_type = "execute_request"
    counts = True
    code = "pass"
    generation = None

    def __init__(self, client: str, msg_id: str, digest: str, metadata: bytes = b"{}"):
        self.wire = _Wire(metadata)
        self.header = {"session": client, "msg_id": msg_id}
        self.msg_id = msg_id
        self.execute = Execute(digest=digest)

    @property
    def digest(self) -> str:
        return self.execute.digest

    @property
    def record(self) -> Any:
        return self.execute.record


def _settled(error: object) -> None:
    if error is not None:
        msg = f"a write failed: {error}"
        raise SystemExit(msg)


async def _cells(store: Store, n: int, clients: list[str], counter: list[int], jupyterlab: bool = False) -> None:
    log = CellLog(store)
    brackets = Brackets(None, None, log)  # type: ignore[arg-type]  # a new execute sends nothing
    pid = os.getpid()
    for _ in range(n):
        counter[0] += 1
        i = counter[0]
        client = clients[i % len(clients)]
        if jupyterlab:  # a uuid per msg_id, and one of 50 notebook cells' ids in the metadata
            metadata = (b'{"deletedCells":[],"recordTiming":false,"cellId":"%08d-cell-of-the-notebook"}' % (i % 50))
            req = _Execute(client, str(uuid.uuid4()), f"{i:064x}", metadata)
        else:  # jupyter_client's msg_ids and metadata
            req = _Execute(client, f"{client}_{pid}_{i}", f"{i:064x}")
        if brackets.resends.duplicate(req):  # type: ignore[arg-type]
            msg = "a new execute was taken for a resend"
            raise SystemExit(msg)
        if not log.start(req, 1, _settled):  # type: ignore[arg-type]
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the worker runs it
        content = {"status": "ok", "execution_count": i, "user_expressions": {}, "payload": []}
        brackets.decided(req, content)  # type: ignore[arg-type]
        if not log.finish(req, content, _settled):  # type: ignore[arg-type]
            await asyncio.sleep(0)
        brackets.replied(req)  # type: ignore[arg-type]


async def _run(path: str, cells: int, warmup: int, clients: int, existing: int, jupyterlab: bool) -> float:
    if existing:
        old = Store(path=path)
        old.open(uuid=str(uuid.uuid4()), notebook=None, kernel="klbr")
        await _cells(old, existing, [str(uuid.uuid4())], [0], jupyterlab)
        old.close()
    store = Store(path=path)
    if not store.open(uuid=str(uuid.uuid4()), notebook=None, kernel="klbr"):
        msg = f"the store did not open: {store.unavailable}"
        raise SystemExit(msg)
    names = [str(uuid.uuid4()) for _ in range(clients)]
    counter = [existing]
    await _cells(store, warmup, names, counter, jupyterlab)
    start = time.process_time()
    await _cells(store, cells, names, counter, jupyterlab)
    spent = time.process_time() - start
    store.close()
    return spent


def _callgrind(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        msg = "valgrind is not installed: make bench-deps"
        raise SystemExit(msg)
    totals = []
    for cells in (args.cells, args.cells + args.more):
        with tempfile.TemporaryDirectory(prefix="klbr-store-cost-") as tmp:
            out = Path(tmp) / "callgrind.out"
            argv = [sys.executable, __file__, "--cells", str(cells), "--warmup", str(args.warmup),
                    "--clients", str(args.clients), "--existing", str(args.existing),
                    *(["--jupyterlab"] if args.jupyterlab else [])]
            subprocess.run(["valgrind", "--quiet", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],  # noqa: S603, S607 — our own argv
                           check=True, capture_output=True)
            found = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.MULTILINE)
            assert found is not None, "callgrind wrote no total"
            totals.append(int(found.group(1)))
    print(f"store instructions per trivial cell: {(totals[1] - totals[0]) / args.more:,.0f}"
          f" ({args.more} cells, {args.clients} client session(s), {args.existing} cells before"
          f"{', as from JupyterLab' if args.jupyterlab else ''})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=2000, help="cells measured (with --callgrind: of the short run)")
    ap.add_argument("--warmup", type=int, default=200, help="cells run before measuring")
    ap.add_argument("--more", type=int, default=1000, help="with --callgrind: cells the long run adds")
    ap.add_argument("--clients", type=int, default=1, help="client sessions the cells come from, taking turns")
    ap.add_argument("--existing", type=int, default=0, help="cells of an earlier session in the file first")
    ap.add_argument("--jupyterlab", action="store_true",
                    help="executes as JupyterLab sends them: uuid msg_ids, a cellId in the metadata")
    ap.add_argument("--callgrind", action="store_true", help="instructions per cell, under callgrind")
    args = ap.parse_args()
    if args.callgrind:
        _callgrind(args)
        return
    with tempfile.TemporaryDirectory(prefix="klbr-store-cost-") as tmp:
        spent = asyncio.run(_run(os.path.join(tmp, "klbr.sqlite3"), args.cells, args.warmup, args.clients,
                                 args.existing, args.jupyterlab))
    print(f"store CPU per trivial cell: {spent / args.cells * 1e6:.1f} us ({args.cells} cells)")


if __name__ == "__main__":
    main()
