"""The packages stay readable: no two modules import each other, and no module hands another a private name.

The packages are the agent's (``coordinator``) and the simulator's (``azuresim``, in ``sim/``). Two modules
that import each other, directly or through others, are one idea split in the wrong place, and only work by
the order in which Python happens to import them; a name another module imports is part of its module's
interface, and says so by having no leading underscore. Modules follow the seams of the ideas they hold,
not a count of lines. These rules are kept here, so that they hold without a reviewer.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
PACKAGE = ROOT / "coordinator"
SIMULATOR = ROOT / "sim" / "azuresim"
PACKAGES = (PACKAGE, SIMULATOR)


def _sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted(package.rglob("*.py"))]


def _modules() -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by the name of its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(package.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]) -> Iterator[str]:
    """The package's modules one import statement of module ``name`` loads by name: ``from a.b import c``
    loads ``a.b.c`` when that is a module, else ``a.b``; relative imports resolved."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            yield target


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, counting every import statement in the file: at the top,
    inside a function (a late import only hides a loop) and under ``TYPE_CHECKING``."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[name].update(_imported(name, path, node, modules))
    return graph


def _loops(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively), each
    sorted: every module of one imports every other, directly or through the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        loops.append(sorted(component))
    return loops


def test_no_two_modules_of_the_package_import_each_other() -> None:
    loops = _loops(_import_graph())
    assert not loops, "modules that import each other (directly or in a loop): " + "; ".join(
        " <-> ".join(loop) for loop in loops)


def test_the_loop_finder_finds_a_direct_and_an_indirect_loop_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "f"}, "f": set(), "g": {"a", "f"}}
    assert sorted(_loops(graph)) == [["a", "b"], ["c", "d", "e"]]
    assert _loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_sees_late_and_relative_imports_of_the_package(tmp_path: Path) -> None:
    # The package's own graph holds the imports between the decision's modules; a synthetic package shows
    # that a relative import inside a function counts like any other.
    graph = _import_graph()
    assert "coordinator.decide.events" in graph["coordinator.decide.approval"]
    assert "coordinator.decide.decision" in graph["coordinator.decide"]
    modules = {"coordinator.x": tmp_path / "x.py", "coordinator.x.y": tmp_path / "y.py"}
    late = ast.parse("def f():\n    from . import y\n")
    node = next(n for n in ast.walk(late) if isinstance(n, ast.ImportFrom))
    assert list(_imported("coordinator.x", tmp_path / "__init__.py", node, modules)) == ["coordinator.x.y"]


def _exported(tree: ast.Module) -> list[str]:
    """The names of a module's ``__all__`` (a list or tuple of strings at the top level), or none."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node.value, ast.List | ast.Tuple)
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_exports_a_private_name() -> None:
    exported = {str(path.relative_to(ROOT)): private for path in _sources()
                if (private := [n for n in _exported(ast.parse(path.read_text(), str(path))) if _private(n)])}
    assert not exported, f"private names in __all__ (make them public, or leave them out): {exported}"


def test_no_module_imports_a_private_name_of_another() -> None:
    modules = _modules()
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    target = next(iter(_imported(name, path, ast.ImportFrom(node.module, [alias], node.level),
                                                 modules)), None)
                    if target is not None and _private(alias.name):
                        found.append(f"{name} imports {alias.name} from {target}")
    assert not found, "modules that hand each other private names: " + "; ".join(found)


def test_the_simulator_imports_nothing_of_the_agent() -> None:
    # A faithful simulator does not share the code it tests: its rate limit, dates and document are its own.
    graph = _import_graph()
    agent = [f"{name} imports {target}" for name, targets in graph.items() if name.partition(".")[0] == "azuresim"
             for target in targets if target.partition(".")[0] == "coordinator"]
    assert not agent, agent
    sources = {str(p.relative_to(ROOT)) for p in SIMULATOR.rglob("*.py")
               if re.search(r"^\s*(from|import) coordinator\b", p.read_text(), re.M)}
    assert not sources, sources
