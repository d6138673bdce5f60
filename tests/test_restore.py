"""Outputs come back into their cells by themselves (the klbr JupyterLab extension), in a real JupyterLab
driven in Debian's chromium: a reload mid-cell, a tab closed and reopened, a 4.4 notebook, a cell
never saved, an edited cell, two tabs. One server for the module; each test has its own notebook."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from conftest import until
from lab import Lab, cell, chromium, idle, notebook, open_notebook, output_text, prompt, run_cell, save, screenshot

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
def browser(lab):
    with chromium() as browser:
        yield browser
    lab.shut_down_kernels()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("line ")]


def _status(lab: Lab, code_start: str) -> list[str]:
    conn = sqlite3.connect(lab.db)
    try:
        return [r[0] for r in conn.execute("SELECT status FROM cells WHERE code LIKE ? ORDER BY id", (code_start + "%",))]
    finally:
        conn.close()


def _notice(page) -> str:
    """The extension's last notice (also shown as a JupyterLab notification)."""
    from playwright.sync_api import expect

    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel).to_have_attribute("data-klbr-notice", __import__("re").compile("."), timeout=60_000)
    return str(panel.get_attribute("data-klbr-notice"))


def test_a_reload_mid_cell_brings_every_line_back_and_the_queued_cell_fills(lab, browser):
    from playwright.sync_api import expect

    go = lab.root / "reload-go"
    notebook(lab.root, "reload.ipynb", [PRINTING.format(n=40, go=str(go)), "print('the queued cell ran')"])
    page = open_notebook(browser, lab, "reload.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)  # queued behind the first
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 4", timeout=60_000)
    page.reload()
    idle(page)
    # Without typing anything: the lines printed so far are back, and the cell is still running.
    expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text("line 3", timeout=60_000)
    assert prompt(page, 0) == "[*]:" and prompt(page, 1) == "[*]:"
    assert "restored the outputs of 1 cell; following 2 cells" in _notice(page)
    screenshot(page, "restore-reload-running.png")
    go.touch()
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("the queued cell ran", timeout=60_000)
    lines = _lines(output_text(page, 0))
    assert len(lines) >= 40 and lines == [f"line {i}" for i in range(len(lines))]
    assert prompt(page, 0) == "[1]:" and prompt(page, 1) == "[2]:"
    screenshot(page, "restore-reload-done.png")
    save(page)
    path = lab.root / "reload.ipynb"
    until(lambda: json.loads(path.read_text())["cells"][1]["outputs"], 30, "the notebook is saved")
    saved = json.loads(path.read_text())["cells"]
    text = "".join("".join(o["text"]) for o in saved[0]["outputs"] if o["output_type"] == "stream")
    assert _lines(text) == lines and saved[0]["execution_count"] == 1 and saved[1]["execution_count"] == 2
