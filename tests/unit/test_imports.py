"""Imports go one way: no cycle between the gateway's modules, and no import inside a function to dodge one.

Read from the source (ast), so the rule holds for code paths no test runs.
Third-party packages may still be imported inside functions where they are
heavy and optional for the caller (vLLM, torch, transformers...); modules of
this project may not: a function-level import of our own code only ever hides
a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service",)
OWN = ("service", "qualification")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """Our modules an import statement loads (a `from pkg import sub` loads the submodule)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    base = node.module or ""
    if node.level or not base.startswith(OWN):
        return []
    targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
    return targets or ([base] if base in modules else [])


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try) and not (isinstance(node, ast.If) and _is_type_checking(node)):
            found += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = {target for node in _top_level_imports(tree) for target in _imported(node, modules)} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _function_level_own_imports() -> list[str]:
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OWN) and not node.level:
                    found.append(f"{name}:{node.lineno} from {node.module}")
                elif isinstance(node, ast.Import) and any(a.name.startswith(OWN) for a in node.names):
                    found.append(f"{name}:{node.lineno} import {node.names[0].name}")
    return found


def test_the_graph_sees_the_real_imports() -> None:
    graph = _graph()
    assert "service.transcription.pipeline" in graph["service.api.transcriptions.serving"]
    assert "service.transcription.tracks" in graph["service.transcription.pipeline"]


def test_cycle_detection_finds_a_planted_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_gateway_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_function_level_import_of_our_own_modules() -> None:
    assert _function_level_own_imports() == []


def test_transcription_layers_import_one_way() -> None:
    """routes -> serving -> pipeline -> tracks -> engine pass -> engine protocol; never back up."""
    graph = _graph()
    below_http = [name for name in graph if name.startswith("service.transcription")]
    assert below_http
    for name in below_http:
        assert not any(t.startswith(("service.api", "fastapi", "starlette")) for t in graph[name]), name
    assert not any(t.startswith("service.transcription.pipeline") for t in graph["service.transcription.tracks"])
