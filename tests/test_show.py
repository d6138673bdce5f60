"""What the notebook shows is true (issue 38), in a real JupyterLab and a real Notebook 7 driven in
Debian's chromium: a renamed notebook keeps its history across a server restart and a new
Untitled.ipynb gets none of it; no "reached no notebook" notice for outputs the extension put back,
in the page or the saved file; the messages a user reads in the cell say why; the memory figure
moves while a cell allocates; JupyterLab's debugger stops a cell and shows its frames and
variables; Notebook 7 has a klbr entry. Screenshots go to build/test-artifacts."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from playwright.sync_api import expect

from lab import (
    cell,
    kernel_shown,
    notebook,
    open_notebook,
    output_text,
    run_cell,
    running,
    save,
    screenshot,
)
from utils import until

pytestmark = pytest.mark.browser

# Prints a line every 0.25 s, at least `n` lines, and goes on until the file `go` exists.
PRINTING = ("import os, time\ni = 0\nwhile i < {n} or not os.path.exists({go!r}):\n"
            "    print(f'line {{i}}', flush=True)\n    i += 1\n    time.sleep(0.25)")
NOTICE = "reached no notebook"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # Two automatic new generations per kernel: the crash-loop test reaches the limit at its third death.
    config = "c.Supervisor.interrupt_grace = 1.0\nc.Supervisor.restart_limit = 2\n"
    with running(tmp_path_factory.mktemp("lab"), config=config) as server:
        yield server


def _sessions(db) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT notebook FROM sessions ORDER BY id")]
    finally:
        conn.close()


def _status(db, part: str) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT status FROM cells WHERE instr(code, ?) ORDER BY id", (part,))]
    finally:
        conn.close()


def _rename(page, new_name: str, title: str | None = None) -> None:
    """Rename the notebook as its menu does (File > Rename Notebook…) in JupyterLab, or, in Notebook
    7, by a click on its `title` at the top: the app's own dialog either way."""
    if title is not None:
        page.get_by_role("heading", name=title).click()
    else:
        page.evaluate("() => { void window.jupyterapp.commands.execute('docmanager:rename'); }")  # ends with the dialog
    field = page.locator(".jp-Dialog input")
    expect(field).to_be_visible(timeout=30_000)
    field.fill(new_name)
    field.press("Enter")
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel).to_have_attribute("data-klbr-notebook", new_name, timeout=30_000)  # the kernel was told


def test_a_renamed_new_notebook_keeps_its_history_and_a_new_untitled_gets_none(tmp_path, browser):
    root = tmp_path
    notebook(root, "Untitled.ipynb", ["print('first output')", "6 * 7", "%klbr history"])
    with running(root) as server:
        page = open_notebook(browser, server, "Untitled.ipynb")
        run_cell(page, 0)
        run_cell(page, 1)
        expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("42", timeout=60_000)
        _rename(page, "analysis.ipynb")
        # The kernel answered once it took the path; its writer commits it a moment later.
        until(lambda: _sessions(server.db) == [str(root / "analysis.ipynb")], 30, "the session filed under the new name")
        page.close()  # never saved: the file has no outputs
    with running(root) as server:  # the server restarts
        page = open_notebook(browser, server, "analysis.ipynb")
        expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("first output", timeout=60_000)
        expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("42", timeout=60_000)
        run_cell(page, 2)
        expect(cell(page, 2).locator(".jp-OutputArea")).to_contain_text("print('first output')", timeout=60_000)
        assert "6 * 7" in output_text(page, 2)
        screenshot(page, "show-renamed-restored.png")
        # Save as: the page works on in the new file, and the kernel files the session under it.
        page.evaluate("() => { void window.jupyterapp.commands.execute('docmanager:save-as'); }")
        field = page.locator(".jp-Dialog input")
        expect(field).to_be_visible(timeout=30_000)
        field.fill("analysis-v2.ipynb")
        field.press("Enter")
        expect(page.locator(".jp-NotebookPanel:visible")).to_have_attribute(
            "data-klbr-notebook", "analysis-v2.ipynb", timeout=30_000)
        until(lambda: _sessions(server.db)[-1] == str(root / "analysis-v2.ipynb"), 30, "the session is filed anew")
        page.close()
        # A copy (cp) holds the same cell ids: it shows what they ran.
        (root / "copy.ipynb").write_text((root / "analysis.ipynb").read_text())
        page = open_notebook(browser, server, "copy.ipynb")
        expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("42", timeout=60_000)
        page.close()
        # A second new notebook: none of those cells.
        notebook(root, "Untitled.ipynb", ["%klbr history"])
        page = open_notebook(browser, server, "Untitled.ipynb")
        run_cell(page, 0)
        expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("No cells recorded yet.", timeout=60_000)
        assert "first output" not in page.locator(".jp-Notebook").inner_text()
        screenshot(page, "show-new-untitled.png")


def test_no_notice_of_outputs_the_extension_put_back_in_the_page_or_the_saved_file(lab, browser):
    go = lab.root / "closed-go"
    path = notebook(lab.root, "closed.ipynb", [PRINTING.format(n=8, go=str(go)), "'the next cell'"])
    page = open_notebook(browser, lab, "closed.ipynb")
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 2", timeout=60_000)
    page.close()  # its reply will find no one: the kernel would notice it in the next cell
    go.touch()
    until(lambda: _status(lab.db, str(go)) == ["ok"], 60, "the cell ends with no page open")
    page = open_notebook(browser, lab, "closed.ipynb")
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 7", timeout=60_000)
    expect(page.locator(".jp-NotebookPanel:visible")).to_have_attribute(
        "data-klbr-notice", re.compile("restored the outputs of 1 cell"), timeout=60_000)
    run_cell(page, 1)
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("the next cell", timeout=60_000)
    assert NOTICE not in page.locator(".jp-Notebook").inner_text()
    screenshot(page, "show-no-false-notice.png")
    save(page)
    until(lambda: "the next cell" in path.read_text(), 30, "the notebook is saved")
    assert NOTICE not in path.read_text()
    lab.shut_down_kernels()


def test_the_messages_say_why_in_the_cell(lab, browser):
    notebook(lab.root, "why.ipynb", [
        "%klbr memory 512M", "%klbr restart", "x = bytearray(2 << 30)",
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ignoring interrupts')\n"
        "time.sleep(120)"])
    page = open_notebook(browser, lab, "why.ipynb")
    for i in range(3):
        run_cell(page, i)
        expect(cell(page, i).locator(".jp-InputArea-prompt")).to_have_text(f"[{i + 1}]:", timeout=60_000)
    assert "The next generation's memory limit is 512 MiB" in output_text(page, 0)
    expect(cell(page, 2).locator(".jp-OutputArea")).to_contain_text(
        "this worker's memory limit of 512 MiB stopped an allocation; the namespace is kept", timeout=30_000)
    assert "Supervisor.memory_limit" in output_text(page, 2)
    cell(page, 2).scroll_into_view_if_needed()
    screenshot(page, "show-memory-error.png")
    run_cell(page, 3)
    expect(cell(page, 3).locator(".jp-OutputArea")).to_contain_text("ignoring interrupts", timeout=60_000)
    page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:interrupt-kernel'); }")
    expect(cell(page, 3).locator(".jp-OutputArea")).to_contain_text("WorkerKilled", timeout=60_000)
    text = output_text(page, 3)
    assert "did not stop when interrupted: it ignored the interrupt for 1 s (Supervisor.interrupt_grace), " \
           "so klbr ended its worker" in text, text
    assert "the next cell runs in a new generation" in text
    screenshot(page, "show-worker-killed.png")
    lab.shut_down_kernels()


def _to_top(page, index: int) -> None:
    """Scroll cell `index` to the top of the notebook, clear of the toasts in the bottom corner."""
    cell(page, index).evaluate("node => node.scrollIntoView({block: 'start'})")


def test_a_death_between_cells_and_the_crash_loop_say_why_in_the_cell(lab, browser):
    """The worker dies between cells: the next cell's notice says so. Two more deaths reach
    `Supervisor.restart_limit` (2 here): the last promises no new generation, the next cell is
    refused with `CrashLoop`. Each as the user reads it, kept as a screenshot."""
    go = lab.root / "ends-go"
    notebook(lab.root, "ends.ipynb", [
        f"import os, threading, time\nprint('pid', os.getpid())\ndef end():\n"
        f"    while not os.path.exists({str(go)!r}):\n        time.sleep(0.05)\n    os._exit(1)\n"
        "threading.Thread(target=end, daemon=True).start()",
        "print('the next cell')",
        "import os\nos._exit(1)  # the second death",
        "import os\nos._exit(1)  # the third death",
        "'refused'"])
    page = open_notebook(browser, lab, "ends.ipynb")
    item = page.locator(".klbr-StatusItem")
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("pid ", timeout=60_000)
    pid = int(re.search(r"pid (\d+)", output_text(page, 0)).group(1))
    expect(item).to_contain_text("generation 1", timeout=60_000)
    go.touch()  # the cell has ended: its worker ends between cells
    expect(item).to_contain_text("generation 2", timeout=60_000)  # the supervisor saw it, and took the spare
    run_cell(page, 1)
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("the next cell", timeout=60_000)
    text = output_text(page, 1)
    assert ("klbr: the worker ended while idle, between cells: the namespace it held is gone (the outputs and the "
            "cell log are kept), and this cell runs in a new generation.") in text, text
    assert "`%klbr rebuild --plan` shows them" in text and f"Generation 1 (pid {pid}): exited with status 1." in text
    _to_top(page, 1)
    screenshot(page, "show-idle-death.png")
    run_cell(page, 2)
    expect(cell(page, 2).locator(".jp-OutputArea")).to_contain_text("WorkerLost", timeout=60_000)
    assert "the next cell runs in a new generation." in output_text(page, 2)
    run_cell(page, 3)
    expect(cell(page, 3).locator(".jp-OutputArea")).to_contain_text("WorkerLost", timeout=60_000)
    text = output_text(page, 3)
    assert ("Cell [4] did not finish: its worker process died. Its namespace is gone and nothing was re-run; klbr "
            "starts no new generation now: it started 2 new generations for workers that ended within 300 s "
            "(Supervisor.restart_limit), "
            "and stops rather than loop. Fix the cause, then run `%klbr restart`.") in text, text
    assert "new generation." not in text and "Generation 3 (pid " in text, text
    assert "after `%klbr restart`, `%klbr rebuild` runs them again" in text, text  # a rebuild now is refused
    # The page says so too, naming the notebook, and offers no rebuild (one would be refused).
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel).to_have_attribute("data-klbr-generation-notice", re.compile(
        r"^klbr, ends\.ipynb: generation 3 ended \(lost: exited with status 1\), and no new generation starts "
        r"\(CrashLoop\): klbr started 2 new generations for workers that ended within 300 s"), timeout=30_000)
    expect(item).to_have_text(re.compile(r"^klbr: no generation · local · recording$"), timeout=30_000)
    toast = page.locator(".Toastify__toast").filter(has_text="ends.ipynb: generation 3 ended")
    expect(toast).to_be_in_viewport(ratio=1, timeout=30_000)  # slid in, for the screenshot
    assert toast.get_by_role("button", name=re.compile("Rebuild")).count() == 0
    _to_top(page, 3)
    screenshot(page, "show-crash-loop-last-death.png")
    run_cell(page, 4)
    expect(cell(page, 4).locator(".jp-OutputArea")).to_contain_text("CrashLoop", timeout=60_000)
    text = output_text(page, 4)
    assert ("Nothing ran: klbr started 2 new generations for workers that ended within 300 s, and then stopped "
            "rather than loop. Fix the cause, then run `%klbr restart` to start a fresh generation.") in text, text
    assert "Supervisor.restart_limit" in text
    _to_top(page, 4)
    screenshot(page, "show-crash-loop-refused.png")
    lab.shut_down_kernels()


def test_the_memory_figure_moves_while_a_cell_allocates(lab, browser):
    go = lab.root / "memory-go"
    notebook(lab.root, "memory.ipynb", [
        f"import os, time\nkept = []\nwhile not os.path.exists({str(go)!r}):\n"
        "    kept.append(b'x' * (32 << 20)) if len(kept) < 12 else None\n    time.sleep(0.5)"])
    page = open_notebook(browser, lab, "memory.ipynb")
    item = page.locator(".klbr-StatusItem")
    expect(item).to_have_text(re.compile(r"· \d+ MiB$"), timeout=60_000)

    def mib() -> int:
        return int(re.search(r"(\d+) MiB$", item.inner_text()).group(1))

    before = mib()
    run_cell(page, 0)
    until(lambda: mib() >= before + 200, 60, "the status item shows the worker growing")
    assert cell(page, 0).locator(".jp-InputArea-prompt").inner_text().strip() == "[*]:"  # while it runs
    screenshot(page, "show-memory-moving.png")
    go.touch()
    expect(cell(page, 0).locator(".jp-InputArea-prompt")).to_have_text("[1]:", timeout=60_000)
    lab.shut_down_kernels()


def _variables_shown(page) -> list[list[str]]:
    """The debugger panel's variables, as [name, value] pairs, of the scope it shows."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.jp-DebuggerVariables-body:not(.lm-mod-hidden) .jp-DebuggerVariables-name')).map(
        n => [n.textContent.trim(), (n.nextElementSibling ? n.nextElementSibling.textContent : '').trim()])""")


def test_jupyterlab_s_debugger_stops_a_cell_at_its_breakpoint_and_shows_its_variables(lab, browser):
    """JupyterLab's debugger on klbr, as a user drives it: the toggle starts it (debugpy loads in the
    worker then: decision 72), the variables panel shows the notebook's names, a cell's
    `breakpoint()` stops it with the cell's frames alone in the call stack (none of klbr's worker)
    and its locals shown, and Continue lets it finish with its result."""
    notebook(lab.root, "debugged.ipynb", ["x_seen = 42", "def f(a):\n    b = a + 1\n    breakpoint()\n    return b * 10\n\nf(1)"])
    page = open_notebook(browser, lab, "debugged.ipynb")
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-InputArea-prompt")).to_have_text("[1]:", timeout=60_000)
    toggle = page.locator(".jp-NotebookPanel:visible .jp-DebuggerBugButton")
    expect(toggle).to_be_enabled(timeout=60_000)
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true", timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('debugger:show-panel')")
    until(lambda: ["x_seen", "42"] in _variables_shown(page), 60, "the panel shows the notebook's x_seen")
    run_cell(page, 1)
    frames = page.locator(".jp-DebuggerCallstackFrame-name")
    expect(frames).to_have_text(["f", "<module>"], timeout=60_000)
    expect(page.locator(".jp-DebuggerCallstackFrame-location")).to_have_text(["Cell [*]:4", "Cell [*]:6"])
    page.locator(".jp-DebuggerSidebar select").first.select_option("Locals")
    until(lambda: ["a", "1"] in _variables_shown(page) and ["b", "2"] in _variables_shown(page), 60,
          "the panel shows f's locals")
    assert cell(page, 1).locator(".jp-InputArea-prompt").inner_text().strip() == "[*]:"  # stopped in it
    screenshot(page, "show-debugger-stopped.png")
    page.evaluate("() => window.jupyterapp.commands.execute('debugger:continue')")
    expect(cell(page, 1).locator(".jp-InputArea-prompt")).to_have_text("[2]:", timeout=60_000)
    assert "20" in output_text(page, 1)
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "false", timeout=60_000)
    lab.shut_down_kernels()


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    with running(tmp_path_factory.mktemp("nb7"), app="notebook") as server:
        yield server


def test_notebook_7_restores_names_no_false_notice_has_a_klbr_entry_and_follows_a_rename(notebook7, browser):
    go = notebook7.root / "nb7-go"
    notebook(notebook7.root, "seven.ipynb", [PRINTING.format(n=40, go=str(go)), "'after'"])
    page = open_notebook(browser, notebook7, "seven.ipynb")
    entry = page.locator(".klbr-ToolbarItem")  # Notebook 7 has no status bar
    expect(entry).to_have_text(re.compile(r"^klbr: generation 1 · local · recording"), timeout=60_000)
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 4", timeout=60_000)
    page.reload()
    kernel_shown(page, "busy")  # the restored cell still runs
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 3", timeout=60_000)
    expect(page.locator(".jp-NotebookPanel:visible")).to_have_attribute(
        "data-klbr-notice", re.compile("restored the outputs of 1 cell; following"), timeout=60_000)
    screenshot(page, "show-notebook7-restored.png")
    go.touch()
    expect(cell(page, 0).locator(".jp-InputArea-prompt")).to_have_text("[1]:", timeout=60_000)
    run_cell(page, 1)
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("'after'", timeout=60_000)
    assert NOTICE not in page.locator(".jp-Notebook").inner_text()
    _rename(page, "renamed-seven.ipynb", title="seven")
    until(lambda: _sessions(notebook7.db)[-1] == str(notebook7.root / "renamed-seven.ipynb"), 30,
          "the session filed under the new name")
    entry.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".klbr-StatusDialog")).to_contain_text("cell log", timeout=30_000)
    # The session's generations on a line: this one, serving, with the cells it ran.
    expect(dialog.locator(".klbr-Generation")).to_have_count(1)
    expect(dialog.locator(".klbr-Generation")).to_contain_text("generation 1")
    assert "serving now; 2 cells" in dialog.locator(".klbr-Generation").inner_text()
    screenshot(page, "show-notebook7-status.png")
    page.keyboard.press("Enter")  # Close is the default: Enter restarts nothing
    expect(dialog).to_have_count(0, timeout=30_000)
    expect(entry).to_have_text(re.compile(r"^klbr: generation 1 "), timeout=30_000)
    saved = json.loads((notebook7.root / "renamed-seven.ipynb").read_text())
    assert len(saved["cells"]) == 2
    notebook7.shut_down_kernels()
