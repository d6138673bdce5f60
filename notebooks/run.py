"""Run a notebook on the klbr kernel with nbclient and print what ran: `make demo`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def _text(output) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return f"{output.ename}: {output.evalue}\n"
    data = output.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:
        return "[widget]\n"
    for mime in ("text/markdown", "text/plain"):
        if mime in data:
            return data[mime] + "\n"
    return f"[{next(iter(data), 'empty')}]\n"


def main(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(nb, kernel_name="klbr", timeout=120, resources={"metadata": {"path": cwd}}).execute()
    print(f"== {Path(path).name} on klbr: {sum(c.cell_type == 'code' for c in nb.cells)} code cells ran\n")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        print(f"In [{cell.execution_count}]:")
        for line in cell.source.splitlines():
            print(f"    {line}")
        for output in cell.outputs:
            text = _text(output)
            if len(text) > 300:
                text = text[:300] + f"... ({len(text)} characters)\n"
            print(f"  {output.output_type}: {text}", end="")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
