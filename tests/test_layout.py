"""The package's shape, checked: imports run one way, no cycles, modules a newcomer can read.

Every module of ``kvsim/`` and ``policies/`` (installed as ``kvsim.policies``) is parsed;
every ``import`` statement counts, those inside functions too.  The layers, lowest first
(docs/architecture.md, "Import order"): a module may import its own layer and the layers
below it, never one above; and no set of modules may import each other in a cycle.

The root package ``kvsim`` (``kvsim/__init__.py``) is left out of the graph: Python runs it
before any ``kvsim.x`` anyway, and it sets numba's cache directory
(:mod:`kvsim.jit.cache_key`) before anything compiles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (package prefix, layer); the longest matching prefix decides.  Lowest first.
LAYERS = (
    ("kvsim.core", 0),
    ("kvsim.jit", 1), ("kvsim.spec", 1),
    ("kvsim.events", 2), ("kvsim.ingest", 2),
    ("kvsim.policy", 3), ("kvsim.policies", 3),
    ("kvsim.memory", 4), ("kvsim.engine", 4), ("kvsim.replay.kernel", 4),
    ("kvsim.results", 4), ("kvsim.backends", 4),
    ("kvsim.replay", 5), ("kvsim.cachesim", 5),
    ("kvsim.bounds", 6),
    ("kvsim.modes", 7), ("kvsim.analysis", 7), ("kvsim.workload", 7),
    ("kvsim.api", 8),
    ("kvsim.cli", 9), ("kvsim.__main__", 9),
)
MAX_MODULE_LINES = 600
MAX_MODULES_PER_FOLDER = 20


def _modules() -> dict[str, Path]:
    mods = {}
    for top, name in (("kvsim", "kvsim"), ("policies", "kvsim.policies")):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kvsim modules ``name`` imports (the longest known module of each dotted name;
    ``from pkg import submodule`` names the submodule, not the package)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def known(dotted: str) -> str | None:
        while dotted and dotted not in MODULES:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
        for t in targets:
            if t.startswith("kvsim"):
                mod = known(t)
                if mod and mod != name and mod != "kvsim":
                    out.add(mod)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """module -> the kvsim modules it imports.  Parsed when a test asks, not at collection:
    every pytest-xdist worker collects this file, one runs its tests."""
    return {name: _imports(name, path) for name, path in MODULES.items() if name != "kvsim"}


def layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def test_every_module_has_a_layer(graph) -> None:
    assert all(isinstance(layer(m), int) for m in graph)


def test_imports_run_one_way(graph) -> None:
    wrong = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                   for m, targets in graph.items() for t in targets if layer(t) > layer(m))
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycles(graph) -> None:
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_detection_sees_a_function_level_import(graph, tmp_path, monkeypatch) -> None:
    """The checks are not vacuous: a cycle closed by an import inside a function is found."""
    monkeypatch.setitem(graph, "kvsim.core.errors", graph["kvsim.core.errors"] | {"kvsim.cli"})
    assert any("kvsim.core.errors" in c for c in _cycles(graph))
    code = "def f():\n    from kvsim.cli import app\n"
    (tmp_path / "m.py").write_text(code)
    assert _imports("kvsim.core.m", tmp_path / "m.py") == {"kvsim.cli"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_fits_in_one_sitting(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{MODULES[name]}: {lines} lines"


def test_folders_stay_small() -> None:
    counts: dict[Path, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    big = {str(p.relative_to(ROOT)): n for p, n in counts.items() if n > MAX_MODULES_PER_FOLDER}
    assert not big, big
