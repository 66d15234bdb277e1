"""The package's modules import each other without a circle: data flows one way, and no import has to be deferred
into a function to break a loop.

The graph is read from the source (the AST), so imports inside functions count as much as those at the top. An
edge goes to the module an import names: `from dietpe.x import y` is an edge to `dietpe.x.y` when that is a
module, else to `dietpe.x`. Parent packages that Python runs on the way are not edges (every module would then
depend on `dietpe/__init__`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import dietpe

ROOT = Path(dietpe.__file__).parent
PACKAGE = "dietpe"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, read from its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` imports anywhere in its source."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(name, node, path.name == "__init__.py")
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import dietpe.x.y as z` names a module; attributes do not
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                out.add(target)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [sorted(c) for c in components]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each component: the modules in import order, the first repeated at the end."""
    return [_circle(c, edges) for c in components(edges)]


def _circle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not a cycle")


def test_no_import_cycle():
    edges = graph()
    found = []
    for component in components(edges):
        circle = _circle(component, edges)
        rest = sorted(set(component) - set(circle))
        found.append(" -> ".join(circle) + (f"  (the same knot also holds {', '.join(rest)})" if rest else ""))
    assert not found, "import cycles (break each by moving code, not by deferring an import):\n" + "\n".join(found)


def test_the_graph_sees_deferred_and_relative_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "a.py").write_text("import os\n\ndef f():\n    from dietpe.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom dietpe.sub import c as _c\n")
    (pkg / "sub" / "c.py").write_text("from dietpe import a\nx = 1\n")
    edges = graph(pkg)
    assert edges == {"dietpe": set(), "dietpe.a": {"dietpe.sub.b"}, "dietpe.sub": {"dietpe.sub.b"},
                     "dietpe.sub.b": {"dietpe.a", "dietpe.sub.c"}, "dietpe.sub.c": {"dietpe.a"}}
    assert cycles(edges) == [["dietpe.a", "dietpe.sub.b", "dietpe.a"]]
