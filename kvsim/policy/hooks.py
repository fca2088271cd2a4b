"""A policy's hooks as ONE value the compiled core takes as an argument.

The replay core, the pool operations and the lower-tier operations are compiled once for
every policy: they receive a policy as ``pol = (state, hooks)``, where ``state`` is the
policy's :class:`kvsim.policy.api.PolicyState` as a :class:`StateRef` (one pointer, one
numba type for every policy) and
``hooks`` a tuple of eight first-class functions (``numba.types.FunctionType``) in the
order ``HOOK_NAMES``, called as ``pol[1][H_VICTIM](pol[0], view, now_us, alt_b, alt_s)``;
``view`` is likewise one pointer in compiled code (:class:`ViewRef`, :func:`view_ref`).
Each hook is compiled once per policy for its one fixed signature (``hook_signatures``),
cached on disk by numba like any ``njit(cache=True)`` function; the core's compiled code
does not depend on the policy, so numba's disk cache serves it to every policy and every
later process.

How a dispatcher becomes a first-class function value: numba types a Python object that
implements its "wrapper address protocol" (``__wrapper_address__`` and ``signature``) as
``FunctionType(signature)``; :class:`CompiledHook` does that for the C-callable wrapper
numba builds beside every compiled hook.  (A bare dispatcher passed as an argument would be
typed as *that* dispatcher and the core recompiled per policy.)  The cost: a hook call is
an indirect call that cannot be inlined (docs/benchmarks.md, "One core").

Interpreted engine: ``hooks`` is the tuple of the hooks' plain-Python functions
(``py_func`` of each dispatcher), and ``state`` whatever ``init`` returned.
"""

from __future__ import annotations

import inspect
import warnings
from functools import lru_cache

from numba import errors as numba_errors
from numba import typeof, types
from numba.core.types import WrapperAddressProtocol
from numba.experimental import structref
from numba.extending import typeof_impl

from kvsim.jit.decorators import njit
from kvsim.jit.disk_cache import FIRST_CLASS, compile_once, seal, seal_all
from kvsim.jit.python_twin import python_twin
from kvsim.jit.struct_type import StructType
from kvsim.policy.api import PolicyState, StateSpec, new_block_view, policy_state
from kvsim.policy.state_access import (
    register_borrowed_members,
    register_group_proxy,
    register_named_state,
)

#: The order of a hook tuple; ``on_hold`` / ``on_release`` / ``on_hit_held`` are bound as
#: :func:`kvsim.policy.api.hook_bindings` says (kvsim.policy.registry.Policy resolves them).
HOOK_NAMES = ("on_insert", "on_hit", "on_hold", "on_release", "on_remove", "victim",
              "on_hit_held", "on_miss")
H_INSERT, H_HIT, H_HOLD, H_RELEASE, H_REMOVE, H_VICTIM, H_HIT_HELD, H_MISS = range(8)

# numba flags passing functions as values as experimental; kvsim relies on it on purpose
warnings.filterwarnings("ignore", category=numba_errors.NumbaExperimentalFeatureWarning)


@lru_cache(maxsize=1)
def state_type():
    """The numba type of every :class:`kvsim.policy.api.PolicyState`."""
    return typeof(policy_state())


@structref.register
class StateRefType(StructType):
    """The numba type of :class:`StateRef`: a reference to one heap-allocated struct
    holding the four groups of a :class:`kvsim.policy.api.PolicyState`."""


class StateRef(structref.StructRefProxy):
    """A policy state as the compiled core passes it: ONE pointer (a numba structref)
    instead of 35 arrays.  Measured: a cold compile of the core took 160 CPU-s with the
    state passed as the flat tuple and its hooks' indirect calls cost 70-110 ns; as a
    structref, see docs/benchmarks.md ("One core").  The arrays are the PolicyState's own
    (not copied), so Python code reading the PolicyState sees what the hooks wrote.

    In compiled code ``state.i64`` is a proxy and ``state.i64[k]`` loads that one array
    from the struct, not the tuple of 24 (:mod:`kvsim.policy.state_access`; the cold
    compile of the hooks, docs/benchmarks.md "Cold compile")."""


structref.define_boxing(StateRefType, StateRef)
register_group_proxy(StateRefType, PolicyState._fields)  # after structref.register
register_named_state(StateRefType, StateSpec)  # STATE.of(state).t1 (kvsim.policy.api.StateSpec)


@lru_cache(maxsize=1)
def state_ref_type():
    """The numba type of every :class:`StateRef`."""
    S = state_type()
    return StateRefType([(name, t) for name, t in zip(S.fields, S.types)])


STATE_REF = state_ref_type()


@njit(cache=True)
def _new_ref(i64, f64, i8, i64_2d):
    r = structref.new(STATE_REF)
    r.i64 = i64
    r.f64 = f64
    r.i8 = i8
    r.i64_2d = i64_2d
    return r


def state_ref(state: PolicyState) -> StateRef:
    """``state`` as a :class:`StateRef` (same arrays)."""
    return _new_ref(state.i64, state.f64, state.i8, state.i64_2d)


@lru_cache(maxsize=1)
def view_tuple_type():
    """The numba type of a :class:`kvsim.policy.api.BlockView` namedtuple."""
    return typeof(new_block_view(1))


@structref.register
class ViewRefType(StructType):
    """The numba type of :class:`ViewRef`: one pointer to a struct holding the 15 arrays of
    a :class:`kvsim.policy.api.BlockView` (same field names)."""


class ViewRef(structref.StructRefProxy):
    """A block view as compiled code passes it (one pointer instead of 15 arrays; the
    arrays are the BlockView's own).  Python code keeps and reads the BlockView."""


structref.define_boxing(ViewRefType, ViewRef)
_V = view_tuple_type()
register_borrowed_members(ViewRefType, _V.fields)  # view.<field> without NRT too
#: Every field is typed as an array of any layout ('A'): the replay's views (HBM and lower
#: tiers) are a record layout, each field a strided view of one row per slot
#: (:func:`kvsim.replay.kernel.tiers.new_record_view`); :func:`kvsim.policy.api.new_block_view`'s
#: contiguous arrays (the single-tier simulator, live offload, tests) have the same numba
#: type here, so a policy's hooks compile once for both (docs/benchmarks.md, "Speed:
#: tiered replay of 16-token traces").
VIEW_REF = ViewRefType([(name, t.copy(layout="A")) for name, t in zip(_V.fields, _V.types)])


@njit(cache=True)
def _new_view_ref(last_access_us, insert_us, access_count, phase, priority,
                  request_priority, deadline_us, slack_us, target_decode_step,
                  recompute_cost_us, size_bytes, pinned, next_use, content_hash, tenant):
    r = structref.new(VIEW_REF)
    r.last_access_us = last_access_us
    r.insert_us = insert_us
    r.access_count = access_count
    r.phase = phase
    r.priority = priority
    r.request_priority = request_priority
    r.deadline_us = deadline_us
    r.slack_us = slack_us
    r.target_decode_step = target_decode_step
    r.recompute_cost_us = recompute_cost_us
    r.size_bytes = size_bytes
    r.pinned = pinned
    r.next_use = next_use
    r.content_hash = content_hash
    r.tenant = tenant
    return r


def view_ref(view) -> ViewRef:
    """``view`` (a :class:`kvsim.policy.api.BlockView`) as a :class:`ViewRef`: what the
    compiled core, pool, tiers and hooks take (same arrays)."""
    seal_all()
    return _new_view_ref(*view)


def view_type():
    """The numba type of the view the compiled hooks take (:class:`ViewRef`)."""
    return VIEW_REF


@lru_cache(maxsize=1)
def hook_signatures() -> tuple:
    """The signature of each hook, in ``HOOK_NAMES`` order."""
    S, V = state_ref_type(), view_type()
    i64, f64 = types.int64, types.float64
    on_b_t = types.none(S, V, i64, f64)  # on_insert, on_hit, on_release, on_hit_held, on_miss
    on_b = types.none(S, V, i64)  # on_hold, on_remove
    victim = types.UniTuple(i64, 3)(S, V, f64, types.Array(i64, 1, "C"),
                                    types.Array(f64, 1, "C"))
    return (on_b_t, on_b_t, on_b, on_b_t, on_b, victim, on_b_t, on_b_t)


class CompiledHook(WrapperAddressProtocol):
    """One compiled hook as a first-class function value (numba types it as
    ``FunctionType(signature)``); calling it from Python runs the compiled code."""

    def __init__(self, dispatcher, signature):
        if dispatcher.targetoptions.get("no_cfunc_wrapper"):
            raise RuntimeError(f"{dispatcher.py_func.__module__}.{dispatcher.__name__} is "
                               "compiled without the C wrapper a function value needs: list it "
                               "in kvsim.jit.decorators.FIRST_CLASS")
        self.dispatcher = dispatcher
        self.sig = signature
        self._cres = None
        self._addr = None
        self._type = None

    @property
    def cres(self):
        """The compile result, compiled (or loaded from numba's disk cache) when first
        needed: numba types the value from :meth:`signature` alone, so building a policy
        value compiles nothing, and a cold compile starts ``core.run``'s compile (which
        needs the values' types only) before the hooks' (:mod:`kvsim.replay.precompile`)."""
        if self._cres is None:
            try:
                # one process at a time per cache entry: another one compiling this hook
                # (compare's workers, test workers) is waited for, then loaded
                compile_once(self.dispatcher, self.sig)
                self._cres = self.dispatcher.get_compile_result(self.sig)
            except numba_errors.TypingError as e:
                if "mismatch of return type" not in str(e):
                    raise
                # Python called the hook first, and numba typed that call's return value
                # itself (``Tuple(int64, Literal[int](0), int64)`` for ``return b, 0, n``):
                # numba keeps one overload per argument types, so the declared signature
                # compiles in a dispatcher of its own (not cached on disk; rare: a hook
                # called from Python before any replay took it as a value).
                from numba import njit as numba_njit

                self.dispatcher = numba_njit(cache=False)(self.dispatcher.py_func)
                self._cres = self.dispatcher.get_compile_result(self.sig)
        return self._cres

    def compile(self) -> CompiledHook:
        """Compile (or load) now; returns self."""
        _ = self.cres
        return self

    def __wrapper_address__(self) -> int:
        # numba asks at every call of a compiled function taking this value (unboxing):
        # looked up once (an LLVM symbol lookup, ~0.1 ms)
        if self._addr is None:
            cres = self.cres
            self._addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        return self._addr

    def signature(self):
        return self.sig

    def numba_type(self) -> types.FunctionType:
        """``FunctionType(signature)``, made once (:func:`typeof_function_value`)."""
        if self._type is None:
            self._type = types.FunctionType(self.signature())
        return self._type

    def __call__(self, *args):
        """Run the hook from Python: compiled for its signature first, so the call uses
        that overload (a first call from Python would type the return value itself, e.g.
        ``Tuple(int64, Literal[int](0), int64)`` for ``return b, 0, n``, and the value's
        signature could then not be compiled: "mismatch of return type")."""
        self.compile()
        return self.dispatcher(*args)

    def __repr__(self) -> str:
        return f"CompiledHook({self.dispatcher.py_func.__module__}.{self.dispatcher.__name__})"


@typeof_impl.register(CompiledHook)
def typeof_function_value(val, c) -> types.FunctionType:
    """numba's type of a kvsim function value (a :class:`CompiledHook`, and
    :class:`kvsim.replay.variants.RunValue` through its own registration): its
    ``numba_type()``, made once.  numba's generic rule for a ``WrapperAddressProtocol``
    builds ``FunctionType(value.signature())`` at every call of a compiled function taking
    the value, hashing the whole signature (for ``core.run``: the core's 34-member state)
    to intern it: ~1 ms per call of ``closed_step.advance``, a third of an 8-replica closed
    loop's Python time (docs/benchmarks.md, "vs NVIDIA AISimulate").  A registration through
    numba's extension API (``numba.extending.typeof_impl``), as structrefs register theirs."""
    return val.numba_type()


def is_uniform(state) -> bool:
    """True when ``state`` has the one state type the compiled core takes."""
    return isinstance(state, PolicyState) and typeof(state) == state_type()


_COMPILED: dict[tuple, tuple] = {}


def _functions(policy) -> tuple:
    """The function bound to each hook of ``HOOK_NAMES``: from a
    :class:`kvsim.policy.registry.Policy` (which resolved the defaults) or from a policy
    module (defaults of :func:`kvsim.policy.api.hook_bindings`; no ``on_miss`` and an
    unbound ``on_hit_held`` are :func:`kvsim.policy.api.noop_hook`)."""
    from types import ModuleType

    from kvsim.policy import api as policy_api

    if not isinstance(policy, ModuleType):
        return tuple(getattr(policy, name) for name in HOOK_NAMES)
    bound = policy_api.hook_bindings(policy)
    out = []
    for name in HOOK_NAMES:
        target = name if name == "on_miss" else bound[name]
        out.append(getattr(policy, target, policy_api.noop_hook) if target
                   else policy_api.noop_hook)
    return tuple(out)


def seal_policy_module(module) -> None:
    """Formerly patched a policy module's compile (no wrappers, linked-only helpers); a
    no-op since #31 (kvsim no longer writes into numba: docs/jit.md), kept for callers."""
    values = HOOK_NAMES + FIRST_CLASS.get(module.__name__, ())
    seal(module, python_called=(), values_only=values)


def compiled_hooks(policy) -> tuple:
    """The eight hooks of ``policy`` (a :class:`kvsim.policy.registry.Policy` or a policy
    module, with njit hooks) as :class:`CompiledHook` values, each compiled (or loaded from
    numba's disk cache) for its signature; memoised per process."""
    key = tuple(id(f) for f in _functions(policy))
    if key not in _COMPILED:
        seal_all()
        for module in {id(f): inspect.getmodule(f.py_func) for f in _functions(policy)}.values():
            seal_policy_module(module)
        _COMPILED[key] = tuple(CompiledHook(f, sig)
                               for f, sig in zip(_functions(policy), hook_signatures()))
    return _COMPILED[key]


def python_hooks(policy) -> tuple:
    """The eight hooks of ``policy`` as plain-Python functions (the interpreted engine),
    the helpers they call plain Python too (:func:`kvsim.jit.python_twin.python_twin`: a
    helper called from Python would compile for the types Python passes)."""
    return tuple(python_twin(f) for f in _functions(policy))


def hooks_for(policy, compiled: bool) -> tuple:
    """:func:`compiled_hooks` or :func:`python_hooks`."""
    return compiled_hooks(policy) if compiled else python_hooks(policy)


def policy_value(policy, state, compiled: bool) -> tuple:
    """``(state, hooks)``, the one value the core, pool and tier functions take for a
    policy: compiled, ``(StateRef, CompiledHook x 8)``; interpreted, ``(state, Python
    functions)``."""
    if compiled:
        seal_all()  # before anything compiled is loaded: see kvsim.jit.disk_cache
        return (state_ref(state), compiled_hooks(policy))
    return (state, python_hooks(policy))


def hooks_are_cached(policy) -> bool:
    """True when every hook of ``policy`` can be loaded from numba's disk cache (compiles
    nothing)."""
    from kvsim.jit.disk_cache import dispatcher_is_cached

    seal_all()
    for f in _functions(policy):
        seal_policy_module(inspect.getmodule(f.py_func))
    seen = set()
    for d in _functions(policy):
        if id(d) in seen:
            continue
        seen.add(id(d))
        if not dispatcher_is_cached(d):
            return False
    return True


# ---------------------------------------------------------------------------------------
# a lower tier as one value
# ---------------------------------------------------------------------------------------

#: The fields of a lower tier (kvsim.replay.kernel.tiers: ``Tier``), in order.
TIER_FIELDS = ("L_i", "L_free", "L_h", "L_view", "L_ps", "Lm")


@structref.register
class TierRefType(StructType):
    """The numba type of :class:`TierRef`: one pointer to a struct holding a lower tier's
    six members (:data:`TIER_FIELDS`, the fields of :class:`kvsim.replay.kernel.tiers.Tier`)."""


class TierRef(structref.StructRefProxy):
    """A lower tier as the compiled core passes it: ONE pointer instead of a tuple of 6
    members (numba reference-counts each array and structref a compiled function receives,
    on entry and exit: a tuple costs 6 counts per call, this one; docs/benchmarks.md,
    "Speed: tiered replay of 16-token traces").  The members are the tier's own arrays,
    not copies.  Python code keeps the :class:`kvsim.replay.kernel.tiers.Tier` it was made from."""


structref.define_boxing(TierRefType, TierRef)
register_borrowed_members(TierRefType, TIER_FIELDS)  # T.<member> without NRT too


@lru_cache(maxsize=1)
def policy_value_type():
    """The numba type of a compiled policy value ``(StateRef, CompiledHook x 8)``."""
    hooks = types.BaseTuple.from_types([types.FunctionType(s) for s in hook_signatures()])
    return types.BaseTuple.from_types([state_ref_type(), hooks])


_A1 = types.Array(types.int64, 1, "C")
TIER_REF = TierRefType([("L_i", types.Array(types.int64, 2, "C")), ("L_free", _A1),
                        ("L_h", _A1), ("L_view", VIEW_REF), ("L_ps", policy_value_type()),
                        ("Lm", _A1)])


@njit(cache=True)
def _new_tier_ref(L_i, L_free, L_h, L_view, L_ps, Lm):
    r = structref.new(TIER_REF)
    r.L_i = L_i
    r.L_free = L_free
    r.L_h = L_h
    r.L_view = L_view
    r.L_ps = L_ps
    r.Lm = Lm
    return r


def tier_ref(tier) -> TierRef:
    """``tier`` (a :class:`kvsim.replay.kernel.tiers.Tier` whose view is a :class:`ViewRef` and whose
    policy a compiled :func:`policy_value`) as a :class:`TierRef` (same arrays)."""
    seal_all()
    return _new_tier_ref(*tier)
