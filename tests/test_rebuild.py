"""`%klbr rebuild`: after a generation ends, the cells that built its namespace, from the cell log, in
the order they ran and with the code as it ran; shown first (`--plan`), run again only on request."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from klbr_kernel.magics.parse import MagicError, RebuildSpec, line_magics, rebuild_spec
from klbr_kernel.magics.plan import NO_REBUILD, duration, previous_generation
from test_comm import Comm, reply_to, run_cell
from utils import collect, execute, process_gone, results, said, start_kernel, status_row, stream_text, until, value

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


# -- running the plan -------------------------------------------------------------------------------

def rebuild(kc, flags: str = "", timeout: float = 60) -> tuple[dict, str]:
    """`%klbr rebuild FLAGS`: its reply's content and what it printed."""
    reply, outputs = execute(kc, f"%klbr rebuild {flags}".strip(), timeout=timeout)
    return reply["content"], stream_text(outputs)


def progress(text: str) -> list[tuple[str, str, str]]:
    """The rebuild's progress lines: each cell's position, `In[n]` and how it ended."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) > 3 and words[0].startswith("[") and "…" in words:
            found.append((words[0], words[1], words[words.index("…") + 1]))
    return found


def log_rows(db: Path, query: str, *args) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(query, args).fetchall()


def test_a_rebuild_brings_the_namespace_back_without_the_skipped_cell(tmp_path):
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        run_cells(kc, BUILT)
        generation = lose_the_worker(kc)
        content, text = rebuild(kc)
        assert content["status"] == "ok", content
        assert progress(text) == [("[1/3]", "In[1]", "ok"), ("[2/3]", "In[2]", "ok"), ("[3/3]", "In[3]", "ok")], text
        assert "skipped: marked `# klbr: no-rebuild`" in text
        # The loss was answered by the rebuild: the next cell is not told of it again.
        _, outputs = execute(kc, "print(a, b)")
        assert stream_text(outputs) == "10 2\n"
        assert value(kc, "(a, b)") == (10, 2)
        reply, _ = execute(kc, "c")
        assert reply["content"]["ename"] == "NameError"  # the marked cell did not run
        # The rebuilt cells are cells of their own in the log, each linked to the one it repeats, in the
        # new generation, with no In[n]; the notebook's counts went on as they were.
        rows = log_rows(db, "SELECT r.generation, r.execution_count, r.status, r.code, o.execution_count FROM cells r"
                            " JOIN cells o ON o.id = r.rebuild_of ORDER BY r.id")
        assert rows == [(generation, None, "ok", code, n) for n, code in enumerate(BUILT[:3], 1)]
        assert reply["content"]["execution_count"] == content["execution_count"] + 3


def test_a_rebuilt_cells_outputs_go_to_the_log_not_the_notebook(tmp_path):
    with start_kernel() as (km, kc):
        execute(kc, "print('built', 6 * 7)\nx = 42\nx")
        lose_the_worker(kc)
        reply, outputs = execute(kc, "%klbr rebuild")
        assert reply["content"]["status"] == "ok"
        assert "built 42" not in stream_text(outputs) and not results(outputs)
        cell = re.search(r"ok \S+ \S+ \(cell (\d+)\)", stream_text(outputs)).group(1)
        _, replayed = execute(kc, f"%klbr replay {cell}")
        shown = [m["content"]["data"]["text/plain"] for m in replayed if m["msg_type"] == "display_data"]
        assert "built 42" in stream_text(replayed) and shown == ["42"]


def test_a_cell_that_fails_again_stops_the_rebuild_and_names_itself(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("saved")
    with start_kernel() as (km, kc):
        run_cells(kc, ["a = 1", f"text = open({str(data)!r}).read()", "b = a + 1"])
        data.unlink()
        lose_the_worker(kc)
        content, text = rebuild(kc)
        assert content["status"] == "error" and content["ename"] == "RebuildFailed", content
        assert progress(text) == [("[1/3]", "In[1]", "ok"), ("[2/3]", "In[2]", "error")]
        assert "FileNotFoundError" in text  # the failing cell's own error, shown
        user, detail = said(content["evalue"])
        assert user.startswith("The rebuild of generation 1 stopped at [2/3] In[2] (rebuilt as cell "), user
        assert user.endswith("): FileNotFoundError. Rebuilt: In[1]. Not rebuilt: In[2], In[3]. The namespace has what the rebuilt "
                             "cells made; fix the cause and run the rest yourself, or `%klbr restart` and "
                             "`%klbr rebuild --generation 1` to start over."), user
        assert detail.startswith("FileNotFoundError: "), detail  # the error that stopped it, in full, after
        assert value(kc, "a") == 1
        reply, _ = execute(kc, "b")
        assert reply["content"]["ename"] == "NameError"  # the cell after it did not run


def test_a_rebuild_after_a_move_runs_on_the_new_placement(tmp_path, other_python):
    with start_kernel() as (km, kc):
        run_cells(kc, ["a = 1", "b = a + 1", "a = a * 10"])
        reply, _ = execute(kc, f"%klbr placement python:{other_python}", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        content, text = rebuild(kc)
        assert content["status"] == "ok" and len(progress(text)) == 3, text
        assert value(kc, "(a, b, __import__('sys').executable)") == (10, 2, str(other_python))


def test_deadlines_and_interrupts_apply_to_each_rebuilt_cell(tmp_path):
    pause = tmp_path / "pause"
    pause.write_text("0")
    sleepy = f"import time\nprint('sleeping', flush=True)\ntime.sleep(float(open({str(pause)!r}).read()))\nslept = True"
    db = tmp_path / "log.sqlite3"
    with start_kernel(env={"KLBR_DB": str(db)}) as (km, kc):
        run_cells(kc, ["a = 1", sleepy, "b = 2"])
        pause.write_text("60")
        lose_the_worker(kc)
        # An interrupt stops it inside a cell, as any cell: KeyboardInterrupt, the rest not run.
        msg_id = kc.execute("%klbr rebuild")
        # Its worker runs it once it printed (the row is `running` before the worker sees it).
        until(lambda: log_rows(db, "SELECT 1 FROM cells c JOIN outputs o ON o.cell_id = c.id WHERE"
                                   " c.rebuild_of IS NOT NULL AND c.status = 'running' AND c.code LIKE '%time.sleep%'"),
              30, "the sleeping cell runs again")
        km.interrupt_kernel()
        reply, outputs = collect(kc, msg_id)
        assert reply["content"]["ename"] == "RebuildFailed", reply["content"]
        assert progress(stream_text(outputs)) == [("[1/3]", "In[1]", "ok"), ("[2/3]", "In[2]", "interrupted")]
        assert "KeyboardInterrupt" in reply["content"]["evalue"]
        # A deadline too: the cell is interrupted at it, and the namespace kept.
        execute(kc, "%klbr timeout 1")
        content, text = rebuild(kc, "--generation 1")
        assert progress(text)[-1] == ("[2/3]", "In[2]", "timeout") and "CellTimeout" in content["evalue"], text
        assert value(kc, "a") == 1


def test_the_poison_rule_holds_for_rebuilt_cells(tmp_path):
    switch = tmp_path / "switch"
    switch.write_text("live")
    killer = f"import os\nif open({str(switch)!r}).read() == 'die':\n    os.kill(os.getpid(), 9)"
    with start_kernel(extra_arguments=["--Supervisor.poison_after=1"]) as (km, kc):
        run_cells(kc, [killer, "a = 1"])
        switch.write_text("die")
        lose_the_worker(kc)
        content, text = rebuild(kc, "--generation 1")
        assert progress(text) == [("[1/2]", "In[1]", "lost")] and "WorkerLost" in content["evalue"], text
        # What it was building went with its generation: the text says so, and how to start over.
        assert "The namespace it was building is gone with its generation: `%klbr rebuild --generation 1` runs " \
            "the whole plan again" in content["evalue"] and "The namespace has what" not in content["evalue"], content
        # The same code killed its worker (poison_after times in a row): a rebuild does not run it again.
        content, text = rebuild(kc, "--generation 1")
        assert "stopped at [1/2] In[1] (not run): PoisonedCell" in content["evalue"], content
        assert progress(text) == []


# -- frontends without the extension ----------------------------------------------------------------

def test_the_message_of_a_lost_namespace_gives_the_line_that_shows_the_plan():
    with start_kernel() as (km, kc):
        run_cells(kc, ["a = 1", "b = a + 1"])
        reply, _ = execute(kc, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        content = reply["content"]
        assert content["ename"] == "WorkerLost", content
        way_back = content["evalue"].splitlines()[1]  # after the user's words, before the operator's detail
        assert "`%klbr rebuild --plan`" in way_back and "`%klbr rebuild`" in way_back, content["evalue"]
        # The line does what it says: the plan of the lost namespace, the cell that ended it left out.
        _, outputs = execute(kc, "%klbr rebuild --plan")
        assert plan_lines(stream_text(outputs)) == [["[1/2]", "In[1]", "a"], ["[2/2]", "In[2]", "b"]]
        # A worker lost while idle: the next cell's notice ends with it too.
        run_cells(kc, ["c = 3"])  # generation 2 serves
        lose_the_worker(kc)
        _, outputs = execute(kc, "1")
        notice = [m["content"]["text"] for m in outputs
                  if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
        assert notice and "while idle" in notice[0] and "`%klbr rebuild --plan`" in notice[0].splitlines()[1], notice


# -- the klbr comm's `plan`, which the JupyterLab extension offers ----------------------------------

def test_the_plan_op_offers_a_rebuild_and_says_which_cells_results_lost_their_variables(tmp_path):
    with start_kernel(env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        ids = ["c1", "c2", "c3"]
        for cell_id, code in zip(ids, BUILT[:3], strict=True):
            assert reply_to(kc, run_cell(kc, code, cell_id))["content"]["status"] == "ok"
        comm = Comm(kc)
        [answer] = comm.ask({"v": 1, "id": 1, "op": "plan"})
        assert answer["plan"] is None and answer["generations"] == dict.fromkeys(ids, 1), answer
        generation = lose_the_worker(kc)
        [answer] = comm.ask({"v": 1, "id": 2, "op": "plan"})
        plan = answer["plan"]
        assert answer["current"] == generation and answer["generations"] == dict.fromkeys(ids, 1)
        assert (plan["generation"], plan["cells"], plan["skipped"], plan["asked"], plan["rebuilt"]) == \
            (1, 3, 0, False, False), plan
        assert plan["end_reason"].startswith("lost") and "[3/3] In[3]" in plan["text"]
        # Rebuilt, the cells' results have their variables again: they belong to the new generation.
        content, _ = rebuild(kc)
        assert content["status"] == "ok"
        [answer] = comm.ask({"v": 1, "id": 3, "op": "plan"})
        assert answer["generations"] == dict.fromkeys(ids, generation) and answer["plan"]["rebuilt"] is True
        # A restart the user asked for: the plan is there, and says so (no offer pops up for it).
        execute(kc, "%klbr restart")
        [answer] = comm.ask({"v": 1, "id": 4, "op": "plan"})
        assert answer["plan"]["generation"] == generation and answer["plan"]["asked"] is True, answer


def test_with_the_errors_a_cell_that_raised_may_raise_again_and_the_rebuild_goes_on():
    with start_kernel() as (km, kc):
        for code in ["a = 1", "a = 2\nraise ValueError('after a = 2')", "b = a + 1"]:
            execute(kc, code)
        lose_the_worker(kc)
        content, text = rebuild(kc, "--include-errors")
        assert content["status"] == "ok", content
        assert progress(text) == [("[1/3]", "In[1]", "ok"), ("[2/3]", "In[2]", "error"), ("[3/3]", "In[3]", "ok")]
        assert "(as when it ran: ValueError)" in text
        assert value(kc, "(a, b)") == (2, 3)  # what it did before it raised, as then
