"""Real notebooks through nbclient and papermill: klbr's outputs match plain ipykernel's."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import papermill
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
_MODEL_ID = re.compile(r"[0-9a-f]{32}")


def run(path: Path, kernel_name: str, tmp_path: Path, drop_klbr_only: bool = False):
    nb = nbformat.read(path, as_version=4)
    if drop_klbr_only:
        nb.cells = [c for c in nb.cells if "klbr-only" not in c.metadata.get("tags", [])]
    NotebookClient(nb, kernel_name=kernel_name, timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def normalised(nb, *, renumber: bool) -> list:
    """Code cells' outputs and counts, without what differs between any two runs (ids, times)."""
    cells = []
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "klbr-only" in cell.metadata.get("tags", []):
            continue
        count += 1
        outputs = _joined_streams(copy.deepcopy(cell.outputs))
        for out in outputs:
            if "execution_count" in out and renumber:
                out["execution_count"] = count
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                data["application/vnd.jupyter.widget-view+json"]["model_id"] = "MODEL"
                data["text/plain"] = _MODEL_ID.sub("MODEL", data.get("text/plain", ""))
        cells.append((cell.source, count if renumber else cell.execution_count, outputs))
    return cells


def _joined_streams(outputs: list) -> list:
    """Consecutive writes to one stream as one output, as a frontend shows them: where ipykernel's
    flush timer splits a print is not behaviour of either kernel."""
    joined = []
    for out in outputs:
        prev = joined[-1] if joined else None
        if prev is not None and out.get("output_type") == prev.get("output_type") == "stream" \
                and out.get("name") == prev.get("name"):
            prev["text"] += out["text"]
        else:
            joined.append(out)
    return joined


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_outputs_match_plain_ipykernel(path, tmp_path):
    klbr = run(path, "klbr", tmp_path)
    plain = run(path, "python3", tmp_path, drop_klbr_only=True)
    has_klbr_only = any("klbr-only" in c.metadata.get("tags", []) for c in klbr.cells)
    # Where klbr-only cells ran, counts shift: compare them renumbered; elsewhere exactly.
    ours, theirs = normalised(klbr, renumber=has_klbr_only), normalised(plain, renumber=has_klbr_only)
    assert len(ours) == len(theirs)
    for mine, plain_cell in zip(ours, theirs, strict=True):
        assert mine == plain_cell, f"cell {mine[0]!r} differs:\n{_summary(mine[2])}\nvs plain ipykernel:\n{_summary(plain_cell[2])}"


def _summary(outputs) -> str:
    return "\n".join(f"  {o['output_type']} {o.get('name', '')} {str(o.get('text', o.get('data', '')))[:60]!r}"
                     f" ({len(str(o.get('text', o.get('data', ''))))} chars)" for o in outputs)


def test_tour_shows_a_loss_and_recovery(tmp_path):
    nb = run(NOTEBOOKS[0].parent / "tour.ipynb", "klbr", tmp_path)
    loss = next(c for c in nb.cells if "os.kill" in c.source)
    (error,) = [o for o in loss.outputs if o.output_type == "error"]
    assert error.ename == "WorkerLost"
    assert "killed by signal 9 (SIGKILL)" in error.evalue
    after = nb.cells[nb.cells.index(loss) + 1]
    assert after.outputs[0].text == "x survived the loss: False\n"
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)


def test_papermill_runs_the_tour_with_a_parameter(tmp_path):
    """papermill runs every cell, the parameter applied, and reports the tour's deliberate loss.

    papermill fails a run on any error output (it ignores `raises-exception`), so the honest result
    of the tour is a `PapermillExecutionError` naming `WorkerLost` after all cells ran: not a hang,
    not a `DeadKernelError`.
    """
    out = tmp_path / "tour-out.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(
            str(NOTEBOOKS[0].parent / "tour.ipynb"), str(out), parameters={"greeting": "papermill"},
            kernel_name="klbr", progress_bar=False, cwd=str(tmp_path),
        )
    assert failure.value.ename == "WorkerLost"
    nb = nbformat.read(out, as_version=4)
    texts = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert "hello, papermill\n" in texts
    assert "the session carries on; execution counts keep rising\n" in texts


def test_nbclient_gets_a_cell_error_not_a_hang_when_the_worker_dies(tmp_path):
    """nbclient#319: a worker dying mid-cell used to hang the run or end it in DeadKernelError."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_code_cell("b = 2"),
        nbformat.v4.new_code_cell("import os\nos.kill(os.getpid(), 9)"),
        nbformat.v4.new_code_cell("c = 3"),
    ])
    client = NotebookClient(nb, kernel_name="klbr", timeout=60, resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as failure:
        client.execute()
    assert not isinstance(failure.value, DeadKernelError)
    assert "WorkerLost" in str(failure.value)
    assert nb.cells[2].outputs[-1].ename == "WorkerLost"
    assert nb.cells[3].execution_count is None  # nbclient stops at the error, as with any error
