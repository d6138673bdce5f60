"""`%klbr rebuild`: after a generation ends, the cells that built its namespace, from the cell log, in
the order they ran and with the code as it ran; shown first (`--plan`), run again only on request."""

from __future__ import annotations

import os
import signal

import pytest

from klbr_kernel.magics.parse import MagicError, RebuildSpec, line_magics, rebuild_spec
from klbr_kernel.magics.plan import NO_REBUILD, duration, previous_generation
from utils import execute, process_gone, start_kernel, status_row, stream_text, until

# The cells of the issue: three that build the namespace, one marked, one that raises.
BUILT = ["a = 1", "b = a + 1", "a = a * 10", "c = 3\n# klbr: no-rebuild (it would mail someone)",
         "raise ValueError('not this one')"]


def plan_lines(text: str) -> list[list[str]]:
    """The cells a plan lists, each as its position, `In[n]` and first word."""
    return [line.split()[:3] for line in text.splitlines() if "In[" in line and not line.startswith("`")]


def run_cells(kc, cells: list[str]) -> None:
    for code in cells:
        reply, _ = execute(kc, code)
        assert reply["content"]["status"] == ("error" if code.startswith("raise") else "ok"), reply["content"]


def lose_the_worker(kc) -> int:
    """SIGKILL the current worker while idle; the number of the generation that took over."""
    before = int(status_row(kc, "generation"))
    pid = int(status_row(kc, "pid"))
    os.kill(pid, signal.SIGKILL)
    assert process_gone(pid)
    return int(until(lambda: (n := status_row(kc, "generation")).isdigit() and int(n) > before and n, 30,
                     "a new generation took over"))


def test_rebuild_lines_parse():
    assert rebuild_spec(()) == RebuildSpec()
    assert rebuild_spec(("--plan", "--generation", "3", "--include-errors")) == RebuildSpec(True, 3, True)
    assert line_magics("%klbr rebuild --generation 2") is not None
    for bad in ("--plan --plan", "--generation", "--generation x", "--all", "2"):
        with pytest.raises(MagicError):
            line_magics(f"%klbr rebuild {bad}")


def test_no_rebuild_is_a_line_of_its_own():
    assert NO_REBUILD.search("x = 1\n# klbr: no-rebuild\n")
    assert NO_REBUILD.search("  #klbr:no-rebuild because it mails")
    assert not NO_REBUILD.search("x = '# klbr: no-rebuild'")
    assert not NO_REBUILD.search("# klbr: no-rebuilding")


def test_the_previous_generation_is_the_one_that_served_before_the_current():
    assert previous_generation([1, 3, 4], 5) == 4  # spares take numbers that never serve
    assert previous_generation([1, 3], 3) == 1
    assert previous_generation([1], 1) is None
    assert previous_generation([1, 2], None) == 2
    assert [duration(s) for s in (0.012, 2.14, 185)] == ["12 ms", "2.1 s", "3 min 05 s"]


def test_the_plan_lists_the_cells_that_built_the_lost_namespace_and_runs_nothing():
    with start_kernel() as (km, kc):
        run_cells(kc, BUILT)
        generation = lose_the_worker(kc)
        reply, outputs = execute(kc, "%klbr rebuild --plan")
        assert reply["content"]["status"] == "ok", reply["content"]
        text = stream_text(outputs)
        assert plan_lines(text) == [["[1/3]", "In[1]", "a"], ["[2/3]", "In[2]", "b"], ["[3/3]", "In[3]", "a"],
                                    ["-", "In[4]", "c"]], text
        assert "skipped: marked `# klbr: no-rebuild`" in text
        assert "Left out: 1 error" in text and "--include-errors" in text
        assert f"in generation {generation}" in text
        # Nothing ran: the namespace is the new generation's, empty.
        reply, _ = execute(kc, "a")
        assert reply["content"]["ename"] == "NameError"
        # With the errors, the cell that raised is in the plan too.
        _, outputs = execute(kc, "%klbr rebuild --plan --include-errors")
        assert plan_lines(stream_text(outputs))[-1] == ["[4/4]", "In[5]", "raise"]


def test_there_is_no_plan_without_an_earlier_generation_nor_for_the_current_one():
    with start_kernel() as (km, kc):
        reply, _ = execute(kc, "%klbr rebuild --plan")
        assert reply["content"]["ename"] == "UsageError"
        assert "no earlier generation" in reply["content"]["evalue"]
        current = status_row(kc, "generation")
        reply, _ = execute(kc, f"%klbr rebuild --plan --generation {current}")
        assert "is the current one" in reply["content"]["evalue"]
        reply, _ = execute(kc, "%klbr rebuild --plan --generation 99")
        assert "no generation 99" in reply["content"]["evalue"]
