"""Keep numba's disk cache of the replay honest across source edits.

numba keys a cached function on its own source file's stamp (modification time and size),
not on the functions it calls: after an edit of ``kvsim/memory/fast.py`` the cached
``kvsim.replay.kernel.core.run``, which has ``fast``'s code compiled into it, would still load, and
run the old code.  :func:`seal` therefore extends the stamp of every jitted function of the
replay's modules (and of a policy's module) with :func:`digest`, a hash of every source
file whose code or constants the compiled replay contains (``SOURCES``): any edit of one
of them makes every entry stale, and numba recompiles.  Users never edit these files, so
for them the cache is compiled once per kvsim version, numba version and CPU.

numba's own key leaves out its code-generation settings too (``NUMBA_OPT``,
``NUMBA_LOOP_VECTORIZE``, ``NUMBA_SLP_VECTORIZE``: its index key is the signature, the CPU
and the bytecode; numba 0.68 ``caching._index_key``), so code compiled at one optimisation
level would load silently under another.  The stamp carries them as well
(:func:`codegen_settings`): each setting keeps its own cache entries.

One signature per function (:func:`plain_calls`): numba compiles a jitted function called
from jitted code for the caller's argument types as they are, and a constant argument is
typed as a literal (``log_row(G, C, step, now_us, A_ALLOCATE, 0, ...)`` has type
``Literal[int](9)``, ``Literal[int](0)``, ...), and an ``int32`` column value is another
type than an ``int64`` counter: every distinct set of constants and integer widths at a
call site was a separate compile of the callee (``scheduler._row`` 17 signatures,
``tiers.log_row`` 13, ``policies.deadline._heap`` 5 in the README job) and a separate copy
linked into its callers.  :func:`seal` therefore makes each sealed dispatcher type its
calls from compiled code with plain types (literals' own types, integers as ``int64``):
one compile, whatever the constants.

No C wrapper where nothing takes the function as a value (:data:`FIRST_CLASS`): numba
builds, beside every compiled function, a C-callable wrapper that only a first-class
function value uses (:class:`kvsim.policy.hooks.CompiledHook`: the policies' hooks and
``core.run`` as ``closed_step.advance`` calls it).  :func:`seal` turns it off for every
other function of the replay's modules (``no_cfunc_wrapper``, a numba target option), one
rule in place of a flag on each decorator (a new function is covered without one).
Policy modules keep it (their hooks are values).  The stamp carries the setting
(:data:`WRAPPERS`), so an entry compiled with the other setting never loads.

No CPython wrapper where Python does not call (:data:`PYTHON_CALLED`): numba also builds,
beside every compiled function, a wrapper that unboxes each argument from Python objects,
compiled whether or not Python ever calls the function (a callee is compiled through its
dispatcher like any function).  In the README job these were 14.5 of the 62 MB of LLVM IR
(the pool and tier operations ~0.5 MB each, most of them compiled in ``core.run``'s
compile, the replay's critical path).  :func:`seal` compiles every function of the sealed
modules without it, except the replay's own Python entry points (``PYTHON_CALLED``), and
policy modules too (:mod:`kvsim.policy.hooks` seals them).  A call from Python of such a
function still works: it builds (or loads from the disk cache) a jitted trampoline with
the wrapper, :func:`python_entry`, and puts it in the dispatcher's C-level table, so later
calls with the same types are as fast as numba's own wrapper.  Tests,
:class:`kvsim.memory.pool_handle.FastPool` and an interpreted policy's calls of the
compiled helpers of :mod:`kvsim.policy.structs` take that path.

Linked-only functions (:func:`_linked_only`): a function with neither wrapper only ever
runs inside its compiled callers, yet numba optimises and machine-compiles its code library
on its own as well, then again inside each library that links it.  Those libraries are
now only linked (not optimised or machine-compiled on their own) and not cached on disk
on their own (every cached caller holds their code).  In the README job this cut the LLVM
instructions machine-compiled from 113,531 to 77,746 (the same output; warm replays as
fast).  ``KVSIM_LINKED_ONLY=0`` restores numba's behaviour (for comparison).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

#: Modules whose source reaches the compiled replay (code or constants), in a fixed order.
SOURCES = ("kvsim.core.schema", "kvsim.policy.api", "kvsim.policy.structs", "kvsim.memory.fast",
           "kvsim.memory.fifo_order", "kvsim.policy.state_access", "kvsim.policy.hooks",
           "kvsim.memory.pool_ref", "kvsim.memory.pool_ops", "kvsim.jit.prefetch", "kvsim.core.layout",
           "kvsim.replay.kernel.tiers", "kvsim.replay.kernel.bookkeeping", "kvsim.replay.kernel.tier_ops", "kvsim.replay.kernel.spill",
           "kvsim.replay.kernel.placement", "kvsim.replay.kernel.core", "kvsim.replay.kernel.core_ref",
           "kvsim.engine.scheduler_state", "kvsim.engine.scheduler_blocks", "kvsim.engine.scheduler",
           "kvsim.modes.closed.closed_step", "kvsim.cachesim.simulator", "kvsim.ingest.hashing")
#: The single-tier loops (``kvsim.cachesim.simulator``'s dedicated loops) are their own group:
#: they inline ``prefetch``'s intrinsic and share ``cachesim_fast``'s constants, so an edit
#: of one of these files must recompile all of them (numba's stamp is per file), but
#: need not recompile the replay core.  Sealed at the end of each loop module's import.
SINGLE_TIER = ("kvsim.jit.prefetch", "kvsim.cachesim.fast_loops", "kvsim.cachesim.ghost_loops")
#: The modules among SOURCES whose jitted functions are sealed, in an order they can be
#: imported in (``scheduler`` imports ``sched_blocks`` at its end, not the other way).
COMPILED = ("kvsim.policy.api", "kvsim.policy.structs", "kvsim.memory.fast",
            "kvsim.memory.fifo_order", "kvsim.policy.hooks", "kvsim.memory.pool_ref",
            "kvsim.memory.pool_ops",
            "kvsim.replay.kernel.tiers", "kvsim.replay.kernel.bookkeeping", "kvsim.replay.kernel.tier_ops", "kvsim.replay.kernel.spill",
            "kvsim.replay.kernel.placement", "kvsim.replay.kernel.core", "kvsim.replay.kernel.core_ref", "kvsim.engine.scheduler",
            "kvsim.engine.scheduler_blocks", "kvsim.modes.closed.closed_step", "kvsim.cachesim.simulator")


#: The functions of the ``COMPILED`` modules that compiled code takes as first-class
#: function values (:class:`kvsim.policy.hooks.CompiledHook`), by module: they keep numba's
#: C wrapper.  ``core.run``: ``closed_step.advance`` calls it as a value
#: (:class:`kvsim.replay.variants.RunValue`); the others are hooks of the built-in policies.
FIRST_CLASS = {
    "kvsim.replay.kernel.core": ("run",),
    "kvsim.policy.api": ("noop_hook",),
    "kvsim.memory.fifo_order": ("on_insert", "on_hit", "on_hold", "on_release", "on_remove",
                                "victim"),
}
#: The functions of the ``COMPILED`` modules that kvsim's Python code calls on a replay's
#: path, by module: they keep numba's CPython wrapper (the code that unboxes each argument
#: from Python).  Every other sealed function is compiled without it, and a call from Python
#: goes through :func:`python_entry` (module docstring).  ``core.run``: the open loop calls
#: it (the closed loop calls it as a value only).  Not listed although Python calls them:
#: ``scheduler.run_steps`` (the lowering of a request trace, :mod:`kvsim.engine.lowering`)
#: and ``sched_blocks._cached_prefix`` (a cluster's router): the closed loop links them
#: into ``advance``, and their trampolines cost those paths what the wrapper did.
PYTHON_CALLED = {
    "kvsim.replay.kernel.core": ("run",),
    "kvsim.modes.closed.closed_step": ("advance",),
    "kvsim.policy.hooks": ("_new_ref", "_new_view_ref", "_new_tier_ref"),
    "kvsim.memory.pool_ref": ("_new_pool_ref",),
    "kvsim.replay.kernel.core_ref": ("_new_core_ref",),
    "kvsim.cachesim.simulator": ("_remap_direct", "_first_seen_order", "next_use_of", "_replay"),
}
#: Functions with neither wrapper are linked-only (:func:`_linked_only`); set
#: ``KVSIM_LINKED_ONLY=0`` to compile them as numba does (their own machine code and cache).
LINKED_ONLY = os.environ.get("KVSIM_LINKED_ONLY", "1") != "0"
#: Marks the no-wrapper settings in the cache stamp (bump it when a rule changes).
WRAPPERS = "cfunc=first-class;cpython=python-called;policy-helpers=linked"


@lru_cache(maxsize=4)
def digest(sources: tuple[str, ...] = SOURCES) -> str:
    """sha256 (16 hex digits) of the text of every module of ``sources``."""
    h = hashlib.sha256()
    for name in sources:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        h.update(name.encode())
        h.update(Path(origin).read_bytes() if origin else b"?")
    return h.hexdigest()[:16]


def codegen_settings() -> str:
    """numba's code-generation settings in force in this process (``numba.core.config``
    after re-reading the environment, as numba's compiler does), as part of
    the cache stamp: ``"opt=3,loopvec=1,slpvec=0"`` at numba's defaults."""
    from numba.core import config

    config.reload_config()  # as numba's compiler does before each compile
    return (f"opt={int(config.OPT)},loopvec={int(config.LOOP_VECTORIZE)},"
            f"slpvec={int(config.SLP_VECTORIZE)}")


def _plain(t):
    """The type a compiled call passes ``t`` as: a literal's plain type, and a narrower
    integer (an ``int32`` block index column, an ``int8`` state array element) as
    ``int64`` (value-preserving; numba computes integer arithmetic in 64 bits anyway)."""
    from numba.core import types

    t = types.unliteral(t)
    if isinstance(t, types.Integer) and t.bitwidth < 64:
        return types.int64
    return t


def plain_calls(dispatcher) -> None:
    """Make calls of ``dispatcher`` (a numba ``njit`` function) from compiled code compile
    it for the plain types of literal arguments (``Literal[int](0)`` -> ``int64``), as a
    call from Python does, and for ``int64`` in place of a narrower integer (idempotent;
    see the module docstring).  The value is converted at the call site, so results are
    the same.  A function whose typing needs a literal (a heterogeneous tuple indexed by
    an argument) still gets one: when typing with the plain types fails, the caller's
    types are used as before."""
    if getattr(dispatcher, "_kvsim_plain_calls", False):
        return
    from numba.core import errors

    literal_call = dispatcher.get_call_template

    def get_call_template(args, kws):
        plain = tuple(_plain(a) for a in args)
        plain_kws = {k: _plain(v) for k, v in kws.items()}
        if plain == tuple(args) and plain_kws == kws:
            return literal_call(args, kws)
        try:
            return literal_call(plain, plain_kws)
        except errors.TypingError:
            return literal_call(args, kws)

    dispatcher.get_call_template = get_call_template
    dispatcher._kvsim_plain_calls = True


def _mark(sources: tuple[str, ...]) -> str:
    return f"{digest(sources)};{codegen_settings()}"


def _stamp(dispatcher, mark: str) -> None:
    """Extend ``dispatcher``'s cache stamp with ``mark`` (once)."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is None:
        return
    stamp = cache_file._source_stamp
    if isinstance(stamp, tuple) and len(stamp) == 3 and stamp[0] == "kvsim":
        return
    cache_file._source_stamp = ("kvsim", stamp, mark)


def _entry_params(py_func) -> tuple[str, ...] | None:
    """The positional parameter names of ``py_func``, or None where a plain positional
    trampoline cannot forward its calls (``*args``, ``**kws``, keyword-only parameters)."""
    import inspect

    params = inspect.signature(py_func).parameters.values()
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return None
    return tuple(p.name for p in params)


def python_entry(dispatcher, caller: str = "?"):
    """The function a call from Python of ``dispatcher`` (compiled without numba's CPython
    wrapper: :func:`seal`) runs: a jitted trampoline that calls it, with the wrapper,
    built on the first such call in a process and cached on disk like the target (tests,
    :class:`kvsim.memory.pool_handle.FastPool` and an interpreted policy's calls of the
    compiled helpers take this path; the replay's own Python callers are in
    ``PYTHON_CALLED``, so the core's compile builds no wrapper it does not use).
    ``KVSIM_ENTRY_LOG=1`` prints each one built, to stderr (another value: a file the
    lines are appended to)."""
    entry = dispatcher.__dict__.get("_kvsim_entry")
    if entry is not None:
        return entry

    from numba import njit

    import inspect

    py_func = dispatcher.py_func
    names, params, defaults = [], [], {}
    for p in inspect.signature(py_func).parameters.values():  # positional only (seal)
        names.append(p.name)
        if p.default is p.empty:
            params.append(p.name)
        else:
            defaults[f"_default_{p.name}"] = p.default
            params.append(f"{p.name}=_default_{p.name}")
    name = "python_entry__" + f"{py_func.__module__}.{py_func.__qualname__}".replace(".", "_")
    src = (f"def {name}({', '.join(params)}):\n"
           f"    return _target({', '.join(names)})\n")
    namespace = {"__name__": __name__, "_target": dispatcher, **defaults}
    # Compiled as if defined in this file (numba's cache needs a source file; the cache
    # entry is named by the function's name).  Its stamp is this file's extended with
    # the target's (sealed: its file's, the digest of SOURCES, the settings), so an edit
    # of the target's sources makes the entry stale with it.
    exec(compile(src, __file__, "exec"), namespace)
    entry = njit(cache=True)(namespace[name])
    target_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if target_file is not None:
        target_stamp = repr(target_file._source_stamp)
    else:  # linked-only (no cache file of its own): the code is the sealed sources'
        target_stamp = f"linked-only;{_mark(SOURCES)};{WRAPPERS}"
    _stamp(entry, f"entry of {target_stamp}")
    dispatcher._kvsim_entry = entry
    log = os.environ.get("KVSIM_ENTRY_LOG")
    if log:
        line = (f"kvsim: python entry built for {py_func.__module__}.{py_func.__qualname__}"
                f" (called from {caller})")
        if log == "1":
            print(line, file=sys.stderr)
        else:
            with open(log, "a") as f:
                f.write(line + "\n")
    return entry


#: ``(module, qualname)`` of the functions compiled for compiled callers only (neither
#: wrapper, see :func:`_linked_only`).
_LINKED_ONLY: set[tuple[str, str]] = set()
_CODEGEN_PATCHED = False


def _install_linked_only_codegen() -> None:
    """Teach numba's CPU code generation about linked-only functions (once per process).

    numba makes every compiled function a code library that it optimises and turns into
    machine code on its own (``CPUCodeLibrary.finalize``, forced by ``get_executable``,
    which asks for the CPython wrapper's address), and then links, optimises and
    machine-compiles again inside every library that calls it.  A function neither
    Python nor a function value calls only ever runs inside its callers, so for those its
    own library is only linked: ``get_executable`` leaves it unfinalized (a null entry
    point that nothing calls: :func:`_without_cpython_wrapper` keeps it out of the
    dispatcher's table), and when a caller first links it (``_ensure_finalized``) its own
    callees are linked into it, without optimising it or making machine code: the caller
    optimises and machine-compiles the whole."""
    global _CODEGEN_PATCHED
    if _CODEGEN_PATCHED:
        return
    from numba import _dynfunc
    from numba.core import codegen, cpu

    get_executable = cpu.CPUContext.get_executable
    ensure_finalized = codegen.CPUCodeLibrary._ensure_finalized

    def get_executable_linked_only(self, library, fndesc, env):
        if (fndesc.modname, fndesc.qualname) not in _LINKED_ONLY:
            return get_executable(self, library, fndesc, env)
        library._kvsim_linked_only = True
        return _dynfunc.make_function(fndesc.lookup_module(), fndesc.qualname.split(".")[-1],
                                      f"linked-only {fndesc.qualname!r}", 0, env, (library,))

    def ensure_finalized_linked_only(self):
        if self._finalized or not getattr(self, "_kvsim_linked_only", False):
            return ensure_finalized(self)
        seen = set()
        for library in self._linking_libraries:
            if library not in seen:
                self._reload_init.update(library._reload_init)
                seen.add(library)
                self._final_module.link_in(library._get_module_for_linking(), preserve=True)
        self._finalize_dynamic_globals()
        self._finalized = True  # nothing may be added; never optimised or machine-compiled

    cpu.CPUContext.get_executable = get_executable_linked_only
    codegen.CPUCodeLibrary._ensure_finalized = ensure_finalized_linked_only
    _CODEGEN_PATCHED = True


def _linked_only(dispatcher) -> None:
    """Compile ``dispatcher`` (neither wrapper) as a linked-only function
    (:func:`_install_linked_only_codegen`), not cached on disk on its own: its code is in
    every cached caller, and nothing loads it alone (a Python call loads its trampoline)."""
    from numba.core.caching import NullCache

    _install_linked_only_codegen()
    dispatcher._cache = NullCache()
    _LINKED_ONLY.add((dispatcher.py_func.__module__, dispatcher.py_func.__qualname__))


def _declared_first(dispatcher, argtypes: tuple) -> None:
    """A function that can be a policy hook (it keeps the C wrapper a function value
    needs), called from Python with a hook's argument types: compile it for that hook's
    declared signature first (:func:`kvsim.policy.hooks.hook_signatures`), so the call
    uses that overload.  Otherwise numba types the return value of the Python call itself
    (``Tuple(int64, Literal[int](0), int64)`` for a ``victim`` returning ``b, 0, n``), and
    the hook's value, which needs the declared ``UniTuple(int64 x 3)``, could then never be
    compiled in that process ("mismatch of return type")."""
    if argtypes in dispatcher.overloads:
        return
    from numba.core.errors import TypingError

    from kvsim.policy.hooks import hook_signatures

    for sig in hook_signatures():
        if tuple(sig.args) == argtypes:
            try:
                dispatcher.compile(sig)
            except TypingError:  # not this hook after all: numba types the call
                pass
            return


def _without_cpython_wrapper(dispatcher) -> None:
    """Compile ``dispatcher`` without numba's CPython wrapper and route calls from Python
    to :func:`python_entry`: its overloads are kept out of the dispatcher's C-level table
    (whose entries would be a null wrapper), so a call from Python finds none and asks
    ``_compile_for_args``, whose result (the trampoline) the dispatcher then calls with the
    same arguments."""
    dispatcher.targetoptions["no_cpython_wrapper"] = True

    def add_overload(cres):
        dispatcher.overloads[tuple(cres.signature.args)] = cres

    def compile_for_args(*args, **kws):
        caller = sys._getframe(1)
        entry = python_entry(dispatcher, f"{caller.f_code.co_filename}:{caller.f_lineno}")
        if not kws:
            argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
            if not dispatcher.targetoptions.get("no_cfunc_wrapper"):
                _declared_first(dispatcher, argtypes)
            # The entry's compiled wrapper takes the same arguments: put it in this
            # dispatcher's C-level table for these argument types, so the next call from
            # Python runs it directly, as fast as numba's own wrapper.
            try:
                entry_point = entry.compile(argtypes)
            except Exception:  # a typing error: calling the entry raises numba's message
                return entry
            dispatcher._insert([t._code for t in argtypes], entry_point, False)
        return entry

    dispatcher.add_overload = add_overload
    dispatcher._compile_for_args = compile_for_args


def seal(module: ModuleType, sources: tuple[str, ...] = SOURCES, plain: bool = True,
         values_only: tuple[str, ...] | None = None,
         python_called: tuple[str, ...] | None = None) -> None:
    """Extend the cache stamp of each ``njit(cache=True)`` function defined in ``module``
    with :func:`digest` of ``sources`` and :func:`codegen_settings`, and (``plain``) make
    its calls from compiled code compile one signature (:func:`plain_calls`) (idempotent).
    ``values_only`` (a tuple of names): compile every other function of ``module`` without
    numba's C wrapper (only a first-class function value uses it; module docstring).
    ``python_called`` (a tuple of names): compile every other function without numba's
    CPython wrapper; a call from Python then runs :func:`python_entry`.  Must run before
    the function is first compiled or loaded in this process to take effect for it."""
    from numba.core.dispatcher import Dispatcher

    from kvsim.jit import compile_speed as numba_speed

    numba_speed.install()
    mark = _mark(sources)
    if values_only is not None or python_called is not None:
        mark += f";{WRAPPERS}"
    for name, value in vars(module).items():
        if not isinstance(value, Dispatcher) or value.py_func.__module__ != module.__name__:
            continue
        if plain:
            plain_calls(value)
        if values_only is not None and name not in values_only and not value.overloads:
            value.targetoptions["no_cfunc_wrapper"] = True
        if (python_called is not None and name not in python_called and not value.overloads
                and _entry_params(value.py_func) is not None):
            _without_cpython_wrapper(value)
            if value.targetoptions.get("no_cfunc_wrapper") and LINKED_ONLY:
                _linked_only(value)
        _stamp(value, mark)


_SEALED = False


def seal_all() -> None:
    """:func:`seal` every module of ``COMPILED`` (once per process)."""
    global _SEALED
    if _SEALED:
        return
    for name in COMPILED:
        seal(importlib.import_module(name), values_only=FIRST_CLASS.get(name, ()),
             python_called=PYTHON_CALLED.get(name, ()))
    _SEALED = True
