"""kvsim.jit.compile_speed: numba's TargetConfig.values() patched for speed gives exactly what
numba's own gives (same keys, order, values), so overload caches key as before."""

from __future__ import annotations

import re
import subprocess
import sys

from numba.core import targetconfig
from numba.core.compiler import Flags

from kvsim.jit import compile_speed as numba_speed


def _flag_sets() -> list[Flags]:
    plain = Flags()
    some = Flags()
    some.nrt = True
    some.no_cpython_wrapper = True
    some.error_model = "numpy"
    copied = some.copy()
    copied.inline = "always"
    back_to_default = Flags()
    back_to_default.nrt = False  # set explicitly to its default value
    return [plain, some, copied, back_to_default]


def test_values_are_numbas_own() -> None:
    numba_speed.install()
    assert targetconfig.TargetConfig.values is numba_speed._values
    original = numba_speed.ORIGINAL_VALUES
    assert original is not None and original is not numba_speed._values
    for flags in _flag_sets():
        fast, slow = flags.values(), original(flags)
        assert fast == slow
        assert list(fast) == list(slow)  # same order of keys
        assert len(fast) == len(Flags.options) > 10


def test_equality_and_hash_unchanged() -> None:
    numba_speed.install()
    plain, some, copied, back_to_default = _flag_sets()
    assert plain == back_to_default and hash(plain) == hash(back_to_default)
    assert some != copied and some == some.copy() and hash(some) == hash(some.copy())
    assert plain != some


def test_opt_out_leaves_numba_alone() -> None:
    code = ("import kvsim.jit.compile_speed as s; from numba.core import targetconfig as t; "
            "s.install(); print(t.TargetConfig.values is s._values)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"KVSIM_NUMBA_PATCHES": "0", "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


_TYPINGS = r'''
import json, sys
import numpy as np
from numba import njit

@njit
def busy(a, k, f, t):
    s = 0
    for i in range(a.shape[0]):
        s += a[i] * k + max(i, k) - min(i, 3)
        if a[i] > k and i % 2 == 0:
            s -= abs(a[i]) // 2
    b = np.empty(a.shape[0], dtype=np.float64)
    for i in range(b.shape[0]):
        b[i] = f * a[i] + float(t[0]) / (i + 1)
    x, y = t
    return s, b.sum() + x + y, np.int64(s) << 2, len(a), np.argmax(a)

@njit
def callers(a):
    return busy(a, 3, 1.5, (1, 2)), busy(a, np.int64(7), 2, (3.0, 4))

if sys.argv[1] == "1":
    from kvsim.jit import compile_speed as numba_speed
    numba_speed.install()
a = np.arange(10, dtype=np.int64)
r = callers(a)
out = {"result": repr(r)}
for d in (busy, callers):
    for sig, cres in d.overloads.items():
        out[f"{d.__name__}{sig}"] = {
            "typemap": sorted((k, str(v)) for k, v in cres.type_annotation.typemap.items()),
            "calltypes": sorted(str(v) for v in cres.type_annotation.calltypes.values()),
        }
print(json.dumps(out, sort_keys=True))
'''


def test_memoised_call_typing_types_everything_as_numba_does() -> None:
    """The same functions typed with and without kvsim's patches: every variable's type
    and every call's signature are the same (and the results), and the memo was used."""
    outs = []
    for patched in ("0", "1"):
        res = subprocess.run([sys.executable, "-c", _TYPINGS, patched], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        outs.append(re.sub(r"0x[0-9a-f]+", "0x?", res.stdout))  # objects' addresses
    assert outs[0] == outs[1]
    assert '"calltypes"' in outs[0] and "busy(" in outs[0]


def test_memo_holds_only_successful_resolutions() -> None:
    import operator

    import pytest
    from numba import njit, types
    from numba.core import errors

    numba_speed.install()

    @njit
    def add(a, b):
        return a + b

    assert add(2, 3) == 5
    from numba.core.registry import cpu_target

    fnty = cpu_target.typing_context.resolve_value_type(operator.add)
    memo = fnty.__dict__.get("_kvsim_calls")
    assert memo and any(k[2] == (types.int64, types.int64) for k in memo)
    with pytest.raises(errors.TypingError):
        add(2, "x")
    # this call's failed resolution is not memoised (other tests may have memoised
    # successful string additions in the same process)
    assert not any(k[2] == (types.int64, types.unicode_type) for k in memo)


def test_pruned_meminfo_walk_finds_numbas_pointers_in_numbas_order() -> None:
    """For values of many types (arrays, tuples of arrays and scalars, structrefs, named
    tuples, optionals, lists): the patched walk returns the same (type, pointer) list as
    numba's own, as LLVM values extracted along the same paths."""
    import numpy as np
    from llvmlite import ir
    from numba import typeof, types
    from numba.core.registry import cpu_target
    from numba.core.runtime.context import NRTContext

    numba_speed.install()
    pruned = NRTContext.get_meminfos
    original = pruned.__wrapped__
    ctx = cpu_target.target_context
    arr1 = typeof(np.zeros(3))
    arr2 = typeof(np.zeros((2, 2), np.int64))
    samples = [arr1, arr2, types.int64, types.UniTuple(types.int64, 3),
               types.Tuple((types.int64, arr1, types.float64, arr2)),
               types.UniTuple(arr1, 4), types.Tuple((types.UniTuple(arr1, 2), types.int8)),
               types.ListType(types.int64),
               types.NamedTuple((arr1, types.int64), __import__("collections").namedtuple(
                   "P", "a b")), types.Optional(arr1)]
    for ty in samples:
        mod = ir.Module()
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(),
                                              [ctx.get_value_type(ty)]), "f")
        builder = ir.IRBuilder(fn.append_basic_block())
        # a context of its own: numba caches ``nrt`` on a context, and a subtarget copies
        # that cache (NRT off) along, so touching cpu_target's own would break later compiles
        nrt = NRTContext(ctx, True)
        want = original(nrt, builder, ty, fn.args[0])
        got = pruned(nrt, builder, ty, fn.args[0])
        assert [t for t, _ in got] == [t for t, _ in want], ty
        assert [_path(v, fn.args[0]) for _, v in got] == [_path(v, fn.args[0])
                                                          for _, v in want], ty
    assert len(want) == 1 and "select" in _path(want[0][1], fn.args[0])  # the last: Optional


def _path(value, root) -> tuple:
    """How ``value`` was read out of the argument ``root``: the chain of extractvalue
    indices (and selects), so two walks compare whatever LLVM named their values."""
    from llvmlite import ir

    if value is root:
        return ()
    if isinstance(value, ir.instructions.ExtractValue):
        return _path(value.aggregate, root) + tuple(value.indices)
    if value.opname == "select":
        return ("select",) + tuple(_path(op, root) if isinstance(op, ir.Instruction)
                                   or op is root else str(op) for op in value.operands)
    return (str(value),)


def test_list_vars_walk_lists_numbas_variables_in_numbas_order() -> None:
    """Every statement and expression of the IR of kvsim's scheduler and core (untyped
    front end, then as numba's passes leave it): the patched walk returns the same
    variables, in the same order, as numba's own."""
    from numba.core import ir
    from numba.core.compiler import run_frontend

    from kvsim.modes.closed import closed_step
    from kvsim.replay.kernel import core
    from kvsim.engine import scheduler

    numba_speed.install()
    fast = ir.Inst._rec_list_vars
    slow = fast.__wrapped__
    checked = 0
    for fn in (scheduler.run_steps, core.run, closed_step.advance):
        func_ir = run_frontend(getattr(fn, "py_func", fn))
        for block in func_ir.blocks.values():
            for stmt in block.body:
                for inst in [stmt, *[v for v in vars(stmt).values() if isinstance(v, ir.Inst)]]:
                    want = slow(inst, inst.__dict__)
                    assert fast(inst, inst.__dict__) == want
                    assert [v.name for v in fast(inst, inst.__dict__)] == [v.name for v in want]
                    checked += 1
    assert checked > 2000
