"""JupyterLab in headless Debian chromium, driven by Playwright: a cell run on klbr with Shift+Enter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

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


@pytest.fixture
def jupyterlab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: `make test` installs it (make browser-deps)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    nb.metadata["kernelspec"] = {"name": "klbr", "display_name": "Python 3 (klbr)", "language": "python"}
    nbformat.write(nb, tmp_path / "smoke.ipynb")
    port, token = _free_port(), "klbr-smoke-token"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError((tmp_path / "server.log").read_text()[-3000:])
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
    from playwright.sync_api import expect, sync_playwright

    base, token, root = jupyterlab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/lab/tree/smoke.ipynb?token={token}", timeout=60_000)
            # The kernel shows up by name and reaches idle.
            expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text("klbr", timeout=60_000)
            expect(page.locator("[data-status='idle']").first).to_be_attached(timeout=60_000)
            editor = page.locator(".jp-Cell .cm-content").first
            editor.click()
            editor.type("import os\nprint('answer from klbr:', 6 * 7)")
            page.keyboard.press("Shift+Enter")
            output = page.locator(".jp-OutputArea-output").first
            expect(output).to_contain_text("answer from klbr: 42", timeout=30_000)
            page.screenshot(path=str(root / "jupyterlab.png"))
        finally:
            browser.close()
