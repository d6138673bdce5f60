"""What runs with the standard library only: before the kernel's own imports, or in another process.

`prelaunch` starts generation 1 (or its ssh) first thing in `python -m klbr_kernel`; `worker` and
`deathsig` run as, or in front of, the workers; `reaper` runs as a watchdog under ``python -I -S``;
`ssh_launch` is an ``ssh://`` generation's command line; `agent` is what a generation runs where its
kernel runs (an ssh remote, a container, a Slurm job step), and `agent_launch` how it is started there.
None of them imports anything outside the standard library, this package and the seam's
standard-library parts (`klbr_supervisor.system.death`: how a worker dies with the kernel)
(`tests/test_boot.py` imports each under ``python -I -S``).
"""
