"""The shape of the package, checked on its source (AST): the CLI and the web app sit on top, no
import cycles, no module reaching into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "ftplan"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported ftplan module, names imported from it, line) for every import in module ``name``,
    module level or inside functions."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if _is_package(name) else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "ftplan"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "ftplan":
                continue
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{target}.{n}" in MODULES]
            if subs:  # ``from . import export``: the submodule itself
                out += [(f"{target}.{n}", [], node.lineno) for n in subs]
                names = [n for n in names if n not in subs]
                if not names:
                    continue
            out.append((target, names, node.lineno))
    return out


def _known(target: str) -> str:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def test_nothing_below_the_cli_and_the_web_imports_them():
    bad = []
    for name in MODULES:
        if name.startswith(("ftplan.cli", "ftplan.web")):
            continue
        for target, _, line in _imports(name):
            if target.startswith(("ftplan.cli", "ftplan.web")):
                bad.append(f"{MODULES[name].relative_to(SRC)}:{line} imports {target}")
    assert not bad, bad


def test_no_import_cycles():
    graph = {name: {_known(t) for t, _, _ in _imports(name)} - {name, ""} for name in MODULES}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_no_cross_module_private_imports():
    bad = []
    for name in MODULES:
        for target, names, line in _imports(name):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.append(f"{MODULES[name].relative_to(SRC)}:{line} imports {', '.join(private)} from {target}")
    assert not bad, bad
