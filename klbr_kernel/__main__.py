"""`python -m klbr_kernel -f FILE` runs the kernel; `python -m klbr_kernel install ...` is the CLI."""

import sys

# A command word (`install`, `sessions`, ...) is the CLI; options (`-f FILE`) are the kernel, which
# must not pay for the CLI's imports before its first worker is spawned.
if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
    from .cli import commands as cli

    cli.main()
elif sys.platform == "win32":  # klbr does not run there yet: the kernel says so in every cell
    from . import unsupported

    unsupported.serve(sys.argv[1:])
else:
    # Before any heavy import: the first worker starts now, in parallel with ours.
    from klbr_supervisor.boot import prelaunch

    from . import client_package  # the standard library only

    first = prelaunch.start(sys.argv[1:], client_package.files())
    # Then the frontend's sockets, so the kernel answers kernel_info while the rest imports.
    from .frontend import standin

    standin.start(sys.argv[1:], first.session_id if first is not None else None)
    from . import app

    app.main(first)  # handed down to generation 1, which adopts it
