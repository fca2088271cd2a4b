"""Which replay core runs: the one compiled core, or its interpreted twin.

Compiled: :mod:`kvsim.replay.kernel.core` (with :mod:`kvsim.memory.pool_ops`,
:mod:`kvsim.replay.kernel.tier_ops`, :mod:`kvsim.replay.kernel.spill` and the closed loop's
:mod:`kvsim.replay.kernel.closed_step`) is compiled ONCE for every policy and cached on disk by
numba: a policy reaches it as a value, ``(state, hooks)`` (:mod:`kvsim.policy.hooks`),
whose hooks are first-class functions compiled per policy for one fixed signature.  So the
first run compiles the core (once per kvsim version and machine), each new policy only
its own hooks, and later processes load everything from numba's cache.

Interpreted (a plain-Python policy, a policy whose state is not a
:class:`kvsim.policy.api.PolicyState`, or ``engine="interpreted"``): the same modules
re-executed with kvsim's ``njit`` switched to the identity (:func:`interpreted`,
:func:`kvsim.jit.decorators.interpreting`),
the hooks' plain-Python functions passed as the same tuple, the helpers they and the twin
call plain Python too (:mod:`kvsim.jit.python_twin`): the interpreted engine compiles nothing.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numba
import numba.experimental.function_type  # numba's typeof of first-class function values
from numba.core.types import WrapperAddressProtocol
from numba.extending import typeof_impl

from kvsim.jit.disk_cache import dispatcher_is_cached
from kvsim.jit.python_twin import python_twin

_LOADED: dict[str, ModuleType] = {}


def core_for(hbm_policy, lower_policies, engine: str = "compiled") -> ModuleType:
    """The core module to run: :mod:`kvsim.replay.kernel.core` itself when ``engine`` is
    ``compiled`` and every policy has compiled hooks, else the interpreted twin."""
    if engine == "interpreted" or not (hbm_policy.compiled and
                                       all(p.compiled for p in lower_policies)):
        return interpreted()
    from kvsim.replay.kernel import core

    if not _ANNOUNCED_CHECK and not dispatcher_is_cached(core.run):
        from kvsim.jit.disk_cache import announce_cold_compile

        announce_cold_compile()
    _checked()
    return core


_ANNOUNCED_CHECK = False


def _checked() -> None:
    """The cold-compile check runs once per process (a later core_for finds it loaded)."""
    global _ANNOUNCED_CHECK
    _ANNOUNCED_CHECK = True


def is_compiled(core_module: ModuleType) -> bool:
    """True for the compiled core (hooks must then be :class:`kvsim.policy.hooks.CompiledHook`)."""
    return not getattr(core_module, "INTERPRETED", False)


def runs_interpreted(engines: list) -> bool:
    """True when the closed loop's ``engines`` run the interpreted core: the routers'
    compiled lookups then run as Python while cold (:func:`kvsim.jit.disk_cache.setup_func`)."""
    return not is_compiled(engines[0].run.core)


def policy_value(policy, state, core_module: ModuleType) -> tuple:
    """``(state, hooks)``: ``policy`` as the value the core takes (see
    :mod:`kvsim.policy.hooks`)."""
    from kvsim.policy import hooks

    return hooks.policy_value(policy, state, is_compiled(core_module))


def compiled_is_cached(hbm_policy, lower_policies, closed: bool | str = False) -> bool:
    """True when the compiled engine would start without compiling: the core's entry point
    (with ``closed``, the closed loop's step driver ``closed_step.advance`` too, for the
    scheduler ``closed`` names: :func:`advance_is_cached`) and every
    hook of these policies are in numba's disk cache (see :func:`dispatcher_is_cached`).
    False at once when a policy is plain Python."""
    from kvsim.policy.hooks import hooks_are_cached

    return core_is_warm(hbm_policy, lower_policies, closed) and all(
        hooks_are_cached(p) for p in [hbm_policy, *lower_policies])


def advance_is_cached(advance, closed) -> bool:
    """True when numba's disk cache holds the closed loop's step driver ``advance`` for
    ``closed``: ``"vllm"`` / ``"kvsim"``, that scheduler's specialisation (``advance`` is
    compiled once per scheduler: :func:`kvsim.replay.kernel.closed_step.scheduler_args`,
    its EngineRef's member ``vs``), any other true value: either."""
    if not dispatcher_is_cached(advance):
        return False
    if closed not in ("vllm", "kvsim"):
        return True
    from kvsim.jit.disk_cache import cached_signatures

    at = list(inspect.signature(advance.py_func).parameters).index("er")
    # the scheduler is the EngineRef's member vs (kvsim.replay.kernel.engine_ref)
    return any(len(sig) > at and (closed == "kvsim") == isinstance(
        getattr(sig[at], "field_dict", {}).get("vs"), numba.types.NoneType)
        for sig in cached_signatures(advance))


def core_is_warm(hbm_policy, lower_policies, closed: bool | str = False) -> bool:
    """True when a compiled run of these policies would compile their hooks at most: every
    policy is compiled code and the core (with ``closed``, the step driver) is in numba's
    disk cache (:func:`core_is_cold`).  False at once when a policy is plain Python."""
    return (hbm_policy.compiled and all(p.compiled for p in lower_policies)
            and not core_is_cold(closed))


def core_is_cold(closed: bool | str = False) -> bool:
    """True when numba's disk cache lacks the compiled core's entry point (``core.run``;
    with ``closed``, or the closed loop's ``closed_step.advance``, for the scheduler
    ``closed`` names when it is ``"vllm"`` or ``"kvsim"``: :func:`advance_is_cached`): a compiled run would
    compile it (~40-80 CPU-s, docs/benchmarks.md "Cold compile")."""
    from kvsim.jit.disk_cache import seal_all
    from kvsim.replay.kernel import closed_step, core

    seal_all()
    return not dispatcher_is_cached(core.run) or (
        bool(closed) and not advance_is_cached(closed_step.advance, closed))


def announce_if_cold(closed: bool | str = False) -> None:
    """Before a compiled run: when the core is cold (:func:`core_is_cold`), say once that it
    compiles (:func:`kvsim.jit.disk_cache.announce_cold_compile`)."""
    from kvsim.jit.disk_cache import announce_cold_compile

    if core_is_cold(closed):
        announce_cold_compile()


def auto_engine(engine: str, num_rows: int, hbm_policy, lower_policies, *, closed: bool | str = False,
                runs: int = 1) -> str:
    """The engine ``engine`` stands for on ``runs`` replays of ``num_rows`` events each:
    :func:`kvsim.spec.sim_config.resolve_engine`, warm when :func:`compiled_is_cached`, the
    core warm when :func:`core_is_warm`."""
    from kvsim.spec.sim_config import resolve_engine

    return resolve_engine(engine, num_rows, runs, lambda: compiled_is_cached(
        hbm_policy, lower_policies, closed), lambda: core_is_warm(hbm_policy, lower_policies,
                                                                   closed))


def _import_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _twin(module: ModuleType, suffix: str) -> ModuleType:
    """``module`` re-executed from its source file as a fresh, independent module whose
    ``njit`` (:func:`kvsim.jit.decorators.njit`, which every twinned module imports)
    leaves its functions as Python: kvsim's own switch, numba is not touched."""
    from kvsim.jit.decorators import interpreting

    name = f"{module.__name__}__interpreted_{suffix}"
    with interpreting():
        return _import_file(name, Path(inspect.getfile(module)))


def _py(func):
    return getattr(func, "py_func", func)


def _rebind(module: ModuleType, twins: dict[str, ModuleType]) -> None:
    """Point every compiled function ``module`` imported from a twinned module at its
    interpreted twin, and every other one (kvsim.policy.structs' list helpers) at its
    plain-Python twin (:func:`kvsim.jit.python_twin.python_twin`): no compiled code
    receives Python objects, and nothing compiles for them."""
    for attr, value in list(vars(module).items()):
        py = getattr(value, "py_func", None)
        if py is None:
            continue
        if py.__module__ in twins:
            setattr(module, attr, getattr(twins[py.__module__], py.__name__))
        else:
            setattr(module, attr, python_twin(value))


def interpreted() -> ModuleType:
    """The interpreted twin of :mod:`kvsim.replay.kernel.core` (one per process, every policy): the
    memory pool, tier and core modules all run as Python (plain dicts for hash maps); a
    policy's hooks arrive as values (:func:`policy_value`), plain Python with the helpers
    they call (:func:`kvsim.policy.hooks.python_hooks`): the twin compiles nothing."""
    from kvsim.memory import fast, pool_ops
    from kvsim.replay.kernel import bookkeeping, core, links, placement, spill, tier_ops, tiers

    cached = _LOADED.get("twin")
    if cached is not None:
        return cached
    key = "py"
    tw_fast = _twin(fast, key)
    tw_tiers = _twin(tiers, key)
    tw_book = _twin(bookkeeping, key)
    twins = {fast.__name__: tw_fast, tiers.__name__: tw_tiers, bookkeeping.__name__: tw_book,
             links.__name__: _twin(links, key)}
    _rebind(tw_fast, twins)
    _rebind(tw_tiers, twins)
    _rebind(tw_book, twins)
    tw_book.tr = tw_tiers
    ops = _twin(pool_ops, key)
    _rebind(ops, twins)
    t_ops = _twin(tier_ops, key)
    _rebind(t_ops, twins)
    tw_spill = _twin(spill, key)
    _rebind(tw_spill, twins)
    tw_spill.tr = tw_tiers
    tw_spill.tier_ops = t_ops
    tw_place = _twin(placement, key)
    _rebind(tw_place, twins)
    tw_place.mem = tw_fast
    tw_place.tr = tw_tiers
    tw_place.ops = ops
    tw_place.lower = tw_spill
    tw_place.tier_ops = t_ops
    tw = _twin(core, key)
    _rebind(tw, {**twins, placement.__name__: tw_place})
    tw.mem = tw_fast
    tw.tr = tw_tiers
    tw.ops = ops
    tw.lower = tw_spill
    tw.INTERPRETED = True
    tw.twins = {**twins, pool_ops.__name__: ops, tier_ops.__name__: t_ops,
                spill.__name__: tw_spill, placement.__name__: tw_place}
    _LOADED["twin"] = tw
    return tw


_RUN_VALUES: dict[tuple, object] = {}
#: While a cold compile is split over processes (:mod:`kvsim.replay.precompile`): an executor
#: with a worker free to compile ``core.run`` while this process compiles the closed loop.
BACKGROUND = None
#: ``core.run``'s return type: ``(status, row)``.
RUN_RESULT = numba.types.UniTuple(numba.types.int64, 2)


def run_cols(batch: tuple) -> tuple:
    """The event columns ``batch`` (``kvsim.replay.kernel.core.COLS`` order) as :func:`kvsim.replay.kernel.core.run`
    takes them: every column a read-only array (a read-only view of a writable one; no
    copy).  numba types a read-only array apart from a writable one, and the columns came
    both ways: Parquet columns read without a copy are read-only, the boolean ones and
    every column of a JSONL trace or of the closed loop (:mod:`kvsim.replay.kernel.closed_step` fills
    them) writable, so ``run`` (~40 CPU-s) compiled once per mix: twice in a process that
    replays a trace file and runs the closed loop.  ``run`` only reads them."""
    out = []
    for a in batch:
        if a.flags.writeable:
            a = a.view()
            a.flags.writeable = False
        out.append(a)
    return tuple(out)


def _compile_run(arg_types: tuple) -> float:
    """Compile ``core.run`` for ``arg_types`` into numba's disk cache (a worker's task);
    returns the CPU seconds it took."""
    import time

    from kvsim.jit.disk_cache import compile_log as log
    from kvsim.jit.disk_cache import compile_once, seal_all
    from kvsim.replay.kernel import core

    t0 = time.process_time()
    seal_all()
    compile_once(core.run, arg_types)  # another process compiling it: wait, then load
    cpu = time.process_time() - t0
    log(f"worker: core.run compiled, {cpu:.1f} CPU-s")
    return cpu


class RunValue(WrapperAddressProtocol):
    """``core.run`` for one signature as a first-class function value whose machine code is
    needed only when it is first called (numba types the value from its signature alone):
    so ``closed_step.advance`` can compile while ``run`` compiles in another process
    (``future``, then loaded from the disk cache here) or, without one, before ``run``."""

    def __init__(self, run, arg_types: tuple, future=None):
        self.run = run
        self.arg_types = arg_types
        self.future = future
        self._hook = None
        self._type = None
        self._ref = None  # its RunRef (core_run_ref), made once

    def signature(self):
        return RUN_RESULT(*self.arg_types)

    def numba_type(self):
        """``FunctionType(signature)``, made once (kvsim.policy.hooks.typeof_function_value)."""
        if self._type is None:
            self._type = numba.types.FunctionType(self.signature())
        return self._type

    def compiled(self):
        """The :class:`kvsim.policy.hooks.CompiledHook` of ``run`` (compiles or loads)."""
        if self._hook is None:
            from kvsim.policy.hooks import CompiledHook

            if self.future is not None:
                import time

                from kvsim.jit.disk_cache import compile_log as log

                t0 = time.monotonic()
                log("this process: advance compiled, needs core.run")
                self.future.result()  # the worker wrote it to the disk cache
                log(f"this process: waited {time.monotonic() - t0:.1f} s for core.run")
                self.future = None
            from kvsim.jit.disk_cache import compile_once

            compile_once(self.run, self.arg_types)
            sig = self.run.overloads[self.arg_types].signature
            if sig.return_type != RUN_RESULT:
                raise RuntimeError(f"core.run returns {sig.return_type}, expected {RUN_RESULT}")
            self._hook = CompiledHook(self.run, sig)
        return self._hook

    def __wrapper_address__(self) -> int:
        return self.compiled().__wrapper_address__()

    def __call__(self, *args):
        return self.compiled()(*args)


@typeof_impl.register(RunValue)
def _typeof_run_value(val, c):
    """Its ``numba_type()``, made once (as :func:`kvsim.policy.hooks.typeof_function_value`):
    ``closed_step.advance`` takes this value at every call."""
    return val.numba_type()



class TypedTuple(tuple):
    """A tuple of fixed member types (a scheduler value such as the closed loop's ``vs``,
    :func:`kvsim.modes.closed.closed_loop._vllm_value`) whose numba type is computed once
    (:func:`_typeof_typed_tuple`).  numba types a plain tuple argument at every call of a
    compiled function, and when a member has no fast type code (a structref) it types the
    whole tuple member by member in Python: ~0.5 ms for the 22 members of ``vs``, paid at
    each of the ~9,400 ``closed_step.advance`` calls of an 8-replica closed loop
    (docs/benchmarks.md, "vs NVIDIA AISimulate").  Its members must never be replaced by values of
    another type (the closed loop replaces none of ``vs``'s)."""

    def numba_type(self):
        t = self.__dict__.get("_numba_type")
        if t is None:
            t = self.__dict__["_numba_type"] = numba.typeof(tuple(self))
        return t


@typeof_impl.register(TypedTuple)
def _typeof_typed_tuple(val, c):
    """Its ``numba_type()``, made once (numba's extension API, as :class:`RunValue`)."""
    return val.numba_type()


def core_run_value(core_module: ModuleType, run_args: tuple):
    """``core_module.run`` as the closed loop's step driver takes it (its last argument):
    the interpreted twin's Python function, or, compiled, a first-class function value of
    ``run``'s one signature (the types of ``run_args``; :class:`RunValue`, its C wrapper
    once called), so :func:`kvsim.replay.kernel.closed_step.advance` calls ``run`` indirectly (once
    per engine step) and its compile does not link and re-optimise all of ``run``;
    memoised per signature.  During a split cold compile (``BACKGROUND``) ``run`` compiles
    in a worker process while this one compiles ``advance``."""
    if not is_compiled(core_module):
        return core_module.run
    from numba import typeof

    # the columns typed read-only (run_cols), as the open-loop replay passes them: one
    # signature of run for both (advance passes its writable columns: numba converts)
    arg_types = (typeof(run_cols(run_args[0])), *(typeof(a) for a in run_args[1:]))
    if arg_types not in _RUN_VALUES:
        future = None
        if BACKGROUND is not None and arg_types not in core_module.run.overloads \
                and not dispatcher_is_cached(core_module.run):
            future = BACKGROUND.submit(_compile_run, arg_types)
        _RUN_VALUES[arg_types] = RunValue(core_module.run, arg_types, future)
    return _RUN_VALUES[arg_types]


def core_run_ref(value):
    """``value`` (:func:`core_run_value`) as :func:`kvsim.replay.kernel.closed_step.advance`
    takes it, an object whose ``run`` is ``value``: compiled, its
    :class:`kvsim.replay.kernel.run_ref.RunRef` (made once per value: the function value is
    unboxed once, not at every call of ``advance``; this waits for a ``run`` compiling in a
    worker); interpreted, a namespace."""
    if not isinstance(value, RunValue):
        return SimpleNamespace(run=value)
    if value._ref is None:
        from kvsim.replay.kernel.run_ref import new_run_ref

        value._ref = new_run_ref(value)
    return value._ref


def core_run_ref_type(value):
    """The numba type of :func:`core_run_ref` of the compiled ``value`` (from its signature
    alone: nothing waits for ``run``)."""
    from kvsim.replay.kernel.run_ref import run_ref_type

    return run_ref_type(value.numba_type())


def _vllm_twins(core_module: ModuleType) -> dict[str, ModuleType]:
    """The interpreted twins of vLLM's compiled scheduler (:mod:`kvsim.engine.vllm_step`,
    :mod:`kvsim.engine.vllm_rows`) over the twin core's pool operations, by module name."""
    from kvsim.engine import vllm_rows, vllm_step
    from kvsim.memory import pool_ops

    key = "py"
    tw_step = _twin(vllm_step, key)
    _rebind(tw_step, core_module.twins)
    tw_step.pool_ops = core_module.twins[pool_ops.__name__]
    tw_rows = _twin(vllm_rows, key)
    twins = {**core_module.twins, vllm_step.__name__: tw_step}
    _rebind(tw_rows, twins)
    tw_rows.V = tw_step
    return {vllm_step.__name__: tw_step, vllm_rows.__name__: tw_rows}


def python_vllm(core_module: ModuleType) -> bool:
    """True when the closed loop on ``core_module`` runs vLLM's scheduler as Python: the
    core is the interpreted twin and vLLM's compiled step (``vllm_rows``) is neither compiled
    in this process nor in numba's disk cache, so that a small first run compiles nothing
    (~30 CPU-s saved).  Once it is compiled, the interpreted loop calls it, as it is ~2x
    faster than its twin a step (docs/simulate.md, "Engines")."""
    from kvsim.engine.vllm_rows import vllm_rows
    from kvsim.jit.disk_cache import cold

    return not is_compiled(core_module) and cold(vllm_rows)


def python_kvsim(core_module: ModuleType) -> bool:
    """True when the closed loop on ``core_module`` runs kvsim's own scheduler
    (:mod:`kvsim.engine.scheduler`, ``--scheduler kvsim``) as Python: the core is the
    interpreted twin and the compiled ``run_steps`` is neither compiled in this process nor
    in numba's disk cache (as :func:`python_vllm` for vLLM's: a small first run compiles
    nothing; once compiled, the interpreted loop calls it)."""
    from kvsim.engine.scheduler import run_steps
    from kvsim.jit.disk_cache import cold

    return not is_compiled(core_module) and cold(run_steps)


def _scheduler_twin() -> ModuleType:
    """The interpreted twin of :mod:`kvsim.engine.scheduler` (kvsim's own scheduler and the
    row helpers the step driver reads from it: ``run_steps``, ``_ensure``,
    ``_prefill_us``), every compiled function it reads by name pointed at its plain-Python
    twin (:func:`_rebind`)."""
    if "scheduler_twin" not in _LOADED:
        from kvsim.engine import scheduler

        tw = _twin(scheduler, "py")
        _rebind(tw, {})
        _LOADED["scheduler_twin"] = tw
    return _LOADED["scheduler_twin"]


def closed_for(core_module: ModuleType, py_vllm: bool = False,
               py_kvsim: bool = False) -> ModuleType:
    """The closed loop's step driver for ``core_module`` (what :func:`core_for` returned):
    :mod:`kvsim.replay.kernel.closed_step` itself for the compiled core (compiled once, cached), or
    its interpreted twin calling the interpreted core, and vLLM's scheduler as Python with
    ``py_vllm`` (:func:`python_vllm`; its pool value then built with ``compiled=False``),
    kvsim's with ``py_kvsim`` (:func:`python_kvsim`), else compiled."""
    from kvsim.replay.kernel import closed_step

    if not is_compiled(core_module):
        key = "closed_twin" + ("_py" if py_vllm else "") + ("_ks" if py_kvsim else "")
        if key not in _LOADED:
            from kvsim.replay.kernel import offload

            tw = _twin(closed_step, "py")
            tw.core_mod = core_module
            tw_off = _twin(offload, "py")  # vllm_offload's step, on the twin's tiers
            tw_off.tr = core_module.tr
            tw_off.tier_ops = core_module.lower.tier_ops
            tw.offload = tw_off
            # the twin runs every step through the full path (quiet steps in one go are
            # the compiled engine's shortcut: kvsim.replay.kernel.closed_ffwd); it reads
            # vLLM's pool members as the compiled advance does (compiled: a structref's
            # Python proxy has no attributes)
            from kvsim.replay.kernel import closed_ffwd

            tw.CF = SimpleNamespace(quiet_steps=lambda *args: 0,
                                    pool_members=closed_ffwd.pool_members)
            if py_vllm:  # vLLM's scheduler (vllm_rows and its step) and the slot map as
                # Python on the twin's pool (kvsim.engine.vllm_value.build_value)
                tw.CF.pool_members = python_twin(closed_ffwd.pool_members)
                _rebind(tw, {**core_module.twins, **_vllm_twins(core_module)})
            if py_vllm or py_kvsim:  # the scheduler module's row helpers, and its steps
                tw.S = _scheduler_twin()
            _LOADED[key] = tw
        return _LOADED[key]
    return closed_step
