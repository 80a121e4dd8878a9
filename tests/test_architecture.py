"""The structure docs/architecture.md promises: no import cycles between or inside packages, and no
source file longer than the limit (the layers themselves are `lint-imports`' contracts)."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

import priorattn

SOURCE = Path(priorattn.__file__).parent
MAX_LINES = 600  # a file past this is split along its seams


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node: each is an import cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def imports() -> grimp.ImportGraph:
    return grimp.build_graph("priorattn", cache_dir=None)


def test_strongly_connected_finds_a_cycle_and_nothing_else():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back(imports):
    modules = {m: set(imports.find_modules_directly_imported_by(m)) for m in imports.modules}
    assert strongly_connected(modules) == []


def test_no_package_imports_itself_back(imports):
    def room(module: str) -> str:  # priorattn.studies.compare.study -> priorattn.studies.compare
        parts = module.split(".")
        return ".".join(parts[:3] if parts[1:2] == ["studies"] else parts[:2])

    rooms: dict[str, set[str]] = {}
    for module in imports.modules:
        for imported in imports.find_modules_directly_imported_by(module):
            if room(imported) != room(module):
                rooms.setdefault(room(module), set()).add(room(imported))
    assert strongly_connected(rooms) == []


def test_no_source_file_is_over_the_limit():
    long = {
        str(path.relative_to(SOURCE)): n
        for path in sorted(SOURCE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
