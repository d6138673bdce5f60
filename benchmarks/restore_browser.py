"""Page load -> the restored outputs of a 10,000-output cell, in a real JupyterLab (`make bench` runs it
after compare.py; alone: `.venv/bin/python benchmarks/restore_browser.py [--rounds N]`).

A cell prints 10,000 lines (10,000 stream outputs in the cell log); the notebook is never saved, so a
new page has only klbr to get them back. Each round opens the notebook in a fresh tab and measures,
in Debian's chromium: page load -> the cell shows its last line (the extension's restore), and the
longest task that blocked the page's main thread meanwhile (the page must stay responsive, <= 2 s).
Beside it, the same outputs saved in the file, loaded by JupyterLab alone: what a restore is
compared to. Medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from lab import Lab, cell, chromium, idle, notebook, open_notebook, run_cell

LINES = 10_000
CODE = f"for i in range({LINES}):\n    print(f'output {{i}}', flush=True)"
LAST = f"output {LINES - 1}"
# Long tasks of the page's main thread (Chromium's Long Tasks API), from before the app starts.
WATCH = """
window.__klbrLongTasks = [];
new PerformanceObserver(list => { for (const e of list.getEntries()) window.__klbrLongTasks.push(e.duration); })
  .observe({ type: 'longtask', buffered: true });
"""


def _load(browser, lab: Lab, name: str) -> tuple[float, float]:
    """(page load -> the last line shown, in s; the longest main-thread task meanwhile, in s)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(WATCH)
    page = context.new_page()
    try:
        start = time.perf_counter()
        page.goto(lab.url(name), timeout=120_000)
        expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text(LAST, timeout=120_000)
        shown = time.perf_counter() - start
        longest = max(page.evaluate("window.__klbrLongTasks") or [0]) / 1000
        return shown, longest
    finally:
        context.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="klbr-restore-bench-"))
    lab = Lab(root)
    try:
        notebook(root, "restored.ipynb", [CODE])
        with chromium() as browser:
            page = open_notebook(browser, lab, "restored.ipynb")
            run_cell(page, 0)
            expect(cell(page, 0).locator(".jp-OutputArea")).to_contain_text(LAST, timeout=300_000)
            idle(page)
            page.keyboard.press("Control+s")  # a copy whose outputs are in the file, for the baseline
            saved = root / "restored.ipynb"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if json.loads(saved.read_text())["cells"][0]["outputs"]:
                        break
                except ValueError:
                    pass
                time.sleep(0.1)
            shutil.copy(saved, root / "saved.ipynb")
            notebook(root, "restored.ipynb", [CODE])  # no outputs in the file again: klbr must restore them
            nb = json.loads((root / "restored.ipynb").read_text())
            nb["cells"][0]["id"] = json.loads((root / "saved.ipynb").read_text())["cells"][0]["id"]
            (root / "restored.ipynb").write_text(json.dumps(nb))
            page.context.close()
            rows: dict[str, list[tuple[float, float]]] = {"restored by klbr": [], "saved in the file": []}
            for _ in range(args.rounds):
                rows["restored by klbr"].append(_load(browser, lab, "restored.ipynb"))
                rows["saved in the file"].append(_load(browser, lab, "saved.ipynb"))
        print(f"page load -> a {LINES:,}-output cell shown, medians of {args.rounds} rounds")
        print(f"{'':22}{'load -> shown (s)':>20}{'longest task (s)':>20}")
        for label, values in rows.items():
            print(f"{label:22}{statistics.median(v[0] for v in values):>20.2f}"
                  f"{statistics.median(v[1] for v in values):>20.2f}")
        worst = max(v[1] for v in rows["restored by klbr"])
        print(f"responsive: the longest task of any restore round was {worst:.2f} s"
              f" ({'within' if worst <= 2 else 'OVER'} the 2 s bound)")
    finally:
        lab.shut_down_kernels()
        lab.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
