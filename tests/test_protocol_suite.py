"""jupyter_kernel_test's protocol suite against the installed `klbr` kernelspec."""

import os
import tempfile

import jupyter_kernel_test as jkt


class KlbrKernelTests(jkt.KernelTests):
    kernel_name = "klbr"

    @classmethod
    def setUpClass(cls) -> None:
        # A history database of its own: the suite's history search counts matches, and other
        # tests' cells in a shared ~/.ipython would be found too.
        cls._ipython_dir = tempfile.TemporaryDirectory()
        cls._saved_ipython_dir = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = cls._ipython_dir.name
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        if cls._saved_ipython_dir is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = cls._saved_ipython_dir
        cls._ipython_dir.cleanup()
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    # History comes from the cell log, so "range" works too (plain ipykernel fails it: it answers
    # session 0 for the current one).
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


class KlbrIopubWelcomeTests(jkt.IopubWelcomeTests):
    kernel_name = "klbr"
    support_iopub_welcome = True
