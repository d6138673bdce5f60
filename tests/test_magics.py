"""`%klbr` cells: parsed by the proxy, answered by the supervisor, counted like any cell."""

import pytest

from klbr_kernel.magics.parse import Magic, MagicError, cell_timeout, line_magics
from utils import execute, results


def test_only_cells_made_of_klbr_lines_are_the_proxys():
    assert line_magics("%klbr status") == [Magic("status", ())]
    assert line_magics("# check\n%klbr timeout 30\n\n%klbr status\n") == [Magic("timeout", ("30",)), Magic("status", ())]
    assert line_magics("%klbr status\nprint(1)") is None  # mixed: the worker's (and IPython's error)
    assert line_magics("x = '%klbr status'") is None
    assert line_magics("%klbrish") is None


@pytest.mark.parametrize("code", ["%klbr", "%klbr reboot", "%klbr timeout", "%klbr timeout soon", "%klbr timeout -1",
                                  "%klbr status now", "%klbr history many"])
def test_bad_klbr_lines_are_usage_errors(code):
    with pytest.raises(MagicError):
        line_magics(code)


def test_cell_timeout_header():
    assert cell_timeout("%%klbr timeout=2.5\nwork()") == (2.5, "work()")
    assert cell_timeout("work()") is None
    with pytest.raises(MagicError):
        cell_timeout("%%klbr timeout=never\nwork()")


def test_a_bad_klbr_cell_gets_a_usage_error_and_a_count(kernel):
    km, kc = kernel
    reply, outputs = execute(kc, "%klbr reboot")
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "UsageError"
    assert reply["content"]["evalue"].startswith("Nothing ran, and the namespace is as it was: unknown %klbr "
                                                 "command 'reboot'; known: status"), reply["content"]
    assert reply["content"]["execution_count"] == 1
    reply, _ = execute(kc, "%klbr placement ssh://elsewhere/usr/bin/python")
    assert reply["content"]["ename"] == "UsageError"
    # A line that could not be carried out names itself first, then why.
    assert reply["content"]["evalue"].startswith("`%klbr placement` was not carried out: ssh://elsewhere/"), reply
    reply, outputs = execute(kc, "In[1], In[2]")
    assert reply["content"]["execution_count"] == 3
    assert results(outputs) == ["('%klbr reboot', '%klbr placement ssh://elsewhere/usr/bin/python')"]
