"""The shape of the code: no import circle between megaeval's modules (imports inside functions and under
TYPE_CHECKING included) and no module over 400 lines. Every module of the megaeval namespace is read with `ast`:
megaeval/ and the folders installed under it (kernels/, suites/, data_prep/ as megaeval.kernels, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"megaeval": "megaeval", "megaeval.kernels": "kernels", "megaeval.suites": "suites",
            "megaeval.data_prep": "data_prep"}  # fmt: skip
MAX_LINES = 400

# Exceptions, each with its reason: none today. An import edge (importer, imported) left out of the cycle check,
# and modules allowed over MAX_LINES.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
KNOWN_LONG: set[str] = set()


def modules() -> dict[str, Path]:
    """Every module of the megaeval namespace, by dotted name (a package by its own name: its __init__.py)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The megaeval modules `name` imports anywhere in its source: `import a.b`, `from a import b` (b a module,
    else a), relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` with c a name: the module that holds it
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

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
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_reader_finds_imports_of_every_kind():
    """Function-level, TYPE_CHECKING and relative imports all count (a circle hides in any of them)."""
    edges = graph()
    assert len(edges) > 50
    assert "megaeval.models" in edges["megaeval.cli.options"]  # inside functions
    assert "megaeval.distributed.context" in edges["megaeval.distributed.gather"]  # under TYPE_CHECKING
    assert "megaeval.models.base" in edges["megaeval.models.chunked"]  # relative
    assert "megaeval.kernels.dispatch" in edges["megaeval.models.megalodon.model"]  # a folder installed under megaeval


def test_no_import_circle():
    edges = {a: {b for b in targets if (a, b) not in KNOWN_CYCLE_EDGES} for a, targets in graph().items()}
    found = cycles(edges)
    assert not found, "import circles (each a set of modules that import each other): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_no_module_over_400_lines():
    lengths = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in modules().values()}
    long = {path: n for path, n in lengths.items() if n > MAX_LINES and path not in KNOWN_LONG}
    assert not long, f"modules over {MAX_LINES} lines (split each by concern): {long}"
