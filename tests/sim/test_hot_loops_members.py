"""The per-block loops of the 16-token replay read no member of a structref or named tuple
(the HBM view, the allocation output ``out``, the pool ``st``, the core ``cr``, a tier or
its view) and pass no view to a helper that reads its members: each such read is a counted
reference (numba ``NRT_incref`` / ``NRT_decref``, an atomic update each) per block, and the
Mooncake 16-token import places 9.3 M blocks and evicts nearly as many.  The members are
bound to locals once per call instead (docs/benchmarks.md, "Speed: the 16-token replay's counted
references").  Reads inside branches taken only with the decision
log on (``log_on``, ``life``) are allowed: the log costs what it costs.

On main before that change, ``spill._hbm_evicted_range`` read ``out.kind``,
``out.blocks``, ``out.evicted_hash`` and called ``prefetch_view(view, ...)`` per block (and
per tier), ``placement._place`` read ``view.insert_us``, ``view.content_hash``,
``view.tenant`` and ``out.blocks`` per block, and ``pool_ops.allocate`` read
``view.last_access_us`` per evicted block (and the hit blocks' ``st`` members per hit),
and ``tier_ops.touch_range`` read a tier's view and policy per promoted block."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from kvsim.memory import pool_ops
from kvsim.replay.kernel import placement, spill, tier_ops

#: Names that hold a structref or a named tuple of arrays in these functions.
COUNTED = {"cr", "st", "out", "view", "T", "T1", "T2", "T3", "L_view", "L1_view", "L2_view",
           "L3_view"}
#: Branches run only with the decision log on.
LOG_FLAGS = {"log_on", "life"}
#: Helpers that read a view's members (a call passes the view and reads them again).
VIEW_READERS = {"prefetch_view", "_set_view_from_record"}

HOT = [(spill, "_hbm_evicted_range"), (placement, "_place"), (pool_ops, "allocate"),
       (tier_ops, "touch_range")]


def _log_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and any(
        isinstance(n, ast.Name) and n.id in LOG_FLAGS for n in ast.walk(node.test))


def _reads(node: ast.AST, found: list[str]) -> None:
    """Counted reads under ``node`` (a loop's statement), skipping log-only branches and
    raises."""
    if _log_only(node):
        for n in node.orelse:
            _reads(n, found)
        return
    if isinstance(node, ast.Raise):
        return
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id in COUNTED:
        found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in VIEW_READERS:
            found.append(f"{name}(...) (line {node.lineno})")
    for child in ast.iter_child_nodes(node):
        _reads(child, found)


def _loops(node: ast.AST, found: list[str]) -> None:
    """Check every loop outside the log-only branches."""
    if _log_only(node):
        for n in node.orelse:
            _loops(n, found)
        return
    if isinstance(node, (ast.For, ast.While)):
        for stmt in node.body:
            _reads(stmt, found)
    for child in ast.iter_child_nodes(node):
        _loops(child, found)


def _loop_reads(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.py_func)))
    found: list[str] = []
    _loops(tree, found)
    return sorted(set(found))


@pytest.mark.parametrize("mod,name", HOT, ids=[f"{m.__name__}.{n}" for m, n in HOT])
def test_per_block_loops_read_no_counted_member(mod, name):
    assert _loop_reads(getattr(mod, name)) == []
