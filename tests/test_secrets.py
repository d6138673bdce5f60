"""Files, sockets and secrets: what klbr writes is its user's alone, the key is in
no argv, log or database, and config files in the notebook's directory are not run."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from utils import execute, results, start_kernel, worker_pid


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def test_files_are_private_and_the_key_is_in_no_argv_log_or_database(tmp_path):
    db, log = tmp_path / "log.sqlite3", tmp_path / "kernel.log"
    with start_kernel(env={"KLBR_DB": str(db)}, log=log) as (km, kc):
        key = km.session.key.decode()
        execute(kc, "print('hello')")
        pid = worker_pid(kc)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        conn_file = Path(argv[argv.index(b"-f") + 1].decode())
        runtime = conn_file.parent
        assert _mode(runtime) == 0o700, oct(_mode(runtime))
        assert _mode(conn_file) & 0o077 == 0, oct(_mode(conn_file))
        assert json.loads(conn_file.read_text())["key"] == key  # a local worker shares it, in a private file
        for sock in runtime.iterdir():
            if stat.S_ISSOCK(sock.stat().st_mode):
                assert sock.parent == runtime  # reachable only through the 0700 directory
        assert _mode(db) & 0o077 == 0, oct(_mode(db))
        for process in _descendants(km.provisioner.process.pid):
            try:
                cmdline = Path(f"/proc/{process}/cmdline").read_bytes()
            except OSError:
                continue
            assert key.encode() not in cmdline, f"the key is in the argv of pid {process}"
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("log.sqlite3*"))
    assert key.encode() not in stored
    assert key not in log.read_text()


def test_config_files_in_the_notebooks_directory_are_not_run(tmp_path):
    """CVE-2022-21699 class: a notebook directory someone else wrote must not configure the kernel or
    its worker by dropping config files there."""
    notebook_dir = tmp_path / "shared"
    notebook_dir.mkdir()
    marker = tmp_path / "ran"
    for name in ("ipython_config.py", "ipython_kernel_config.py", "jupyter_klbr_config.py",
                 "jupyter_config.py"):
        (notebook_dir / name).write_text(f"open({str(marker / name)!r}, 'w').close()\n")
    marker.mkdir()
    with start_kernel(cwd=notebook_dir, env={"KLBR_DB": str(tmp_path / "log.sqlite3")}) as (km, kc):
        assert results(execute(kc, "import os; os.getcwd()")[1]) == [repr(str(notebook_dir))]
        execute(kc, "%klbr restart")  # a later generation too
        assert results(execute(kc, "1 + 1")[1]) == ["2"]
    assert sorted(p.name for p in marker.iterdir()) == []
