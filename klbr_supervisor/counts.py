"""What tells a worker where execution counts continue (semantics 4): the proxy keeps the counts
the frontend was shown (`klbr_kernel.requests.counts`); a generation that must continue after
another count is sent this code, silently, before the cell that needs it (`Generation.sync_count`).
"""

from __future__ import annotations


def continue_code(last_count: int, texts: dict[int, str]) -> str:
    """IPython code that makes the worker's next execution count `last_count + 1`, `In` padded to
    match: `texts[n]` for cells it never saw, empty strings for other gaps."""
    return (
        "def _klbr_sync(ip=get_ipython()):\n"
        "    hist = ip.history_manager\n"
        f"    texts = {texts!r}\n"
        f"    while len(hist.input_hist_parsed) <= {last_count}:\n"
        "        text = texts.get(len(hist.input_hist_parsed), '')\n"
        "        hist.input_hist_parsed.append(text)\n"
        "        hist.input_hist_raw.append(text)\n"
        f"    ip.execution_count = {last_count + 1}\n"
        "_klbr_sync(); del _klbr_sync\n"
    )
