"""The package's structure: one direction of flow, so no module imports one that imports it back,
not even through a function-local import (which Python tolerates and a reader does not see)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "codegen"


def module_imports() -> dict[str, set[str]]:
    """Each codegen module's imports of other codegen modules, wherever in the module they are:
    ``from pkg import name`` counts as an import of ``pkg.name`` where that is a module, else of
    ``pkg`` (the package's ``__init__`` runs either way, so it is an edge too when named)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in order:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], order[successor])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    graph = module_imports()
    assert {"codegen.api", "codegen.tuning_db", "codegen.tune"} <= set(graph)
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(component) + " (" + ", ".join(f"{m} -> {sorted(graph[m] & set(component))}" for m in component) + ")"
        for component in found)


def test_the_cycle_finder_finds_a_function_local_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_tuning_database_sits_below_the_plan_and_the_search_above_it():
    graph = module_imports()
    assert "codegen.tune" not in graph["codegen.api"] and "codegen.api" not in graph["codegen.tuning_db"]
    assert "codegen.tuning_db" in graph["codegen.api"] and "codegen.api" in graph["codegen.tune"]


def test_every_name_the_package_imports_from_itself_exists():
    """A function-local ``from codegen.x import y`` runs only on its path (bench conv's import of a
    moved function once failed only on the GPU): each one is resolved here."""
    import importlib

    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "codegen":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, missing
