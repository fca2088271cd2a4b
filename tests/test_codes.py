"""kvsim.core.codes is the one source of the enum codes compiled code uses: no module of
kvsim/ or policies/ writes out a copy (``PR_DECODE_CRITICAL = 3``, ``K_STEP, ... =
range(8)``, ``HBM = 0``); each takes the name from kvsim.core.codes or derives it from the
enum (``int(Phase.IDLE)``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvsim.core import codes, schema

ROOT = Path(__file__).resolve().parents[1]
#: Where the codes are defined: the enums and their plain ints, and the schema's re-export.
DEFINERS = {ROOT / "kvsim/core/codes.py", ROOT / "kvsim/core/schema.py"}
#: Prefixes a copy of each enum's codes has been (or might be) written under; the empty
#: prefix catches a bare ``HBM = 0``.
ALIASES = {codes.EventKind: ("EK_", "K_", "EV_", "KIND_"), codes.Phase: ("PH_", "PHASE_"),
           codes.Priority: ("PR_", "PRIO_", "PRIORITY_"), codes.Tier: ("TIER_", "T_", ""),
           codes.Action: ("A_", "ACT_"), codes.Reason: ("W_", "WHY_")}


def _names_a_code(name: str) -> bool:
    """``name`` is a prefix (of ALIASES) + a member name, or + the start (3 characters or
    more) of one of a member's words (``PR_CRIT`` for DECODE_CRITICAL)."""
    for enum, prefixes in ALIASES.items():
        for prefix in prefixes:
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            for member in enum.__members__:
                if rest == member or (prefix and len(rest) >= 3 and any(
                        w.startswith(rest) for w in member.split("_"))):
                    return True
    return False


def _int_literals(node) -> int | None:
    """How many int values ``node`` is made of literally: an int (or ``-int``), a tuple of
    them, or ``range(...)`` of int literals; None if it is anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return 1
    if isinstance(node, ast.Tuple):
        parts = [_int_literals(e) for e in node.elts]
        return None if None in parts else len(parts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" \
            and all(_int_literals(a) == 1 for a in node.args):
        return 1
    return None


def literal_code_copies(source: str) -> list[str]:
    """``line: name`` of every module-level assignment of an int literal (or a tuple of
    them, or ``range(...)``) to a name that names an enum code."""
    out = []
    for stmt in ast.parse(source).body:
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        if _int_literals(stmt.value) is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            for n in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(n, ast.Name) and _names_a_code(n.id):
                    out.append(f"{stmt.lineno}: {n.id}")
    return out


FILES = sorted(p for d in ("kvsim", "policies") for p in (ROOT / d).rglob("*.py")
               if p not in DEFINERS)


def test_scan_finds_the_copies_it_is_for():
    old = ("K_STEP, K_ARRIVE, K_ALLOCATE = range(3)\nPR_DECODE_CRITICAL = 3\n"
           "PH_ROLLBACK = 4  # Phase\nPR_COLD, PR_WARM, PR_HOT, PR_CRIT = range(4)\n"
           "HBM = 0\nEV_FREE = -7\n"
           "K_LOG = 3\nK_WARMUP_STEP = 7\nPH_IDLE = int(Phase.IDLE)\nST_DONE = 0\n"
           "PR_SET_PDEATHSIG = 1\n")
    assert [s.split(": ")[1] for s in literal_code_copies(old)] == [
        "K_STEP", "K_ARRIVE", "K_ALLOCATE", "PR_DECODE_CRITICAL", "PH_ROLLBACK", "PR_COLD",
        "PR_WARM", "PR_HOT", "PR_CRIT", "HBM", "EV_FREE"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_copies_an_enum_code(path):
    found = literal_code_copies(path.read_text())
    assert not found, (f"{path.relative_to(ROOT)} writes out enum codes; import them from "
                       f"kvsim.core.codes (or derive them: int(Phase.IDLE)): {found}")


def test_codes_are_their_members_and_schema_reexports_the_enums():
    for enum, prefix in codes.PREFIXES.items():
        for member in enum:
            value = getattr(codes, prefix + member.name)
            assert type(value) is int and value == member.value
    for enum in (codes.EventKind, codes.Phase, codes.Priority, codes.Tier):  # the event schema's
        assert getattr(schema, enum.__name__) is enum
    from kvsim.core.layout import GI_WHY  # noqa: F401  (the log's why column: Reason)
    from kvsim.replay.kernel.core import WHY
    from kvsim.results.log_schema import Action

    assert Action is codes.Action  # the decision log's action codes
    assert len(WHY) == len(codes.Reason)  # a sentence per reason
