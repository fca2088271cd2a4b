"""numba compile-time patches that change how fast numba compiles, never what it compiles.

numba's overload resolution keys its per-template cache of implementations
(``numba.core.typing.templates._OverloadMethodTemplate._get_impl``, every ``@overload``
and ``@overload_method``, i.e. most of numpy's and Python's builtins) on the compile's
flags, a ``numba.core.targetconfig.TargetConfig``.  Hashing and comparing that key builds
``TargetConfig.values()``, a dict of all of the flags' ~30 options, each read through a
Python property: in the README job's cold compile that was ~11 million property reads
(`bench/prof_compile_phases.py`, cProfile: ``targetconfig.getter`` at the top of the
profile by own time).  :func:`install` replaces ``values()`` with the same dict built
from a per-class table of the defaults and the options set: the same keys, in the same
order, the same values, at C speed.  Measured on the README job compiled in one process
(``KVSIM_COMPILE_WORKERS=1``, empty caches, two pairs alternated): 37.2 / 35.6 -> 34.4 /
34.0 CPU-s, the same JSON (docs/benchmarks.md, "Cold compile").


Type inference resolves every call of a builtin function or operator (``+`` on two
``int64``, ``max``, ``np.empty``, an ``@overload``) by trying the function's typing
templates one by one (``numba.core.types.functions.BaseFunction.get_call_type``), at
every call site of every function it compiles: in the README job 19,473 resolutions, of
which 18,231 repeated one already made with the same argument types (the loop counters'
``+``, the array indexing).  :func:`install` memoises the successful ones per function
type, keyed on everything the result depends on: the typing context, the compile target,
the argument types (literal values included), the keyword argument types and the compile
flags.  A resolution that fails is not memoised (it raises as before, every time).  The
templates' own side effects (the implementation key a resolution records for lowering,
``_impl_keys[args]``, and an ``@overload``'s compiled implementation) happened at the
first resolution and persist on the same objects, except the implementation key, which
numba keeps per argument types only (an ``@overload`` resolved under other flags, e.g. one
compiled without NRT, replaces it): a memo hit puts back the key of its own resolution.
A function type that gains templates
(a new ``@overload`` registered) is a new type object with an empty memo.  Measured, the
same way: 35.9 -> 32.3 CPU-s on top of the flags patch, the same JSON.

Lowering emits a reference count operation (``NRT_incref`` / ``NRT_decref``) for every
counted value it copies or drops, through ``NRTContext.get_meminfos``, which walks the
value's data model and extracts *every* member before it looks for memory-info pointers
in it: for one 1-d array nine ``extractvalue`` instructions (meminfo, parent, nitems,
itemsize, data, shape, strides and their elements), of which the meminfo is the only one
used; LLVM deletes the other eight again.  :func:`install` makes the walk skip members
whose type holds no memory-info pointer at all (a per-type memo of
``DataModel.traverse``'s types, conservative where a model cannot be walked without a
builder): the same pointers, in the same order, one ``extractvalue`` per array.

numba's analyses (use-defs, liveness, SSA, dead-variable insertion after each pass)
list the variables of every IR statement again and again (``ir.Inst.list_vars``, a
recursive walk of the statement's attributes: 3.4 million calls of
``Inst._rec_list_vars`` in the README job).  :func:`install` replaces the walk with one
that appends into one list and skips the common leaves (strings, numbers, source
locations) without a call: the same variables in the same order.

Installed once per process by :func:`kvsim.jit.disk_cache.seal` (every compiled path of kvsim
goes through it).  ``KVSIM_NUMBA_PATCHES=0`` leaves numba as it is (for comparison).
"""

from __future__ import annotations

import os

_INSTALLED = False
#: numba's own ``TargetConfig.values``, kept for the tests' comparison
ORIGINAL_VALUES = None


def _values(self) -> dict:
    """``TargetConfig.values()``: every option's value, the default where it is not set
    (numba: ``{k: getattr(self, k) for k in self.options}``)."""
    cls = type(self)
    defaults = cls.__dict__.get("_kvsim_defaults")
    if defaults is None:
        defaults = {name: option.default for name, option in cls.options.items()}
        cls._kvsim_defaults = defaults
    out = dict(defaults)
    out.update(self._values)
    return out


def _memoised(get_call_type):
    from numba.core import targetconfig
    from numba.core.target_extension import get_local_target

    def get_call_type_memoised(self, context, args, kws):
        memo = self.__dict__.get("_kvsim_calls")
        if memo is None:
            memo = self.__dict__["_kvsim_calls"] = {}
        flags = targetconfig.ConfigStack.top_or_none()
        try:
            key = (context, get_local_target(context), tuple(args), tuple(kws.items()),
                   flags)
            hit = memo.get(key)
        except TypeError:  # an unhashable argument type: resolve as numba does
            return get_call_type(self, context, args, kws)
        if hit is not None:
            sig, impl_key = hit
            # what the resolution records for lowering, per argument types only: another
            # set of flags (an @overload compiled without NRT, say) may have replaced it
            self._impl_keys[sig.args] = impl_key
            return sig
        sig = get_call_type(self, context, args, kws)
        if sig is not None:  # keyed on a copy: the compile's own flags may change
            memo[key[:4] + (None if flags is None else flags.copy(),)] = (
                sig, self._impl_keys[sig.args])
        return sig

    get_call_type_memoised.__wrapped__ = get_call_type
    return get_call_type_memoised


def _counted(dmm, ty, memo: dict) -> bool:
    """Whether a value of ``ty`` holds any memory-info pointer that
    ``NRTContext.get_meminfos`` would return (memoised per data model manager and type,
    so each target keeps its own answers; True where unsure)."""
    key = (id(dmm), ty)
    hit = memo.get(key)
    if hit is not None:
        return hit
    memo[key] = True  # conservative while the walk below is in progress
    try:
        model = dmm[ty]
        found = model.has_nrt_meminfo() or any(_counted(dmm, mty, memo)
                                               for mty, _ in model.traverse(None))
    except Exception:  # any model whose walk needs a builder: walked as numba does
        found = True
    memo[key] = found
    return found


def _pruned_meminfos(get_meminfos):
    memo: dict = {}

    def get_meminfos_pruned(self, builder, ty, val):
        dmm = self._context.data_model_manager
        if not _counted(dmm, ty, memo):
            return []
        datamodel = dmm[ty]
        meminfos = []
        if datamodel.has_nrt_meminfo():
            meminfos.append((ty, datamodel.get_nrt_meminfo(builder, val)))
        for mtyp, getter in datamodel.traverse(builder):
            if _counted(dmm, mtyp, memo):
                meminfos.extend(self.get_meminfos(builder, mtyp, getter(val)))
        return meminfos

    get_meminfos_pruned.__wrapped__ = get_meminfos
    return get_meminfos_pruned


def _list_vars_walk():
    from numba.core import ir

    Var, Inst = ir.Var, ir.Inst
    leaves = frozenset((str, int, float, bool, type(None), ir.Loc))

    def walk(val, out: list) -> None:
        t = type(val)
        if t is Var:
            out.append(val)
        elif t is dict:
            items(val.values(), out)
        elif t is list or t is tuple:
            items(val, out)
        elif t in leaves:
            pass
        elif isinstance(val, Var):
            out.append(val)
        elif isinstance(val, Inst):
            out.extend(val.list_vars())
        elif isinstance(val, (list, tuple)):
            items(val, out)
        elif isinstance(val, dict):
            items(val.values(), out)

    def items(values, out: list) -> None:
        for v in values:
            t = type(v)
            if t is Var:
                out.append(v)
            elif t not in leaves:
                walk(v, out)

    def _rec_list_vars(self, val):
        out: list = []
        walk(val, out)
        return out

    return _rec_list_vars


def install() -> None:
    """Patch numba (once per process; no-op with ``KVSIM_NUMBA_PATCHES=0``).  Each patch
    checks that numba has the layout it assumes and leaves numba alone where not."""
    global _INSTALLED, ORIGINAL_VALUES
    if _INSTALLED or os.environ.get("KVSIM_NUMBA_PATCHES", "1") == "0":
        return
    _INSTALLED = True
    from numba.core import ir, targetconfig
    from numba.core.runtime.context import NRTContext
    from numba.core.types.functions import BaseFunction

    cls = targetconfig.TargetConfig
    if "_values" in getattr(cls, "__slots__", ()) and hasattr(cls, "options"):
        ORIGINAL_VALUES = cls.values
        cls.values = _values
    if "_impl_keys" in BaseFunction.__init__.__code__.co_names:
        BaseFunction.get_call_type = _memoised(BaseFunction.get_call_type)
    if "traverse" in NRTContext.get_meminfos.__code__.co_names:
        NRTContext.get_meminfos = _pruned_meminfos(NRTContext.get_meminfos)
    if "_rec_list_vars" in vars(ir.Inst):
        fast = _list_vars_walk()
        fast.__wrapped__ = ir.Inst._rec_list_vars
        ir.Inst._rec_list_vars = fast


__all__ = ["install"]
