"""The manual says what the code does: its generated tables are current, its store schema and error
names are the live ones, its CLI page names every command and option, and every link lands.

No kernel: the pages are read as committed, the code as imported, the schema from a fresh database.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sqlite3
from pathlib import Path

import pytest

from klbr_kernel.app import KlbrKernelApp
from klbr_kernel.cli.commands import KlbrKernelCommand
from klbr_kernel.host.client import CODES
from klbr_kernel.magics.parse import MagicError, line_magics
from klbr_kernel.requests.outcomes import (
    ERRORS,
    CellError,
    ending_error,
    idle_loss_notice,
    internal_error,
    no_reply_error,
    refusal_error,
    session_paused_error,
    timeout_error,
    with_rebuild_line,
)
from klbr_kernel.unsupported import WHY
from klbr_supervisor.host import HostService
from klbr_supervisor.policy import Refusal
from klbr_supervisor.states import Ending, EndReason
from klbr_supervisor.store import Store, StoreError
from klbr_supervisor.store.schema import MIGRATIONS, migrate
from klbr_supervisor.supervisor import Supervisor

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))


def _autogen():
    spec = importlib.util.spec_from_file_location("autogen", DOCS / "autogen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(page: str, heading: str) -> str:
    """The text under `heading` (a line of its own) up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    start = page.index(f"\n{heading}\n")
    ends = [m.start() for m in re.finditer(rf"\n#{{1,{len(level)}}} ", page[start + 1:])]
    return page[start: start + 1 + ends[0]] if ends else page[start:]


def _tables(text: str) -> list[dict[str, list[str]]]:
    """The Markdown tables of `text`, each as its rows by their first cell (the first code span in
    it, if any), header and rule left out: `name` -> the other cells."""
    tables: list[dict[str, list[str]]] = []
    rows = None
    for line in text.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        if rows is None:  # the header
            rows = {}
            tables.append(rows)
            continue
        first, *rest = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if set(first) <= set("-:"):  # the rule under the header
            continue
        code = re.match(r"`([^`]+)`", first)
        rows[code.group(1) if code else first] = rest
    return tables


@pytest.mark.parametrize("name", ["configuration.md", "cli.md"])
def test_generated_tables_are_what_the_help_says(name):
    autogen = _autogen()
    page = (DOCS / name).read_text()
    assert page.count(autogen.START) == 1 and page.count(autogen.END) == 1, f"docs/{name} lost its markers"
    current = autogen.render(page, autogen.PAGES[name]())
    assert page == current, f"docs/{name} is stale: run `{autogen.COMMAND}` and commit the page"


def test_every_configurable_trait_is_in_the_options_table():
    """A trait the generator left out would be missing from the manual, however current the page."""
    (options,) = _tables((DOCS / "configuration.md").read_text())
    for cls in (Supervisor, Store, HostService, KlbrKernelApp):
        ours = {f"{cls.__name__}.{n}" for n, t in cls.class_traits(config=True).items()
                if t.this_class.__module__.startswith("klbr_")}
        assert ours, cls
        assert ours <= set(options), f"not in docs/configuration.md: {sorted(ours - set(options))}"


def test_the_store_schema_page_has_every_table_and_column_of_a_fresh_database(tmp_path):
    conn = sqlite3.connect(tmp_path / "fresh.sqlite3")
    migrate(conn)
    page = (DOCS / "store-schema.md").read_text()
    tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    headings = set(re.findall(r"^## `(\w+)`$", page, re.M))
    assert headings == set(tables), f"tables in the page {sorted(headings)}, in the schema {tables}"
    for table in tables:
        columns = _tables(_section(page, f"## `{table}`"))[0]
        live = {name: kind for _, name, kind, *_ in conn.execute(f"PRAGMA table_info({table})")}
        documented = {name: cells[0] for name, cells in columns.items()}
        assert documented == live, f"docs/store-schema.md, table {table}: {documented}; the schema: {live}"


def test_the_store_schema_page_lists_every_cell_status_and_generation_end():
    page = (DOCS / "store-schema.md").read_text()
    documented = set(_tables(_section(page, "## `cells`"))[1])
    # The schema names the statuses in the comment on cells.status, the one list the code keeps.
    (named,) = re.findall(r"\bstatus TEXT NOT NULL,\s+-- ([a-z ]+)", "\n".join(s for m in MIGRATIONS for s in m))
    assert documented == set(named.split()), f"docs/store-schema.md: {sorted(documented)}; the schema: {named}"
    assert {status for status, _ in ERRORS.values()} <= documented
    ends = _section(page, "## `generations`")
    assert all(f"`{reason.value}`" in ends for reason in EndReason), "an end_reason is not in the page"


def test_the_error_names_page_gives_each_error_its_store_status():
    page = (DOCS / "errors.md").read_text()
    (rows,) = _tables(_section(page, "## klbr's own"))
    for ename, (status, _) in ERRORS.items():
        if ename == "KeyboardInterrupt":  # ipykernel's, not klbr's: below the table
            assert f"`{ename}` after an interrupt the cell obeyed (`{status}`" in page
            continue
        assert ename in rows, f"{ename} is not in docs/errors.md"
        assert f"`{status}`" in rows[ename][-1], f"docs/errors.md does not give {ename} the status {status}"
    for ename in ("InvalidMessage", "SubshellsNotSupported", "UsageError"):
        assert ename in rows
    (codes,) = _tables(_section(page, "## HostError codes"))
    assert set(CODES) == set(codes)


def _shown(error: CellError) -> str:
    return f"{error.ename}: {error.evalue}"


def test_the_error_names_page_shows_each_message_as_the_code_words_it():
    """Each example of docs/errors.md's "What the cell shows" is the text the code makes from the
    same facts, so the page cannot drift from what a notebook shows."""
    shown = _section((DOCS / "errors.md").read_text(), "## What the cell shows")
    lost = Ending(EndReason.LOST, -9, "killed by signal 9 (SIGKILL)")
    link = Ending(EndReason.LINK_LOST, None, "ssh://gpu1: silent for 30 s")
    failed = Ending(EndReason.START_FAILED, 1, "exited with status 1", "ModuleNotFoundError: No module named 'numpy'")
    try:
        line_magics("%klbr reboot")
    except MagicError as e:
        unknown = str(e)
    made = [
        _shown(with_rebuild_line(ending_error(lost, generation=1, pid=4242, cell="cell [3]"))),
        _shown(with_rebuild_line(ending_error(Ending(EndReason.KILLED, -15, "killed by signal 15 (SIGTERM)"),
                                              generation=1, pid=4242, cell="cell [3]", grace=3))),
        _shown(timeout_error(3, 60, killed=False)),
        _shown(ending_error(link, generation=2, pid=4242, cell="cell [7]")),
        _shown(refusal_error(Refusal("placement_lost", 0, detail=link.how))),
        _shown(refusal_error(Refusal("crash_loop", 5, 300))),
        _shown(refusal_error(Refusal("poisoned", 2))),
        _shown(ending_error(failed, generation=2, pid=4242, cell="cell [4]")),
        _shown(session_paused_error(StoreError("/home/me/.local/share/klbr/cells.sqlite3", "database or disk is full"))),
        _shown(internal_error("execute_request", KeyError("parent"))),
        _shown(no_reply_error("is_complete_request", 5)),
        f"UsageError: Nothing ran, and the namespace is as it was: {unknown}",
        f"UnsupportedPlatform: This cell did not run: {WHY}",
        idle_loss_notice(1, 4242, lost.how).rstrip("\n"),
    ]
    for text in made:
        assert f"```\n{text}\n```" in shown, f"docs/errors.md does not show, as the code words it:\n{text}"


def test_the_cli_page_names_every_command():
    page = (DOCS / "cli.md").read_text()
    for command in KlbrKernelCommand.subcommands:
        assert f"klbr-kernel {command}" in page, command


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target]


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_the_readme_links_every_page_and_every_link_lands():
    """Every page of docs/ is linked from the README, every decision from ARCHITECTURE.md, and
    every link of them lands (a heading, where it names one)."""
    decisions = {(DOCS / target.split("#")[0]).resolve() for target in _links(DOCS / "ARCHITECTURE.md")}
    unlisted = [p.name for p in (DOCS / "decisions").glob("*.md") if p.resolve() not in decisions]
    assert not unlisted, f"docs/ARCHITECTURE.md lists no {unlisted}"
    linked = {(ROOT / target.split("#")[0]).resolve() for target in _links(README)}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"README.md links no docs/{missing}"
    for page in [README, *PAGES, *sorted((DOCS / "decisions").glob("*.md"))]:
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            assert dest.exists(), f"{page.name}: {target} leads nowhere"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def test_every_page_of_the_docs_the_code_names_is_there():
    """A page under docs/ that a module's text names (a docstring pointing at a decision) is there."""
    named = set()
    for package in ("klbr_kernel", "klbr_supervisor", "benchmarks", "tests"):
        for module in (ROOT / package).rglob("*.py"):
            named |= {(module, found) for found in re.findall(r"\bdocs/[\w./-]+\.md\b", module.read_text())}
    assert named, "no module names a page"
    missing = sorted(f"{module.relative_to(ROOT)}: {page}" for module, page in named if not (ROOT / page).exists())
    assert not missing, missing


def test_the_readme_is_a_page_and_make_bench_writes_the_manual():
    readme = README.read_text()
    assert len(readme.splitlines()) <= 120
    assert "bench:start" not in readme
    page = (DOCS / "benchmarks.md").read_text()
    assert page.count("<!-- bench:start -->") == 1 and page.count("<!-- bench:end -->") == 1
    assert page.index("<!-- bench:start -->") < page.index("<!-- bench:end -->")
    assert "--doc docs/benchmarks.md" in (ROOT / "Makefile").read_text()


def _semantics() -> dict[int, str]:
    """docs/semantics.md's promises by their number (its `## N. Title` headings)."""
    page = (DOCS / "semantics.md").read_text()
    return {int(n): title for n, title in re.findall(r"^## (\d+)\. (.+)$", page, re.M)}


def test_the_semantics_are_numbered_one_to_thirteen_in_order():
    page = (DOCS / "semantics.md").read_text()
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", page, re.M)]
    assert numbers == list(range(1, 14)), numbers


def test_every_semantics_cited_is_one_the_repository_holds():
    """Code, tests and pages cite docs/semantics.md as "semantics N" (or "semantics 1, 9"); each
    number is one of its promises, and nothing cites a document the repository does not contain."""
    known = _semantics()
    sources = [p for folder in ("klbr_kernel", "klbr_supervisor", "tests", "benchmarks")
               for p in (ROOT / folder).rglob("*.py")] + [README, *DOCS.rglob("*.md")]
    cited: set[int] = set()
    outside = "DESIGN" + ".md"  # spelt apart, so that this file does not cite it
    for path in sources:
        text = path.read_text()
        assert outside not in text, f"{path.relative_to(ROOT)} cites {outside}, which is not in the repository"
        for numbers in re.findall(r"[Ss]emantics\s+(\d+(?:(?:,\s*|\s+and\s+)\d+)*)", text):
            for n in re.findall(r"\d+", numbers):
                assert int(n) in known, f"{path.relative_to(ROOT)} cites semantics {n}; docs/semantics.md has 1-13"
                cited.add(int(n))
    assert cited, "nothing cites docs/semantics.md"


# -- ARCHITECTURE.md names only what exists ----------------------------------------------------------

# Named in ARCHITECTURE.md and not ours: other libraries', a file a user writes, the wire's fields.
NOT_OURS = {"provisioning/", "Socket.send", "zmq.Frame", "bytes.translate", "datetime.fromisoformat", "header.session",
            "jupyter_klbr_config.py", "getppid", "pagehide"}


def _ours() -> tuple[dict[str, set[str]], set[str], set[str]]:
    """Of klbr's packages: every module by its last name, with the names defined in it (classes,
    functions, module-level names); the names of every method and class attribute; every file's
    and directory's path from the repository's root."""
    modules: dict[str, set[str]] = {}
    members: set[str] = set()
    for package in ("klbr_kernel", "klbr_supervisor"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            defined = modules.setdefault(path.stem if path.stem != "__init__" else path.parent.name, set())
            for node in tree.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    defined.add(node.name)
                elif isinstance(node, ast.Assign):
                    defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    defined.add(node.target.id)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            members.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            members.add(item.target.id)
    # The extension's TypeScript: each module by its name, with the classes, functions and
    # constants it exports.
    for path in (ROOT / "labextension" / "src").glob("*.ts"):
        modules.setdefault(path.stem, set()).update(
            re.findall(r"^export (?:default )?(?:abstract )?(?:async )?(?:class|function|const|interface|type) (\w+)",
                       path.read_text(), re.M))
    paths = {p.relative_to(ROOT).as_posix() + ("/" if p.is_dir() else "")
             for folder in ("klbr_kernel", "klbr_supervisor", "tests", "benchmarks", "docs", "labextension/src")
             for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts}
    paths |= {p.name for p in ROOT.glob("*.py")}  # the build hook beside pyproject.toml
    return modules, members, paths | {"klbr_kernel/", "klbr_supervisor/", "docs/"}


def _class(name: str) -> type | None:
    """Our class `name`, imported from the module that defines it."""
    for path in [*(ROOT / "klbr_kernel").rglob("*.py"), *(ROOT / "klbr_supervisor").rglob("*.py")]:
        if re.search(rf"^class {name}\b", path.read_text(), re.M):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
            found = getattr(module, name)
            return found if isinstance(found, type) else None
    return None


def _exists(token: str, modules: dict[str, set[str]], members: set[str], paths: set[str]) -> bool:
    word = token.split(maxsplit=1)[0]
    defined = set().union(*modules.values())
    if word.endswith((".py", ".ts", "/")):
        return any(p == word or p.endswith("/" + word) for p in paths)
    head, _, attr = word.partition(".")
    if not attr:
        return word in defined or word in members or word in modules or word in ERRORS or word.rstrip("/") in (
            "klbr_kernel", "klbr_supervisor")
    if head in modules and not head[0].isupper():  # a module's function or name
        return attr in modules[head]
    cls = _class(head)
    if cls is None:
        return False
    annotated = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
    return hasattr(cls, attr) or attr in annotated


def test_every_module_class_and_function_the_architecture_names_exists():
    """Each `code` span of docs/ARCHITECTURE.md that names a module (a path), a package, a class, a
    function or a method names one that is there; a rename that leaves the map behind fails here."""
    text = re.sub(r"```.*?```", "", (DOCS / "ARCHITECTURE.md").read_text(), flags=re.S)
    tokens = {t for t in re.findall(r"`([^`\n]+)`", text) if re.fullmatch(r"[\w./]+(?:\.py .*)?", t)} - NOT_OURS
    modules, members, paths = _ours()
    missing = sorted(t for t in tokens if not _exists(t, modules, members, paths))
    assert not missing, f"docs/ARCHITECTURE.md names what is not there: {missing}"
    assert len(tokens) > 150  # the check reads the map, not an empty page
