"""A cold compile split over worker processes that fill numba's disk cache.

When the compiled engine is not in numba's disk cache yet, ``compare`` (open loop,
:mod:`kvsim.modes.comparison`, and closed loop, :func:`kvsim.modes.closed.cluster.compare_requests`)
does not compile everything in one process, one piece after the other.  It forks
workers (:func:`kvsim.core.workers.process_pool`; with ``--jobs 1`` too: one process per core
while the compile lasts, :func:`compile_workers`) and runs, at the same time:

* in this process, the first policy's replay: it compiles the replay core (``core.run``,
  the closed loop's ``closed_step.advance``) and that policy's hooks; in the closed loop,
  ``core.run`` compiles in one more worker meanwhile (``advance`` calls it as a
  first-class function value, typed from its signature alone:
  :class:`kvsim.replay.variants.RunValue`), and this process loads it from the cache;
* in the workers, the hooks of every other policy
  (:func:`kvsim.policy.hooks.compiled_hooks`, a few first-class functions each);
* then, in this process, while the workers still compile: the replays of the policies
  whose hooks a worker has compiled, else of those no worker has started (compiling
  their hooks here, from the end of the list), instead of waiting with a core idle.

``core.run``'s compile starts before anything else compiles: a policy's hooks
(:class:`kvsim.policy.hooks.CompiledHook`) are typed from their signature and compile when
first called, so the replay's state, ``run``'s argument types included, is built without
compiling them.  Each worker writes what it compiled to numba's disk cache
(``cache=True``); the replays that follow (in workers forked after the first replay,
which inherit the compiled core: as many as the compile used, :func:`compile_workers`,
whatever ``--jobs`` says) load the hooks instead of compiling them.  A single closed-loop
run (``kvsim simulate`` of a profile or request trace, :func:`kvsim.modes.closed.cluster.serve`)
splits the same way around ``core.run`` (:func:`split_closed_compile`).  The results do not
depend on the split: every replay runs the same cached code.  Measured figures:
docs/benchmarks.md, "Cold compile".
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence

from kvsim.jit.disk_cache import compile_log as log  # noqa: E402  (the split's timeline)

#: How much a hooks worker lowers its priority (``os.nice``; CFS weight 1024 -> 110): the
#: core's compile gets a whole core while the hooks use what it leaves (docs/benchmarks.md,
#: "Cold compile": the README job's timeline with ``KVSIM_COMPILE_LOG=1``).
HOOKS_NICE = 10


#: While :func:`first_then_hooks` runs: one byte per cold policy, set by the process that
#: compiles its hooks (shared memory, inherited by the forked workers), so that this
#: process, once its first replay is done, takes the policies no worker has started.
_CLAIMS = None


def _claim(i: int) -> bool:
    """Claim cold policy ``i`` (True when nobody had)."""
    with _CLAIMS.get_lock():
        if _CLAIMS[i]:
            return False
        _CLAIMS[i] = 1
        return True


def compile_hooks(names: Sequence[str], indices: Sequence[int] | None = None) -> float:
    """Compile (or load from numba's disk cache) the hooks of each named policy; returns
    the CPU seconds it took.  Runs in a worker process of :func:`first_then_hooks`, at a
    lower priority (:data:`HOOKS_NICE`): the hooks are not on the critical path, the core
    (``core.run`` in its worker, ``advance`` or the first replay in the kvsim process) is,
    and with more compiling processes than cores they would otherwise share its cores.
    ``indices``: each name's place among the claims (:data:`_CLAIMS`); a policy another
    process claimed first is skipped."""
    from kvsim.policy.hooks import compiled_hooks
    from kvsim.policy.registry import resolve_policy

    with contextlib.suppress(OSError, AttributeError):
        os.nice(HOOKS_NICE)
    t0 = time.process_time()
    for k, name in enumerate(names):
        if indices is not None and _CLAIMS is not None and not _claim(indices[k]):
            continue
        pol = resolve_policy(name)
        if pol.compiled:
            for hook in compiled_hooks(pol):
                hook.compile()
        if indices is not None and _CLAIMS is not None:
            _CLAIMS[indices[k]] = 2  # in the disk cache: the kvsim process may replay it
    return time.process_time() - t0


def cold_hooks(names: Sequence[str], skip: Sequence[str] = ()) -> list[str]:
    """The policies among ``names`` (minus ``skip`` and ``optimal``, which has no hooks)
    with compiled hooks that numba's disk cache does not hold yet, in the order given."""
    from kvsim.policy.hooks import hooks_are_cached
    from kvsim.policy.registry import resolve_policy

    out = []
    for name in names:
        if name == "optimal" or name in skip or name in out:
            continue
        pol = resolve_policy(name)
        if pol.compiled and not hooks_are_cached(pol):
            out.append(name)
    return out


def compile_workers(jobs: int) -> int:
    """Worker processes for a cold compile: ``jobs``, and at least the machine's cores
    (``os.cpu_count()``), or exactly ``$KVSIM_COMPILE_WORKERS`` when set (``1``: compile
    in one process, as kvsim did before; for profiling or a memory-tight machine).
    ``compare`` runs the replays that follow a cold compile in as many processes, so a
    cold first run is not left with one core idle for its last replays (the results do
    not depend on it)."""
    env = os.environ.get("KVSIM_COMPILE_WORKERS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            from kvsim.core.errors import KvsimInputError

            raise KvsimInputError(f"expected KVSIM_COMPILE_WORKERS = an integer >= 1, got "
                                  f"{env!r}", None, None, "KVSIM_COMPILE_WORKERS")
        return n
    return max(int(jobs), os.cpu_count() or 1)


def replay_jobs(requested: str, chosen: str, jobs: int) -> int:
    """Processes for a ``compare``'s replays: ``jobs``, or every core
    (:func:`compile_workers`) when ``auto`` picked the interpreted engine (``requested``
    ``auto``, ``chosen`` ``interpreted``: a small first run on a cold compile cache,
    :func:`compare_engine`).  Such a run is the interpreted twin of a cold compile, and it
    uses the cores as the replays after a cold compile do (a policy's replay is a fresh
    forked process either way; the results do not depend on it).  An explicit
    ``--engine interpreted`` keeps ``jobs``."""
    if requested == "auto" and chosen == "interpreted":
        return compile_workers(jobs)
    return jobs


def compare_engine(engine: str, num_rows: int, runs: int, closed: bool | str = False) -> str:
    """The engine of a ``compare`` of ``runs`` replays of ``num_rows`` events each:
    :func:`kvsim.spec.sim_config.resolve_engine`, warm when the compiled core is cached (a
    policy then costs its hooks' compile, ~1-3 CPU-s, against ~10 CPU-s interpreted on
    100 k events)."""
    from kvsim.replay.variants import core_is_cold
    from kvsim.spec.sim_config import resolve_engine

    return resolve_engine(engine, num_rows, runs, lambda: not core_is_cold(closed))


def needs_split(engine: str, closed: bool, names: Sequence[str]) -> tuple[bool, str | None,
                                                                        list[str]]:
    """``(split?, first, cold hooks)`` for a compare of ``names`` on ``engine``: whether to
    compile with :func:`first_then_hooks` (the core is cold, or more than one policy's
    hooks are), the policy to replay first (the first with compiled hooks), and the other
    policies whose hooks are cold."""
    from kvsim.replay.variants import core_is_cold

    if engine != "compiled":
        return False, None, []
    from kvsim.policy.registry import resolve_policy

    # the first policy that runs compiled (optimal has no hooks, a plain-Python one runs
    # interpreted): its replay compiles the core
    first = next((n for n in names if n != "optimal" and resolve_policy(n).compiled), None)
    if first is None:
        return False, None, []
    hooks = cold_hooks(names, skip=[first])
    cold = core_is_cold(closed)
    if cold:
        from kvsim.replay.variants import announce_if_cold

        announce_if_cold(closed)
    return cold or len(hooks) > 1, first, hooks


def first_then_hooks(first: Callable[..., dict], first_args: tuple, hook_names: Sequence[str],
                     workers: int, *, closed: bool | str = False,
                     done: dict[str, dict] | None = None) -> dict:
    """Run ``first(*first_args)`` (a replay that compiles the core) in this process while
    up to ``workers - 1`` forked workers compile the hooks of ``hook_names``; returns
    ``first``'s result once every worker has finished (so numba's disk cache then holds the
    core and every hook).  The workers are forked before this process compiles anything.
    ``closed`` (a closed-loop replay whose core is cold): one more worker compiles
    ``core.run`` while this process compiles ``closed_step.advance``
    (:data:`kvsim.replay.variants.BACKGROUND`).

    ``done`` (a dict): once the first replay is done, this process does not wait idle for
    the workers: it takes the policies of ``hook_names`` that no worker has started, from
    the end of the list (the workers start from its front), and replays each with
    ``first`` (compiling its hooks), into ``done[name]``; the caller replays the others."""
    global _CLAIMS
    import multiprocessing as mp

    from kvsim.core.workers import process_pool
    from kvsim.replay import variants

    others = min(workers - 1, len(hook_names))
    order = list(range(len(hook_names)))
    chunks = [order[i::others] for i in range(others)] if others > 0 else []
    size = len(chunks) + (1 if closed and workers > 1 and variants.BACKGROUND is None else 0)
    if size < 1:
        return first(*first_args)
    _CLAIMS = mp.get_context("fork").Array("b", max(len(hook_names), 1))
    try:
        with process_pool(size) as ex:  # forks its workers at the first submit: after this
            futures = [ex.submit(compile_hooks, [hook_names[i] for i in c], c)
                       for c in chunks]
            for f in futures:
                f.add_done_callback(lambda f: f.exception() is None and log(
                    f"worker: hooks compiled, {f.result():.1f} CPU-s"))
            if size > len(chunks):
                variants.BACKGROUND = ex
            try:
                result = first(*first_args)
                log(f"this process: first replay ({first_args[0] if first_args else ''}) "
                    "done")
            finally:
                if size > len(chunks):
                    variants.BACKGROUND = None
            if done is not None:
                _help(first, first_args[1:], hook_names, futures, done)
            for f in futures:
                f.result()
    finally:
        _CLAIMS = None
    log("every worker done")
    return result


def _help(replay: Callable[..., dict], args: tuple, names: Sequence[str], futures: list,
          done: dict[str, dict]) -> None:
    """This process, its first replay done, while the hooks workers run: replay a policy
    whose hooks a worker has compiled, else one no worker has started, from the end of
    ``names`` (compiling its hooks), else wait for one (:func:`first_then_hooks`)."""
    import concurrent.futures as cf

    while not all(f.done() for f in futures):
        i = next((i for i in range(len(names))
                  if _CLAIMS[i] == 2 and names[i] not in done), None)
        if i is None:
            i = next((i for i in reversed(range(len(names))) if _claim(i)), None)
        if i is None:
            cf.wait(futures, timeout=0.05, return_when=cf.FIRST_COMPLETED)
            continue
        done[names[i]] = replay(names[i], *args)
        log(f"this process: {names[i]} replayed")


@contextlib.contextmanager
def split_closed_compile(engine: str, scheduler: str | bool = True) -> Iterator[None]:
    """Around one closed-loop run on ``engine`` with ``scheduler`` (``vllm`` / ``kvsim``:
    ``advance`` compiles once per scheduler; True: either): when the compiled closed loop is cold and
    the machine has two cores or more, one forked worker compiles ``core.run`` while this
    process compiles ``closed_step.advance`` (:data:`kvsim.replay.variants.BACKGROUND`; no-op
    inside :func:`first_then_hooks`, which already split)."""
    from kvsim.replay import variants
    from kvsim.replay.variants import core_is_cold

    if (engine != "compiled" or variants.BACKGROUND is not None or compile_workers(1) < 2
            or not core_is_cold(scheduler)):
        if engine == "compiled":
            from kvsim.replay.variants import announce_if_cold

            announce_if_cold(scheduler)
        yield
        return
    from kvsim.jit.disk_cache import announce_cold_compile

    announce_cold_compile()
    from kvsim.core.workers import process_pool

    with process_pool(1) as ex:
        variants.BACKGROUND = ex
        try:
            yield
        finally:
            variants.BACKGROUND = None


__all__ = ["split_closed_compile", "cold_hooks", "compare_engine", "compile_hooks",
           "compile_workers", "first_then_hooks", "log", "needs_split"]
