"""A real JupyterLab server with the klbr extension, and Debian's chromium driving it: what the browser
tests and the restore bench share (tests/test_browser.py has its own, older fixture)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from playwright.sync_api import expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
    "--disable-background-networking", "--disable-component-update",
]
TOKEN = "klbr-restore-token"
# Screenshots a person can look at after the run (gitignored).
ARTIFACTS = Path(__file__).parent.parent / "build" / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """One JupyterLab server on 127.0.0.1 whose root is `root`; its log is `root/server.log`. With
    `app="notebook"`, a Notebook 7 server instead (the same extension, a page per notebook)."""

    def __init__(self, root: Path, config: str = "", app: str = "jupyterlab"):
        self.app = app
        self.root = root
        self.db = root / "log.sqlite3"
        self.log = root / "server.log"
        conf = root / "config"  # the server's, and so its kernels' (jupyter_klbr_config.py)
        conf.mkdir(exist_ok=True)
        (conf / "jupyter_klbr_config.py").write_text("c.Store.max_output_bytes = 32 * 2**20\n" + config)
        # No "get notified about Jupyter news?" toast over what the screenshots show.
        (conf / "labconfig").mkdir(exist_ok=True)
        (conf / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True},
             "exposeAppInBrowser": True}))  # `window.jupyterapp`: a test runs the app's commands, as its menus do
        self._workspaces = 0
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(conf), "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
               "KLBR_DB": str(self.db)}
        self._stderr = open(self.log, "a")  # noqa: SIM115 — the server's stderr (a restarted one's after); `close` closes it
        self.server = subprocess.Popen(
            [sys.executable, "-m", app, "--no-browser", "--allow-root", f"--port={self.port}",
             "--ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
             "--ServerApp.iopub_data_rate_limit=1e10", "--ServerApp.iopub_msg_rate_limit=1e10", "--LabApp.news_url=",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            env=env, stdout=subprocess.DEVNULL, stderr=self._stderr)
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{self.base}/api/status?token={TOKEN}", timeout=2)  # noqa: S310 — our server
                break
            except OSError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    self.close()
                    raise RuntimeError(self.log.read_text()[-3000:]) from None
                time.sleep(0.2)

    def url(self, notebook: str) -> str:
        """The notebook alone in a workspace of its own (a server's default workspace reopens every
        notebook an earlier test opened)."""
        if self.app == "notebook":
            return f"{self.base}/notebooks/{notebook}?token={TOKEN}"
        self._workspaces += 1
        return f"{self.base}/lab/workspaces/w{self._workspaces}/tree/{notebook}?token={TOKEN}&reset"

    def api(self, path: str, method: str = "GET") -> Any:
        url = f"{self.base}/api/{path}?token={TOKEN}"
        request = urllib.request.Request(url, method=method)  # noqa: S310 — our server
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 — our server
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """Every kernel of the server ends (between tests: a loaded machine has room for one or two)."""
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", "DELETE")

    def close(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self._stderr.close()


@contextmanager
def running(root: Path, config: str = "", app: str = "jupyterlab") -> Iterator[Lab]:
    """A `Lab` for as long as the block (a module's fixture, a test's own server); closed after it."""
    server = Lab(root, config, app)
    try:
        yield server
    finally:
        server.close()


def notebook(root: Path, name: str, sources: list[str], minor: int = 5) -> Path:
    """A klbr notebook of code cells, written as nbformat writes it (4.5 with cell ids, or 4.4 without)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    nb.metadata["kernelspec"] = {"name": "klbr", "display_name": "Python 3 (klbr)", "language": "python"}
    if minor < 5:
        nb.nbformat_minor = minor
        for cell in nb.cells:
            del cell["id"]
    path = root / name
    path.write_text(json.dumps(nb, indent=1))
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian chromium (Playwright cannot download a browser here)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_notebook(browser: Any, lab: Lab, name: str, context: Any = None, state: str = "idle") -> Any:
    """A new tab on the notebook, its klbr kernel shown `state` (busy: a cell of it runs)."""
    page = context.new_page() if context is not None else browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("dialog", lambda dialog: dialog.accept())  # "leave the page?" on reload
    page.goto(lab.url(name), timeout=90_000)
    kernel_shown(page, state)
    return page


def kernel_shown(page: Any, state: str) -> None:
    """The page's kernel is klbr, and its indicator shows `state` (the last status the page had)."""
    expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text("klbr", timeout=90_000)
    expect(page.locator(f"[data-status='{state}']").first).to_be_attached(timeout=90_000)


def idle(page: Any) -> None:
    kernel_shown(page, "idle")


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)


def prompt(page: Any, index: int) -> str:
    return str(cell(page, index).locator(".jp-InputArea-prompt").inner_text()).strip()


def output_text(page: Any, index: int) -> str:
    return str(cell(page, index).locator(".jp-OutputArea").inner_text())


def run_cell(page: Any, index: int) -> None:
    """Select the cell (command mode) and run it with Shift+Enter, as a person does."""
    cell(page, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def save(page: Any) -> None:
    page.keyboard.press("Control+s")


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))
