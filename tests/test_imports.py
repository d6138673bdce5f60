"""The project's modules import one another in one direction, read from their source with `ast`.

Every import counts, also one inside a function: deferring an import hides a cycle from the
interpreter, it does not remove it (a newcomer still cannot read one module without the other).
What sits under ``if TYPE_CHECKING:`` is a type's back-reference, never run, and does not count.
Importing ``a.b`` also runs the package ``a``'s ``__init__``; that is not an edge here, so a package
may re-export its own modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("klbr_kernel", "klbr_supervisor")


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages, by its dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that module `name` (its source at `path`) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def ours(dotted: str) -> str | None:
        """The module `dotted` names, or the longest known package it is in (None: not ours)."""
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(filter(None, (ours(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
                target = ours(f"{source}.{alias.name}") if f"{source}.{alias.name}" in known else ours(source)
                if target:
                    targets.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    known = project_modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the modules along it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def walk(name: str) -> list[str] | None:
        path.append(name)
        on_path.add(name)
        for target in sorted(graph.get(name, ())):
            if target in on_path:
                return [*path[path.index(target):], target]
            if target not in done:
                cycle = walk(target)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(name)
        done.add(name)
        return None

    for name in sorted(graph):
        if name not in done:
            cycle = walk(name)
            if cycle:
                return cycle
    return None


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another in a circle (strongly connected, 2 or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(name: str) -> None:  # Tarjan's algorithm
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in graph.get(name, ()):
            if target not in index:
                connect(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = []
            while not group or group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return sorted(found)


def test_the_check_sees_imports_inside_functions_and_skips_type_checking_ones(tmp_path):
    """The check itself, on a package made for it: a cycle closed by an import inside a function
    is found; one closed only under TYPE_CHECKING is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def later():\n    from .a import thing\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nfrom .a import x\n"
                                  "if TYPE_CHECKING:\n    from .d import y\n")
    (package / "d.py").write_text("from .c import z\n")
    known = {f"pkg.{p.stem}" if p.stem != "__init__" else "pkg": p for p in package.glob("*.py")}
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"] and tangles(graph) == [["pkg.a", "pkg.b"]]
    del graph["pkg.b"]
    assert find_cycle(graph) is None


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, ("an import cycle: " + " -> ".join(cycle) + "; modules in cycles: "
                           + "; ".join(", ".join(group) for group in tangles(graph)))


def test_klbr_supervisor_never_imports_klbr_kernel():
    """The supervisor knows nothing of frontends: imports flow klbr_kernel -> klbr_supervisor only."""
    back = sorted(f"{name} -> {target}" for name, targets in import_graph().items()
                  if name.startswith("klbr_supervisor") for target in targets if target.startswith("klbr_kernel"))
    assert not back, back


def _named_modules(path: Path) -> list[str]:
    """The strings in `path`'s code (not its docstrings) that name a module of klbr_kernel."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and (node.value == "klbr_kernel" or node.value.startswith("klbr_kernel."))]


def test_klbr_supervisor_never_looks_klbr_kernel_up_by_name():
    """Nor behind the import statement's back (`find_spec`, `import_module`, a path built from the
    name): what it needs of the kernel (the host client's files) it is handed."""
    named = sorted(f"{name}: {text}" for name, path in project_modules().items() if name.startswith("klbr_supervisor")
                   for text in _named_modules(path))
    assert not named, named


# The kernel's packages in layers, lowest first: each imports only the ones before it (and
# klbr_supervisor), so a newcomer can read them in this order. TYPE_CHECKING imports do not count.
KERNEL_LAYERS = ("klbr_kernel.requests", "klbr_kernel.frontend", "klbr_kernel.cell_log", "klbr_kernel.magics",
                 "klbr_kernel.comm", "klbr_kernel.proxy")
# The supervisor's: what the operating system does at the bottom (the boot modules use its standard
# library parts), its leaf packages below the generation, the generation below the supervisor.
SUPERVISOR_LAYERS = ("klbr_supervisor.system", "klbr_supervisor.boot", "klbr_supervisor.messages", "klbr_supervisor.store",
                     "klbr_supervisor.targets", "klbr_supervisor.host", "klbr_supervisor.generation")


def _layer(name: str, layers: tuple[str, ...]) -> int | None:
    return next((i for i, layer in enumerate(layers) if name == layer or name.startswith(layer + ".")), None)


def test_the_packages_import_only_the_layers_below_them():
    graph = import_graph()
    upward = []
    for layers in (KERNEL_LAYERS, SUPERVISOR_LAYERS):
        for name, targets in graph.items():
            here = _layer(name, layers)
            for target in targets:
                there = _layer(target, layers)
                if here is not None and there is not None and there > here:
                    upward.append(f"{name} -> {target}")
    assert not upward, upward


def test_every_package_is_in_a_layer_or_stands_apart():
    """A new subpackage is given its place in a layer list above (or is one of those that stand
    apart: the kernel's process, the CLI, the host client, which no layer imports)."""
    apart = {"klbr_kernel.cli", "klbr_kernel.host"}
    packages = {name for name, path in project_modules().items() if path.name == "__init__.py" and name.count(".") == 1}
    placed = set(KERNEL_LAYERS) | set(SUPERVISOR_LAYERS) | apart
    assert packages <= placed, sorted(packages - placed)


def test_the_host_client_is_no_module_of_the_kernel_process():
    """`klbr_kernel.host` runs in workers: importing it changes how its process starts threads, so
    nothing of the kernel imports it (the kernel hands its files over as text, `client_package`),
    and it imports nothing of klbr but itself."""
    graph = import_graph()
    into = sorted(f"{name} -> {target}" for name, targets in graph.items() if not name.startswith("klbr_kernel.host")
                  for target in targets if target.startswith("klbr_kernel.host"))
    out = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith("klbr_kernel.host")
                 for target in targets if not target.startswith("klbr_kernel.host"))
    assert not into and not out, into + out


def _third_party(path: Path) -> set[str]:
    """The top-level names `path` imports that are neither the standard library nor klbr's."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}


def test_what_runs_before_the_kernels_imports_is_light():
    """The stand-in answers kernel_info before jupyter_client, traitlets or asyncio are imported, and
    the host client runs in any worker: both, and every module of ours they import, need the
    standard library and pyzmq only."""
    graph, known = import_graph(), project_modules()
    for start in ("klbr_kernel.frontend.standin", "klbr_kernel.host", "klbr_kernel.client_package"):
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += graph[name]
        # The worker bootstrap's imports inside its functions run in the worker it starts, never
        # in a process that imports it (tests/test_boot.py holds it to the worker's own packages).
        heavy = {name: sorted(_third_party(known[name]) - {"zmq"}) for name in sorted(seen)
                 if name != "klbr_supervisor.boot.bootstrap"}
        assert not any(heavy.values()), {start: {k: v for k, v in heavy.items() if v}}
