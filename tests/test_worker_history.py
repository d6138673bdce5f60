"""Workers keep no IPython history database (the cell log is the history), yet in-session history works."""

from __future__ import annotations

import sqlite3

import pytest

from conftest import execute, start_kernel


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
