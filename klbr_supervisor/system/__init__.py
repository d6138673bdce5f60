"""What the operating system does for klbr: the one seam between klbr and the system it runs on.

Each facility has Linux's way and a portable POSIX way that is the same code on every POSIX system:
macOS runs it, and so does a Linux that refuses Linux's way. Which one serves is decided by what the
system offers, the call existing and working when tried, never by the platform's name: a Linux
without pidfds (before 5.3, under valgrind or a seccomp filter), without prctl, or whose /proc does
not show the process, takes the portable way for that facility, and `tests/test_portable.py` runs
klbr on Linux with those taken away, as a Mac has them.

| facility | Linux | portable | where |
|---|---|---|---|
| a child's exit | its pidfd, read on the loop | a thread in its `Popen.wait` | `watch` |
| the end of the process that started the kernel | its pidfd | `getppid` polled, as ipykernel's poller | `watch` |
| a worker dies with the kernel | PR_SET_PDEATHSIG, armed in the worker | the reaper | `death` |
| a worker's memory, the machine's | /proc (statm held open, meminfo, children, cgroup OOM kills) | psutil | `facts`, `proc` |
| where and what a worker runs | /proc/PID/cmdline, cwd, exe | psutil | `facts`, `proc` |
| whether a pid is a live klbr kernel | /proc/PID/cmdline | psutil; where nothing can tell, alive while the pid is | `facts` |
| the filesystem a path is on | /proc/mounts | psutil's partitions | `facts`, `proc` |
| a memory limit | RLIMIT_DATA, which Linux enforces | the memory watch's samples, where the limit is not enforced | `limits` |
| a flood's freed memory back to the system | glibc's malloc_trim (the worker's bootstrap calls it itself) | nothing: the allocator's own | `heap` |

Two have one way, the same on every POSIX system, and nothing to choose: a generation is contained
and killed as a process group (`start_new_session`, `killpg`, and the reaper, `boot/reaper.py`, which
kills every generation's group when the kernel's pipe to it closes, however the kernel died); the
local transport is ipc sockets in the kernel's 0700 runtime directory (a path is at most 104 bytes on
macOS, 108 on Linux; a temp dir's is far shorter on both).

No Linux-only call is made outside this package (`tests/test_portable.py` reads the code for them).
`death` and `watch` use the standard library only (a worker arms `death` before anything else is
imported); this module imports nothing, so either can be imported alone.
"""
