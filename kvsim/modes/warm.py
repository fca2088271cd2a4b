"""Fill numba's disk cache before a first run: ``kvsim warm`` (docs/jit.md, "Compiling ahead:
kvsim warm").

A compiled run from an empty cache compiles the replay core (``core.run``), the closed
loop's step driver (``closed_step.advance``, once per scheduler) and each policy's hooks, a
large lowering (``kvsim generate``, ``kvsim import-request-trace``) its scheduler
(``kvsim.engine.scheduler.run_steps``): about a minute on 2 cores (docs/benchmarks.md,
"Cold compile ahead of the first run").  :func:`warm` pays that once, at a time the user
chooses (right after ``pip install``): it serves a few requests of the README's workload
profile closed loop under every built-in policy
(:func:`kvsim.modes.closed.cluster.compare_requests`, on the compiled engine, whose compile
is split over the cores, :mod:`kvsim.replay.precompile`), so that numba's cache
(the directory keyed on kvsim's sources, :mod:`kvsim.jit.cache_key`) holds the code every
default run loads: the same functions with the same argument types, whatever the trace,
its size, the tier sizes or the policy; then it lowers them to an event file with the
compiled scheduler.  Nothing is compiled that a run would not compile
itself, and a run never depends on it: an empty cache still compiles on first use.

numba's cache is located by the absolute path of each source file and stamped with a hash
of its text (numba 0.68), so the cache must be filled by the installed kvsim itself, where
it runs: a wheel cannot carry it (its build directory is another path, and the machine code
is keyed on this machine's CPU), and pip runs no step after installing a wheel.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Sequence

#: The schedulers ``advance`` is compiled for by default: vLLM's, which every closed-loop
#: run uses unless ``--scheduler kvsim`` is given or the run needs what vLLM's does not model
#: (kvsim.modes.closed.closed_loop.resolve_scheduler).
DEFAULT_SCHEDULERS = ("vllm",)
SCHEDULERS = ("vllm", "kvsim")
#: The workload served: the README's profile, a few requests (enough to run every code path
#: that compiles: admissions, decode steps, evictions, preemption under 1 GB of HBM).
PROFILE = "deadline_pressure"
REQUESTS = 24
HBM_GB = 1.0
#: The replica counts the prefix router is compiled for (its scorer,
#: kvsim.engine.scheduler_blocks._route_prefix, takes per-replica tuples: one numba type,
#: and ~0.4 CPU-s of compile, per count): 2, and 8 (bench/aisimulate's multi-replica run).
PREFIX_REPLICAS = (2, 8)
#: At most this many fresh processes compile the hooks (:func:`warm`).
HOOK_PASSES = 3


@dataclasses.dataclass(frozen=True)
class WarmResult:
    """What :func:`warm` did: the cache directory, per scheduler whether its compiled
    closed loop was cold before (and so compiled now), and the cost."""

    cache_dir: str
    cold: dict[str, bool]
    wall_s: float
    cpu_s: float  # this process and its (forked) compile workers


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def _compile_hooks(names: Sequence[str]) -> int:
    """Compile (or load) every hook of each named policy, and of vLLM's block order
    (:mod:`kvsim.memory.fifo_order`, which the vLLM scheduler's compiled pool takes as a
    policy value: kvsim.engine.vllm_rows, kvsim.engine.vllm_compiled; not a registered
    policy), as the function value a run takes (:func:`kvsim.policy.hooks.compiled_hooks`);
    returns how many signatures of those hooks this process compiled rather than loaded
    (numba's per-dispatcher count).  Run in a fresh process by :func:`warm`."""
    from kvsim.memory import fifo_order
    from kvsim.policy.hooks import compiled_hooks
    from kvsim.policy.registry import resolve_policy

    dispatchers = {}
    pols = [pol for pol in map(resolve_policy, names) if pol.compiled]
    for pol in [fifo_order, *pols]:
        for hook in compiled_hooks(pol):
            hook.compile()
            dispatchers[id(hook.dispatcher)] = hook.dispatcher
    return sum(sum(d.stats.cache_misses.values()) for d in dispatchers.values())


def check_schedulers(schedulers: Sequence[str], policies: Sequence[str] | None = None) -> None:
    """Raise :class:`kvsim.core.errors.KvsimInputError` unless ``schedulers`` is a non-empty
    list of :data:`SCHEDULERS` and every one of ``policies`` is registered (compiles
    nothing)."""
    from kvsim.core.errors import KvsimInputError
    from kvsim.policy.registry import resolve_policy

    for name in policies or ():
        resolve_policy(name)

    bad = [s for s in schedulers if s not in SCHEDULERS]
    if bad or not schedulers:
        raise KvsimInputError(f"expected schedulers among {', '.join(SCHEDULERS)}, got "
                              f"{', '.join(bad) or 'none'}", None, None, "--scheduler")


def warm(schedulers: Sequence[str] = DEFAULT_SCHEDULERS, policies: Sequence[str] | None = None,
         jobs: int = 1) -> WarmResult:
    """Compile into numba's disk cache what a compiled closed-loop run with each of
    ``schedulers`` (``vllm`` / ``kvsim``) and each of ``policies`` (default: every registered
    policy, as ``kvsim compare``) loads, and the scheduler a lowering runs (``kvsim
    generate``, ``kvsim import-request-trace``); a no-op for what is cached already (a few
    seconds of loading)."""
    check_schedulers(schedulers, policies)
    from kvsim.jit.disk_cache import seal_all
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import compare_requests, serve
    from kvsim.replay.variants import core_is_cold
    from kvsim.spec.sim_config import SimConfig
    from kvsim.spec.workload_profile import load_profile
    from kvsim.workload.generator import build_workload

    t0, c0 = time.perf_counter(), _cpu_s()
    seal_all()
    cold = {s: core_is_cold(s) for s in schedulers}
    table = build_workload(load_profile(PROFILE), REQUESTS, 0)
    config = SimConfig(hbm_gb=HBM_GB, engine="compiled")
    for sched in schedulers:
        compare_requests(table, list(policies) if policies else None, config,
                         engine=EngineOptions(scheduler=sched), jobs=jobs)
        # the prefix router's own compiled helpers (--replicas N --router prefix); its
        # scorer takes a tuple of one array per replica, a numba type per replica count
        for replicas in PREFIX_REPLICAS:
            serve(table, (policies or ["lru"])[0], config, replicas=replicas,
                  router="prefix", engine=EngineOptions(scheduler=sched))
    # the lowering's scheduler (kvsim generate, kvsim import-request-trace): a small lowering
    # runs it as Python while it is cold (kvsim.engine.lowering._small_and_cold), every time,
    # until a lowering large enough compiles it; compiled here, the README's generate takes
    # ~1.7 s instead of ~6.5 (docs/benchmarks.md, "Cold compile ahead of the first run")
    import tempfile

    from kvsim.engine.lowering import lower_requests

    with tempfile.TemporaryDirectory(prefix="kvsim-warm-") as tmp:
        lower_requests(table, os.path.join(tmp, "warm.parquet"), engine="compiled")
    # Every hook as a function value, in a fresh process: a hook compiles when first
    # called, and the few requests above never call some (an on_remove when nothing is
    # removed); and numba caches a hook called directly by compiled code (another hook)
    # under its argument types, while a run takes it as a value under its full signature
    # (return type included), a key a process never writes once it holds the first.
    import concurrent.futures as cf
    import multiprocessing as mp

    from kvsim.modes.comparison import default_policies

    # A hook that another hook calls may compile there first, as a callee under its
    # argument types, and then its own value's entry is not written in that process
    # (fifo_order.on_remove under on_hold, in the vLLM pool of the runs above): a pass in a
    # fresh process loads what is cached and compiles what is missing; passes until one
    # compiles nothing.
    names = list(dict.fromkeys([*(policies or default_policies()), "belady"]))
    for _ in range(HOOK_PASSES):
        with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
            if ex.submit(_compile_hooks, names).result() == 0:
                break
    return WarmResult(cache_dir=os.environ.get("NUMBA_CACHE_DIR", ""), cold=cold,
                      wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - c0)


__all__ = ["DEFAULT_SCHEDULERS", "SCHEDULERS", "WarmResult", "check_schedulers", "warm"]
