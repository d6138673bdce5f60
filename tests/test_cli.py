"""`klbr-kernel` reads the cell log the kernel writes: it loads the kernel's config file and takes the
same options, so it reads the database the kernel writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from utils import execute, start_kernel


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    command = str(Path(sys.executable).with_name("klbr-kernel"))  # the console script pip installed
    return subprocess.run([command, *args], env=env, check=False, capture_output=True, text=True)


def test_the_cli_reads_the_database_the_kernels_config_names(tmp_path):
    db = tmp_path / "configured.sqlite3"
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_klbr_config.py").write_text(f"c.Store.path = {str(db)!r}\n")
    env = {**os.environ, "KLBR_DB": "", "JUPYTER_CONFIG_DIR": str(config)}  # only the config names a file
    with start_kernel(env=env) as (km, kc):
        execute(kc, "print('recorded where the config says')")
    assert db.exists()
    listing = _cli("sessions", env=env)
    assert listing.returncode == 0, listing.stderr
    assert "ended" in listing.stdout and "ok" in listing.stdout
    shown = _cli("show", "1", env=env)
    assert "recorded where the config says" in shown.stdout
    other = tmp_path / "other.sqlite3"  # the option on the command line wins over the config file
    missing = _cli("sessions", f"--Store.path={other}", env=env)
    assert missing.returncode == 1 and str(other) in missing.stderr


def test_cli_usage_errors_are_clear(tmp_path):
    env = {**os.environ, "KLBR_DB": str(tmp_path / "none.sqlite3")}
    for args, needs in [((), "a command is required"), (("cells",), "exactly one SESSION"),
                        (("cells", "x"), "must be a number"), (("export", "1"), "-o OUT.ipynb"),
                        (("prune",), "--older-than DAYS")]:
        done = _cli(*args, env=env)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert needs in done.stderr
