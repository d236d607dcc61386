"""The house rules (issue #65), measured on the code itself: no module over 500 lines, no import circle among the
modules of rope_ext/ and evals/ (imports inside functions included), rope_ext importing neither evals nor Hydra, and
nothing in rope_ext outside the exporter importing the exporter (the patcher needs no engine)."""

import ast
from pathlib import Path

from tests.tiny import ROOT

PACKAGES = ("rope_ext", "evals")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The project modules ``name`` imports, at module level or inside functions (TYPE_CHECKING blocks included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            stem = ".".join([*base, *([node.module] if node.module else [])])
            targets = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name imported from a module: the module
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a package's own __init__ aside
                found.add(target)
    return found


def _external(path: Path) -> set[str]:
    """The top-level packages a module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_no_module_is_over_500_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, long


def test_no_import_circle_and_rope_ext_depends_on_nothing_above_it():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert not _circles(graph), _circles(graph)
    upward = {name: sorted(t for t in targets if t.startswith("evals")) for name, targets in graph.items()}
    assert not {name: t for name, t in upward.items() if name.startswith("rope_ext") and t}
    exporter = {
        name: sorted(t for t in targets if t.startswith("rope_ext.export"))
        for name, targets in graph.items()
        if name.startswith("rope_ext") and not name.startswith("rope_ext.export") and name != "rope_ext"
    }
    assert not {name: t for name, t in exporter.items() if t}, exporter
    externals = {name: _external(path) for name, path in modules.items() if name.startswith("rope_ext")}
    assert not {name: found for name, found in externals.items() if found & {"hydra", "omegaconf"}}


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
