"""The status dialog in a user's terms (issue 38), in a real JupyterLab driven in Debian's chromium: it
leads with where the code runs, whether cells are recorded, memory and how to limit it, what a
worker's death does and the deadlines; `%klbr status`'s rows follow in a collapsed Details; the
generations on a line carry each one's peak memory, the serving one's too. Screenshots go to
build/test-artifacts."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from lab import cell, notebook, open_notebook, output_text, run_cell, running, screenshot

pytestmark = pytest.mark.browser

ALLOCATE = "x = b'1' * (200 << 20)"  # kept in `x`: the worker holds 200 MiB more from then on
MiB = 1 << 20


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The module's JupyterLab (the browser is conftest's)."""
    with running(tmp_path_factory.mktemp("lab")) as server:
        yield server


def _peak(box) -> int:
    """The peak memory a generation's box shows, in bytes."""
    text = box.inner_text()
    found = re.search(r"peak (\d+(?:\.\d)?) (MiB|GiB)", text)
    assert found, text
    return int(float(found[1]) * (MiB if found[2] == "MiB" else 1 << 30))


def _open_dialog(page):
    page.locator(".klbr-StatusItem").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator(".klbr-StatusSummary")).to_be_visible(timeout=30_000)
    expect(dialog.locator(".klbr-Generation").first).to_be_visible(timeout=30_000)
    return dialog


def _close(dialog) -> None:
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_have_count(0, timeout=30_000)


def test_the_dialog_answers_a_users_questions_first_and_shows_every_generations_peak(lab, browser):
    notebook(lab.root, "dialog.ipynb", [ALLOCATE, "import os; os.kill(os.getpid(), 9)", "'after the kill'"])
    page = open_notebook(browser, lab, "dialog.ipynb")
    run_cell(page, 0)
    expect(cell(page, 0).locator(".jp-InputArea-prompt")).to_have_text("[1]:", timeout=60_000)

    dialog = _open_dialog(page)
    summary = dialog.locator(".klbr-StatusSummary")
    rows = summary.locator("tr")
    expect(rows.locator("th")).to_have_text(
        ["Your code runs", "Cells recorded", "Memory", "If the worker dies", "Deadlines"])
    expect(rows.nth(0)).to_contain_text(re.compile(r"on this machine .*in generation 1, since "))
    expect(rows.nth(1)).to_contain_text(f"yes, every cell and its outputs, in {lab.db}")
    expect(rows.nth(2)).to_contain_text(re.compile(r"MiB now, \d+ MiB at most so far; no limit\. %klbr memory LIMIT"))
    expect(rows.nth(3)).to_contain_text("the next cell runs in a new generation")
    expect(rows.nth(3)).to_contain_text("0 of 5 automatic restarts used")
    expect(rows.nth(4)).to_contain_text("a cell may run as long as it needs")
    # The operator's rows are there, collapsed: hidden until Details is opened.
    details = dialog.locator(".klbr-StatusDetails")
    expect(details.locator("pre")).to_be_hidden()
    serving = dialog.locator(".klbr-Generation")
    expect(serving).to_have_count(1)
    assert "serving now; 1 cell, peak" in serving.inner_text()
    assert _peak(serving) > 200 * MiB
    screenshot(page, "status-dialog-serving.png")
    details.locator("summary").click()
    expect(details.locator("pre")).to_be_visible()
    expect(details.locator("pre")).to_contain_text(re.compile(r"pid +\d+"))
    expect(details.locator("pre")).to_contain_text("signed")
    expect(details.locator("pre")).to_contain_text("dropped")
    screenshot(page, "status-dialog-details.png")
    _close(dialog)

    run_cell(page, 1)
    expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("WorkerLost", timeout=60_000)
    run_cell(page, 2)
    expect(cell(page, 2).locator(".jp-OutputArea")).to_contain_text("'after the kill'", timeout=60_000)
    assert "after the kill" in output_text(page, 2)

    dialog = _open_dialog(page)
    boxes = dialog.locator(".klbr-Generation")
    expect(boxes).to_have_count(2)
    ended, serving = boxes.nth(0), boxes.nth(1)
    expect(ended).to_have_attribute("data-klbr-serving", "false")
    expect(ended).to_contain_text("its worker died")
    assert _peak(ended) > 200 * MiB  # what the killed worker held
    expect(serving).to_have_attribute("data-klbr-serving", "true")
    assert 0 < _peak(serving) < 200 * MiB  # a fresh worker, without `x`
    rows = dialog.locator(".klbr-StatusSummary tr")
    expect(rows.nth(0)).to_contain_text("in generation 2, since ")
    expect(rows.nth(3)).to_contain_text("1 of 5 automatic restarts used")
    expect(dialog.locator(".klbr-StatusDetails pre")).to_be_hidden()
    screenshot(page, "status-dialog-after-kill.png")
    _close(dialog)
