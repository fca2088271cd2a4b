"""One run of one policy, dispatched by its :class:`SimConfig` to the mode that serves it.

This is the single-run dispatcher every caller shares (``kvsim.api.simulate``, the
comparison's rows, the sweep's cells):

- ``config.mode == "cache"``: the trace's requests one at a time
  (:func:`kvsim.modes.cache.simulate_cache`);
- ``config.live_offload``: running requests' blocks may be spilled
  (:func:`kvsim.modes.live.live_metrics.simulate_live`);
- ``policy == "optimal"``: the offline bound on the recorded schedule
  (:func:`kvsim.bounds.optimal.engine_bound`);
- otherwise the recorded schedule replayed open loop (:func:`kvsim.replay.driver.replay`).

(The closed loop, a request trace served by engines behind a router, has its own entry:
:func:`kvsim.modes.closed.cluster.serve`.)  It sits in ``modes/``, not in ``kvsim.api``,
so that comparisons and sweeps, which call it once per row or cell, import downward.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvsim.core.errors import KvsimInputError
from kvsim.replay.driver import SimResult, TraceFacts, replay
from kvsim.spec.sim_config import SimConfig


def simulate(trace_path: str | Path, policy, config: SimConfig | None = None,
             decision_log: str | Path | None = None, *, facts: TraceFacts | None = None,
             on_progress: Callable[[int, int], None] | None = None,
             lowering=None) -> SimResult:
    """Replay ``trace_path`` under HBM policy ``policy`` (a name, a ``.py`` file or a
    :class:`kvsim.policy.registry.Policy`).  Writes the decision log to ``decision_log``
    (Parquet) when given.  Same inputs => identical result.

    ``config.mode == "cache"``: the requests of the trace are replayed one at a time in
    arrival order (:func:`kvsim.modes.cache.simulate_cache`; ``lowering`` is a
    :class:`kvsim.engine.serial_lowering.CacheLowering` made once for many policies)."""
    config = config or SimConfig()
    if config.shared_tier_gb is not None:  # a store shared by replicas: the closed loop's
        raise KvsimInputError("expected --shared-tier-gb only with a Request table served "
                              "closed loop (--request-trace / --profile), not an event file",
                              None, None, "--shared-tier-gb")
    if config.write_policy == "vllm_offload":  # stores per engine step of vLLM's scheduler
        raise KvsimInputError("expected --write-policy vllm_offload only in the closed loop "
                              "with vLLM's scheduler (--request-trace / --profile, "
                              "--scheduler auto or vllm), not an event file", None, None,
                              "--write-policy")
    if config.link_model != "none" and (config.mode == "cache" or config.live_offload):
        raise KvsimInputError("expected --link-model queue only in the engine replay (not "
                              "--mode cache, which has no time, nor --live-offload, which "
                              "has its own per-step link budget)", None, None, "--link-model")
    if config.mode == "cache":
        from kvsim.modes.cache import simulate_cache

        return simulate_cache(trace_path, policy, config, decision_log, lowering=lowering,
                              on_progress=on_progress)
    if config.live_offload:
        from kvsim.modes.live.live_metrics import simulate_live

        return simulate_live(trace_path, policy, config, decision_log, facts)
    if policy == "optimal":
        from kvsim.bounds.optimal import engine_bound

        return engine_bound(trace_path, config, facts)
    return replay(trace_path, policy, config, decision_log, facts=facts,
                  on_progress=on_progress)


__all__ = ["simulate"]
