"""klbr on Windows, where it does not run yet, said plainly instead of dying on the first POSIX name.

klbr keeps its workers with POSIX process groups, signals and a reaper that outlives nothing
(semantics 5), which Windows does not have. `python -m klbr_kernel` asks first, before
any other import of klbr: on Windows the kernel is this module's, plain ipykernel answering every
cell with why and where klbr runs (WSL), so the notebook shows it, where a kernel that exited would
be restarted five times and marked dead with the reason in a log. `klbr-kernel` (every command:
there is no cell log where no kernel runs) says the same on stderr and exits 1.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from ._version import __version__

WHY = ("klbr does not run on Windows yet: it keeps its workers with POSIX process groups and signals. "
       "Run Jupyter in WSL (https://learn.microsoft.com/windows/wsl/), where klbr runs as on Linux.")
ENAME = "UnsupportedPlatform"


def refuse_command() -> NoReturn:
    """`klbr-kernel` on Windows: the reason on stderr, status 1."""
    sys.exit(f"klbr-kernel: {WHY}")


def serve(argv: list[str]) -> None:
    """The kernel on Windows, with the kernel's command line: every execute answered `UnsupportedPlatform`
    (WHY) and nothing run. ipykernel serves the rest of the protocol (kernel_info, shutdown, interrupt)."""
    from ipykernel.kernelapp import IPKernelApp  # noqa: PLC0415 — 50-150 ms the CLI, which imports this module, never pays
    from ipykernel.kernelbase import Kernel  # noqa: PLC0415 — as above

    class Unsupported(Kernel):
        implementation = "klbr"
        implementation_version = __version__
        language_info = {"name": "python", "mimetype": "text/x-python", "file_extension": ".py"}
        banner = WHY

        async def do_execute(self, code: str, silent: bool, *args: Any, **kwargs: Any) -> dict[str, Any]:
            text = f"This cell did not run: {WHY}"
            error = {"ename": ENAME, "evalue": text, "traceback": [f"{ENAME}: {text}"]}
            if not silent:
                self.send_response(self.iopub_socket, "error", error)  # type: ignore[no-untyped-call]  # ipykernel's, untyped
            return {"status": "error", "execution_count": self.execution_count, **error}

    IPKernelApp.launch_instance(argv=argv, kernel_class=Unsupported)
