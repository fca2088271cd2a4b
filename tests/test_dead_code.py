"""No dead compiled code: every function kvsim compiles (decorated with kvsim's ``njit``) is
used, by name, somewhere in kvsim, the built-in policies, the tests or bench/.  Names in
docstrings and comments do not count (``tiers.prefetch_view`` stayed, named only in a
docstring, after its last caller moved to ``prefetch_lines``; ``fast_loops._push_head``
had no caller at all)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _names(tree: ast.AST) -> set[str]:
    """Every name used in code: variables, attributes, imported names."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.rsplit(".", 1)[-1])
    return out


def _compiled(tree: ast.Module) -> list[ast.FunctionDef]:
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if (d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "njit":
                    found.append(node)
    return found


def test_every_compiled_function_is_used() -> None:
    used: set[str] = set()
    compiled: list[tuple[str, str]] = []
    for folder in ("kvsim", "policies", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            used |= _names(tree)
            if folder == "kvsim":
                compiled += [(str(path.relative_to(ROOT)), f.name) for f in _compiled(tree)]
    assert len(compiled) > 200
    dead = [f"{path}: {name}" for path, name in compiled if name not in used]
    assert not dead, f"compiled functions nothing uses: {dead}"
