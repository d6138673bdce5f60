"""JupyterLab in headless Debian chromium, driven by Playwright: a cell run on klbr with Shift+Enter."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import expect, sync_playwright

from utils import until

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
    "--disable-background-networking", "--disable-component-update",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Screenshots a person can look at after the run (gitignored).
ARTIFACTS = Path(__file__).parent.parent / "build" / "test-artifacts"


@pytest.fixture
def jupyterlab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: `make test` installs it (make browser-deps)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    nb.metadata["kernelspec"] = {"name": "klbr", "display_name": "Python 3 (klbr)", "language": "python"}
    nbformat.write(nb, tmp_path / "smoke.ipynb")
    port, token = _free_port(), "klbr-smoke-token"
    config = tmp_path / "config"  # the server's, and so its kernels' (jupyter_klbr_config.py)
    config.mkdir()
    (config / "jupyter_klbr_config.py").write_text("c.Store.max_output_bytes = 32 * 2**20\n")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "KLBR_DB": str(tmp_path / "log.sqlite3")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.iopub_data_rate_limit=1e10",  # the 10 MiB test prints past the default 1 MB/s
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),  # noqa: SIM115 — the server's
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)  # noqa: S310 — our server
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError((tmp_path / "server.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        yield base, token, tmp_path
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_shift_enter_in_jupyterlab_runs_on_klbr(jupyterlab):
    base, token, root = jupyterlab
    with _notebook(base, token) as page:  # the kernel shows up by name and reaches idle
        _run_in_last_cell(page, "import os\nprint('answer from klbr:', 6 * 7)")
        output = page.locator(".jp-OutputArea-output").first
        expect(output).to_contain_text("answer from klbr: 42", timeout=30_000)
        page.screenshot(path=str(root / "jupyterlab.png"))


@contextmanager
def _notebook(base, token):
    """The test notebook in JupyterLab in headless Chromium, its klbr kernel idle."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("dialog", lambda dialog: dialog.accept())  # "leave the page?" on reload
            page.goto(f"{base}/lab/tree/smoke.ipynb?token={token}", timeout=60_000)
            _idle(page)
            yield page
        finally:
            browser.close()


def _idle(page) -> None:
    expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text("klbr", timeout=60_000)
    expect(page.locator("[data-status='idle']").first).to_be_attached(timeout=60_000)


def _run_in_last_cell(page, code: str) -> None:
    """Type one line of code into the last cell and run it (one line: the editor indents what follows
    a colon by itself)."""
    editor = page.locator(".jp-Cell .cm-content").last
    editor.click()
    editor.type(code)
    page.keyboard.press("Shift+Enter")


def _replay_cell(page):
    return page.locator(".jp-Cell").filter(has_text="klbr replay: cell").last


def test_reload_mid_cell_then_replay_brings_every_line_back(jupyterlab):
    """Lab's story of jupyterlab#2833: a tab reloaded while a cell prints loses what it printed. In
    klbr, `%klbr replay` in the new page shows every line, in order, once."""
    base, token, root = jupyterlab
    reloaded = root / "reloaded"
    with _notebook(base, token) as page:
        # It prints until the new page is there, however long the reload takes on a busy machine,
        # and at least 30 lines.
        _run_in_last_cell(page, "import itertools, os, time; _ = [print(f'line {i}', flush=True) or time.sleep(0.2) "
                                "for i in itertools.takewhile(lambda i: i < 30 or not "
                                f"os.path.exists({str(reloaded)!r}), itertools.count())]")
        expect(page.locator(".jp-OutputArea-output").first).to_contain_text("line 4", timeout=30_000)
        page.reload()  # a new page: a new websocket, a new session
        # The server buffers for the old page, and discards that when the new page connects.
        until(lambda: "Discarding" in (root / "server.log").read_text(), 60, "the new page connects")
        reloaded.touch()
        log = sqlite3.connect(root / "log.sqlite3")
        until(lambda: log.execute("SELECT status FROM cells WHERE code LIKE 'import itertools%'").fetchall() == [("ok",)],
              60, "the cell is done")
        log.close()
        _idle(page)
        _run_in_last_cell(page, "%klbr replay")
        expect(_replay_cell(page)).to_contain_text("line 29", timeout=30_000)
        text = _replay_cell(page).inner_text()
        lines = [line for line in text.splitlines() if line.startswith("line ")]
        assert len(lines) >= 30 and lines == [f"line {i}" for i in range(len(lines))]
        # The extension followed the cell on the reloaded page: its outputs reached a notebook, so no
        # cell says they did not (a frontend without it gets the notice: tests/test_replay.py).
        assert "reached no notebook" not in page.locator(".jp-Notebook").inner_text()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "replay-after-reload.png"), full_page=True)


def test_a_ten_mib_replay_renders_without_freezing_the_page(jupyterlab):
    """10 MiB of recorded output come back in messages of at most 1 MiB; the page keeps answering."""
    base, token, root = jupyterlab
    with _notebook(base, token) as page:
        _run_in_last_cell(page, "import sys; _ = [sys.stdout.write(('%04d' % i) * 16384) or sys.stdout.flush() "
                                "for i in range(160)]; print(' the end')")
        # Once it has begun, the page goes: drawing 10 MiB as 160 appends to one stream is the
        # page's own slow work (minutes on a loaded machine), not what this test is about.
        expect(page.locator(".jp-OutputArea-output").first).to_contain_text("0000", timeout=120_000)
        page.reload()  # the outputs are gone from the page, not from the log
        _idle(page)  # the cell has ended: the kernel is idle again
        started = time.monotonic()
        _run_in_last_cell(page, "%klbr replay")
        expect(_replay_cell(page)).to_contain_text("the end", timeout=120_000)
        rendered = time.monotonic() - started
        before = time.monotonic()
        page.evaluate("() => new Promise(resolve => requestAnimationFrame(() => resolve(1)))")
        frame = time.monotonic() - before
        assert frame < 5, f"the page took {frame:.1f} s to draw its next frame after the replay"
        assert "01590159" in _replay_cell(page).inner_text()  # the last of the 10 MiB
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "replay-of-10-mib.png"))
        print(f"10 MiB replay rendered in {rendered:.1f} s; next frame after {frame * 1000:.0f} ms")
