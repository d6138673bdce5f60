"""`python -m klbr_kernel -f FILE` runs the kernel; `python -m klbr_kernel install ...` is the CLI."""

import sys

from .cli import COMMANDS

if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
    from .cli import main
else:
    from .app import main

main()
