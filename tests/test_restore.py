"""Outputs come back into their cells by themselves (the klbr JupyterLab extension), in a real JupyterLab
driven in Debian's chromium: a reload mid-cell, a tab closed and reopened, a 4.4 notebook, a cell
never saved, an edited cell, two tabs. One server for the module; each test has its own notebook."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from playwright.sync_api import expect

from lab import (
    Lab,
    cell,
    idle,
    kernel_shown,
    notebook,
    open_notebook,
    output_text,
    prompt,
    run_cell,
    save,
    screenshot,
)
from utils import until

pytestmark = pytest.mark.browser

# Prints a line every 0.25 s, at least `n` lines (10 s), and goes on until the file `go` exists: it is
# still running when the reloaded page is there, however long a reload takes on a busy machine.
PRINTING = ("import os, time\ni = 0\nwhile i < {n} or not os.path.exists({go!r}):\n"
            "    print(f'line {{i}}', flush=True)\n    i += 1\n    time.sleep(0.25)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("lab"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def browser(lab, browser):
    """The module's chromium (conftest's), and the kernels a test started end after it."""
    yield browser
    lab.shut_down_kernels()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("line ")]


def _status(lab: Lab, part: str) -> list[str]:
    """The statuses of the recorded cells whose code contains `part`."""
    conn = sqlite3.connect(lab.db)
    try:
        return [r[0] for r in conn.execute("SELECT status FROM cells WHERE instr(code, ?) ORDER BY id", (part,))]
    finally:
        conn.close()


def _saved(path):
    """The notebook file as JupyterLab last saved it (None while a save is half written)."""
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def _notice(page) -> str:
    """The extension's last notice (also shown as a JupyterLab notification)."""
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel).to_have_attribute("data-klbr-notice", __import__("re").compile("."), timeout=60_000)
    return str(panel.get_attribute("data-klbr-notice"))


def test_a_reload_mid_cell_brings_every_line_back_and_the_queued_cell_fills(lab, browser):
    go = lab.root / "reload-go"
    notebook(lab.root, "reload.ipynb", [PRINTING.format(n=40, go=str(go)), "print('the queued cell ran')"])
    page = open_notebook(browser, lab, "reload.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)  # queued behind the first
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 4", timeout=60_000)
    page.reload()
    # Without typing anything: the lines printed so far are back, the cell is still running, and
    # the kernel indicator says so (it shows the last status the page had: decision 69).
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 3", timeout=60_000)
    kernel_shown(page, "busy")
    assert prompt(page, 0) == "[*]:" and prompt(page, 1) == "[*]:"
    assert "restored the outputs of 1 cell; following 2 cells" in _notice(page)
    toast = page.locator(".Toastify__toast").filter(has_text="klbr restored the outputs of 1 cell")
    expect(toast).to_be_in_viewport(ratio=1, timeout=30_000)  # slid in, for the screenshot
    screenshot(page, "restore-reload-running.png")
    go.touch()
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("the queued cell ran", timeout=60_000)
    idle(page)
    lines = _lines(output_text(page, 0))
    assert len(lines) >= 40 and lines == [f"line {i}" for i in range(len(lines))]
    assert prompt(page, 0) == "[1]:" and prompt(page, 1) == "[2]:"
    screenshot(page, "restore-reload-done.png")
    save(page)
    path = lab.root / "reload.ipynb"
    until(lambda: (_saved(path) or {"cells": [{}, {}]})["cells"][1].get("outputs"), 30, "the notebook is saved")
    saved = _saved(path)["cells"]
    text = "".join("".join(o["text"]) for o in saved[0]["outputs"] if o["output_type"] == "stream")
    assert _lines(text) == lines and saved[0]["execution_count"] == 1 and saved[1]["execution_count"] == 2


def test_a_tab_closed_mid_cell_and_reopened_after_it_ended_gets_its_outputs(lab, browser):
    go = lab.root / "closed-go"
    notebook(lab.root, "closed.ipynb", [PRINTING.format(n=8, go=str(go))])
    page = open_notebook(browser, lab, "closed.ipynb")
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 2", timeout=60_000)
    page.close()  # unsaved: the file has no outputs
    go.touch()
    until(lambda: _status(lab, str(go)) == ["ok"], 60, "the cell ends with no page open")
    page = open_notebook(browser, lab, "closed.ipynb")
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 7", timeout=60_000)
    lines = _lines(output_text(page, 0))
    assert lines == [f"line {i}" for i in range(len(lines))] and prompt(page, 0) == "[1]:"
    assert "restored the outputs of 1 cell" in _notice(page)
    screenshot(page, "restore-reopened.png")


def test_two_tabs_of_one_notebook_each_show_every_line_once(lab, browser):
    """The tab that ran the cell hears it itself; the second follows it through klbr: each stays right."""
    go = lab.root / "tabs-go"
    notebook(lab.root, "tabs.ipynb", [PRINTING.format(n=8, go=str(go))])
    context = browser.new_context(viewport={"width": 1400, "height": 900})  # two tabs of one browser
    first = open_notebook(browser, lab, "tabs.ipynb", context)
    run_cell(first, 0)
    expect(cell(first, 0).locator(".jp-OutputArea")).to_contain_text("line 2", timeout=60_000)
    second = open_notebook(browser, lab, "tabs.ipynb", context, state="busy")  # the cell runs
    expect(cell(second, 0).locator(".jp-OutputArea")).to_contain_text("line 2", timeout=60_000)
    assert prompt(second, 0) == "[*]:"
    go.touch()
    for page in (first, second):
        expect(cell(page, 0).locator(".jp-InputArea-prompt")).to_have_text("[1]:", timeout=60_000)
    shown = [_lines(output_text(page, 0)) for page in (first, second)]
    assert shown[0] == shown[1] == [f"line {i}" for i in range(len(shown[0]))] and len(shown[0]) >= 8
    screenshot(second, "restore-second-tab.png")


def test_an_edited_cell_is_left_as_it_is_and_its_outputs_are_offered(lab, browser):
    path = notebook(lab.root, "edited.ipynb", ["print('what ran')", "print('unchanged')"])
    page = open_notebook(browser, lab, "edited.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("unchanged", timeout=60_000)
    # The file changes elsewhere (another editor, a colleague's save): the first cell's code differs.
    nb = json.loads(path.read_text())
    nb["cells"][0]["source"] = "print('edited since')"
    path.write_text(json.dumps(nb))
    page.reload()
    idle(page)
    text = _notice(page)
    assert "restored the outputs of 1 cell" in text and "1 cell changed since it ran and was left as it is" in text
    assert output_text(page, 0).strip() == "" and "unchanged" in output_text(page, 1)
    screenshot(page, "restore-edited-notice.png")
    page.get_by_role("button", name="Apply the recorded outputs").click()
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("what ran", timeout=30_000)
    assert "edited since" in cell(page, 0).locator(".jp-InputArea-editor").inner_text()


def test_a_never_saved_cell_is_listed_for_replay(lab, browser):
    notebook(lab.root, "unsaved.ipynb", ["print('saved cell')"])
    page = open_notebook(browser, lab, "unsaved.ipynb")
    run_cell(page, 0)  # runs it, and inserts a new cell below it (the last one): never saved
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("saved cell", timeout=60_000)
    editor = cell(page, 1).locator(".cm-content")
    editor.click()
    editor.type("print('only on the page')")
    page.keyboard.press("Shift+Enter")
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("only on the page", timeout=60_000)
    conn = sqlite3.connect(lab.db)
    (record,) = conn.execute("SELECT id FROM cells WHERE code = 'print(''only on the page'')'").fetchone()
    conn.close()
    page.reload()
    idle(page)
    text = _notice(page)
    assert "restored the outputs of 1 cell" in text and f"%klbr replay {record}" in text
    screenshot(page, "restore-unsaved-notice.png")


def test_a_4_4_notebook_is_upgraded_and_restored_before_and_after_it_is_saved(lab, browser):
    """Its ids change on every load: it is upgraded to 4.5 when opened; unsaved, its cells come back by
    their code (one cell with that code, showing nothing); saved, by their ids."""
    path = notebook(lab.root, "old.ipynb", ["print('from a 4.4 notebook')", "x = 1"], minor=4)
    page = open_notebook(browser, lab, "old.ipynb")
    expect(page.get_by_text("klbr upgraded this notebook to nbformat 4.5")).to_be_visible(timeout=60_000)
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("from a 4.4 notebook", timeout=60_000)
    page.reload()  # not saved: new ids
    idle(page)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("from a 4.4 notebook", timeout=60_000)
    assert prompt(page, 0) == "[1]:" and "restored the outputs of 1 cell" in _notice(page)
    save(page)
    until(lambda: (_saved(path) or {}).get("nbformat_minor") == 5, 30, "the notebook is saved as 4.5")
    saved = _saved(path)
    assert all(c.get("id") for c in saved["cells"])
    nb = saved
    for c in nb["cells"]:
        c["outputs"], c["execution_count"] = [], None  # what the page shows after a reload must come from klbr
    path.write_text(json.dumps(nb))
    page.reload()
    idle(page)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("from a 4.4 notebook", timeout=60_000)
    screenshot(page, "restore-4.4-saved.png")


def test_the_status_item_shows_what_klbr_status_shows_and_its_actions_work(lab, browser):
    notebook(lab.root, "status.ipynb", ["print('recorded once')"])
    page = open_notebook(browser, lab, "status.ipynb")
    item = page.locator(".klbr-StatusItem")
    # The worker's memory once it is sampled (it may not be yet when the page first asks).
    expect(item).to_have_text(re.compile(r"^klbr: generation 1 · local · recording( · \d+ MiB)?$"), timeout=60_000)
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("recorded once", timeout=60_000)
    expect(item).to_have_text(re.compile(r"^klbr: generation 1 · local · recording · \d+ MiB$"), timeout=30_000)
    cell(page, 0).locator(".jp-OutputArea").click(button="right")
    page.get_by_text("Clear Cell Output").first.click()
    expect(cell(page, 0).locator(".jp-OutputArea")).to_have_text("", timeout=30_000)
    cell(page, 0).locator(".jp-InputPrompt").click()
    item.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".klbr-StatusSummary")).to_contain_text("Cells recorded", timeout=30_000)
    screenshot(page, "restore-status-dialog.png")
    dialog.get_by_role("button", name="Replay the selected cell").click()
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("recorded once", timeout=30_000)
    item.click()
    page.locator(".jp-Dialog").get_by_role("button", name="Restart the generation").click()
    # Generation 2 serves, and the item offers to rebuild what generation 1 ran (once the page has
    # read the plan: the text without the offer was only a moment's, which a poll under load missed).
    expect(item).to_have_text(re.compile(r"^klbr: generation 2 · local · recording( · \d+ MiB)? · rebuild\?$"),
                              timeout=60_000)
