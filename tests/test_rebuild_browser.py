"""The way back after a loss, in a real JupyterLab driven in Debian's chromium (the klbr extension):
a worker killed, the change announced with the offer, the earlier cells marked, the plan looked at,
the rebuild run, the variables back."""

from __future__ import annotations

import os
import re
import signal

import pytest
from playwright.sync_api import expect

from lab import Lab, cell, chromium, notebook, open_notebook, output_text, run_cell, screenshot
from utils import process_gone

pytestmark = pytest.mark.browser

EARLIER = re.compile(r"\bklbr-EarlierGeneration\b")


@pytest.fixture
def lab(tmp_path):
    server = Lab(tmp_path)
    try:
        yield server
    finally:
        server.shut_down_kernels()
        server.close()


def _ran(page, index: int, count: int) -> None:
    run_cell(page, index)
    expect(cell(page, index).locator(".jp-InputArea-prompt")).to_have_text(f"[{count}]:", timeout=60_000)


def test_a_killed_worker_is_announced_and_the_offer_rebuilds_the_namespace(lab):
    cells = ["a = 1", "b = a + 1", "a = a * 10", "import os\nprint(os.getpid())", "print(a, b)"]
    notebook(lab.root, "rebuild.ipynb", cells)
    with chromium() as browser:
        page = open_notebook(browser, lab, "rebuild.ipynb")
        for i in range(4):
            _ran(page, i, i + 1)
        pid = int(output_text(page, 3).split()[-1])
        os.kill(pid, signal.SIGKILL)
        assert process_gone(pid)
        # Announced, with the offer: the lost generation's four cells.
        panel = page.locator(".jp-NotebookPanel:visible")
        expect(panel).to_have_attribute("data-klbr-generation-notice", re.compile(r"generation 1 ended \(lost"),
                                        timeout=60_000)
        offer = page.get_by_role("button", name=re.compile(r"Rebuild the namespace \(4 cells")).first
        expect(offer).to_be_visible(timeout=30_000)
        # The cells that ran in generation 1 are marked; the one that never ran is not.
        for i in range(4):
            expect(cell(page, i)).to_have_class(EARLIER)
        expect(cell(page, 4)).not_to_have_class(EARLIER)
        expect(page.locator(".klbr-StatusItem")).to_contain_text("rebuild?")
        screenshot(page, "rebuild-offer.png")
        # The plan first, then the rebuild.
        offer.click()
        plan = page.locator(".klbr-PlanDialog")
        expect(plan).to_contain_text("[4/4] In[4]", timeout=30_000)
        expect(plan).to_contain_text("In[1]")
        screenshot(page, "rebuild-plan.png")
        page.locator(".jp-Dialog").get_by_role("button", name="Rebuild").click()
        expect(panel).to_have_attribute("data-klbr-rebuilt", "ok", timeout=120_000)
        for i in range(4):
            expect(cell(page, i)).not_to_have_class(EARLIER)
        expect(page.locator(".klbr-StatusItem")).not_to_contain_text("rebuild?")
        expect(offer).to_be_hidden()
        # The variables are back; the rebuild's own outputs went to the log, not into the cells.
        _ran(page, 4, 5)
        expect(cell(page, 4).locator(".jp-OutputArea")).to_have_text("10 2", timeout=60_000)
        assert output_text(page, 3).split()[-1] == str(pid)
        screenshot(page, "rebuild-done.png")
