"""Workers keep no IPython history database (the cell log is the history), yet in-session history works."""

from __future__ import annotations

import sqlite3

import pytest

from utils import execute, start_kernel, until


def _text(outputs: list[dict]) -> str:
    parts = []
    for m in outputs:
        if m["msg_type"] == "stream":
            parts.append(m["content"]["text"])
        elif m["msg_type"] == "execute_result":
            parts.append(m["content"]["data"]["text/plain"])
    return "".join(parts)


def _ipython_db_codes(ipython_dir) -> list[str]:
    db = ipython_dir / "profile_default" / "history.sqlite"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT source_raw FROM history")]


@pytest.mark.parametrize("prelaunched", [True, False], ids=["first-generation", "after-restart"])
def test_workers_write_no_ipython_history_db_and_in_session_history_works(tmp_path, prelaunched):
    with start_kernel(env={"IPYTHONDIR": str(tmp_path)}) as (km, kc):
        if not prelaunched:
            execute(kc, "%klbr restart")
        execute(kc, "marker_a = 41")
        reply, outputs = execute(kc, "marker_a + 1")
        count = reply["content"]["execution_count"]
        assert _text(outputs) == "42"
        _, outputs = execute(kc, "%history -n")
        assert f"{count}: marker_a + 1" in _text(outputs)
        _, outputs = execute(kc, f"In[{count}], _ih[{count}]")
        assert _text(outputs) == "('marker_a + 1', 'marker_a + 1')"
        _, outputs = execute(kc, f"%rerun {count}")
        assert "42" in _text(outputs)
        _, outputs = execute(kc, "get_ipython().history_manager.enabled")
        assert _text(outputs) == "False"
    assert not any("marker_a" in code for code in _ipython_db_codes(tmp_path))


def test_ipython_history_can_be_kept(tmp_path):
    with start_kernel(extra_arguments=["--Supervisor.ipython_history=True"], env={"IPYTHONDIR": str(tmp_path)}) as (km, kc):
        execute(kc, "marker_b = 1")
        _, outputs = execute(kc, "get_ipython().history_manager.enabled")
        assert _text(outputs) == "True"
    assert "marker_b = 1" in _ipython_db_codes(tmp_path)


@pytest.mark.parametrize("option, enabled, database", [
    # nbclient's: no sqlite file shared between kernels. klbr's workers keep none at all already.
    ("--HistoryManager.hist_file=:memory:", False, None),
    ("--HistoryManager.enabled=True", True, "profile_default/history.sqlite"),
    ("--HistoryManager.hist_file={dir}/mine.sqlite", True, "mine.sqlite"),
], ids=["memory", "enabled", "a-file"])
def test_the_users_history_options_decide_over_klbrs_default(tmp_path, option, enabled, database):
    """A HistoryManager option on the kernel's command line says what the user expects of IPython's
    history, and klbr's default (no database) gives way to it, on the first worker and later ones."""
    option = option.format(dir=tmp_path)
    with start_kernel(extra_arguments=[option], env={"IPYTHONDIR": str(tmp_path)}) as (km, kc):
        for marker in ("marker_c = 1", "marker_d = 1"):
            execute(kc, marker)
            _, outputs = execute(kc, "print(get_ipython().history_manager.enabled, get_ipython().history_manager.hist_file)")
            hist_file = option.partition("=")[2] if "hist_file" in option else tmp_path / "profile_default" / "history.sqlite"
            assert _text(outputs) == f"{enabled} {hist_file}\n"
            if database:  # IPython's history thread writes it: on a busy machine, later than the cell's reply
                until(lambda marker=marker: marker in _codes(tmp_path / database), 30, f"{marker} in the database")
            execute(kc, "%klbr restart")
    databases = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.sqlite")]
    assert databases == ([database] if database else [])
    if database:
        codes = _codes(tmp_path / database)
        assert "marker_c = 1" in codes and "marker_d = 1" in codes


def _codes(database) -> list[str]:
    """The cells IPython's history database holds (none while it is not there yet)."""
    if not database.exists():
        return []
    with sqlite3.connect(database) as conn:
        try:
            return [row[0] for row in conn.execute("SELECT source_raw FROM history")]
        except sqlite3.OperationalError:  # its table not made yet
            return []


def test_a_config_files_supervisor_options_still_hold_beside_options_for_workers(tmp_path):
    (tmp_path / "jupyter_klbr_config.py").write_text("c.Supervisor.ipython_history = True\n")
    with start_kernel(extra_arguments=["--HistoryManager.hist_file=:memory:"],
                      env={"IPYTHONDIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path)}) as (km, kc):
        _, outputs = execute(kc, "(get_ipython().history_manager.enabled, str(get_ipython().history_manager.hist_file))")
        assert _text(outputs) == "(True, ':memory:')"
