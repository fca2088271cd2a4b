"""The replay's configuration: one frozen dataclass, every field with its help text.

The CLI builds a :class:`SimConfig` from its options (``kvsim simulate`` / ``compare``);
library users build one directly.  Nothing mutates a config after construction: use
:func:`dataclasses.replace` to derive another.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.spec.models.catalog import DEFAULT_MODEL

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective", "vllm_offload")
PREEMPTION_MODES = ("recompute", "swap")
LOWER_TIERS = ("dram", "cxl", "nvme")
ENGINES = ("auto", "compiled", "interpreted")
#: ``engine``: the scheduled replay (continuous batching, latencies); ``cache``: requests one
#: at a time in arrival order, lookup then insert, no timing (docs/simulate.md, "Modes").
MODES = ("engine", "cache")
#: A replica's network link to the shared tier: 100 Gb/s (source: the line rate of a
#: 100GbE / InfiniBand EDR NIC, one per replica; assumption: no protocol overhead).
SHARED_LINK_BYTES_PER_S = 12.5e9
#: One transfer batch to or from the shared tier (assumption: an RDMA read round trip of a
#: few microseconds, ~2-3 us on ConnectX-class NICs, plus the store's lookup: 10 us).
SHARED_LINK_LATENCY_US = 10.0
#: how transfers are timed (kvsim.replay.kernel.links): alone, or queued on their links
LINK_MODELS = ("none", "queue")
#: Cache-mode lookups: ``prefix`` stops at the first missing block (vLLM, kvcache-simulator);
#: ``block`` counts every resident block of the prompt, each block one access.
CACHE_VARIANTS = ("prefix", "block", "vllm")

#: ``engine="auto"`` compiles the replay only for traces of at least this many events
#: (``compare``: for all its replays together, the core being compiled once for all).
#: Measured on this project's 2-core machine: a cold numba compile of the one replay core
#: costs about 45 CPU-seconds open loop and 60-80 closed loop, each further policy only its
#: hooks (1-3 CPU-s), cached on disk afterwards (docs/benchmarks.md, "Cold compile"), while
#: the interpreted twin replays about 15-20 k events per CPU-second: below ~1 M events the
#: interpreter costs less on a cold cache.  docs/simulate.md, "Engines".
AUTO_COMPILE_MIN_ROWS = 1_000_000

#: ``engine="auto"`` on a smaller trace whose compiled core is cached but whose policies'
#: hooks are not: compiled from this many events, since the hooks then cost their compile
#: alone.  Measured 2026-12-01 (``python bench/cache_mode_engines.py``, main ``b19e4c2``
#: with this rule, a 2-core Intel Xeon VM, load ~0.5; cache mode on the Mooncake
#: conversation trace, 324,593 events; bench/results/cache_mode_engines.json): a policy's
#: hooks compile in 0.8-2.7 CPU-s (sieve 0.82, fifo 0.86, lfu 1.49, s3fifo and arc 2.70),
#: cached on disk afterwards, while the interpreted twin replays 16.6-24.7 k events per
#: CPU-s (fifo 19.6 CPU-s, sieve 13.1); at 100 k events the interpreter costs 4.0-6.0
#: CPU-s, more than the dearest hooks' compile, and would cost it again on every run (an
#: interpreted run fills no cache).
AUTO_HOOKS_MIN_ROWS = 100_000


def resolve_engine(engine: str, num_rows: int, runs: int = 1,
                   is_warm: Callable[[], bool] | None = None,
                   core_warm: Callable[[], bool] | None = None) -> str:
    """THE engine rule; every other engine choice (``replay.driver.choose_engine``,
    ``replay.variants.auto_engine``, ``replay.precompile.compare_engine``) calls it.

    An explicit ``compiled`` / ``interpreted`` is returned as given.  ``auto`` is
    ``compiled`` when the events replayed, ``runs * num_rows`` (``compare`` replays one
    trace ``runs`` times and compiles the core once for all), reach
    :data:`AUTO_COMPILE_MIN_ROWS` (enough to pay for a cold compile), or else when
    ``is_warm()`` says the compiled code the caller needs is already in numba's disk cache
    (then it costs no compile, or only its hooks': one replay asks for its core and hooks,
    ``compare`` for the core, each policy's hooks costing ~1-3 CPU-s), or else when they
    reach :data:`AUTO_HOOKS_MIN_ROWS` and ``core_warm()`` says the core is cached (one
    replay then compiles only its policies' hooks); otherwise ``interpreted``.  The
    callables are only called when the size alone does not decide; without them, the size
    decides.  (A plain-Python policy runs interpreted either way.)"""
    if engine != "auto":
        return engine
    rows = num_rows * max(runs, 1)
    if rows >= AUTO_COMPILE_MIN_ROWS:
        return "compiled"
    if is_warm is not None and is_warm():
        return "compiled"
    if rows >= AUTO_HOOKS_MIN_ROWS and core_warm is not None and core_warm():
        return "compiled"
    return "interpreted"

#: vLLM's default ``gpu_memory_utilization`` (vllm/engine/arg_utils.py, EngineArgs:
#: ``gpu_memory_utilization: float = 0.9``): the fraction of GPU memory the engine may use
#: for weights + activations + KV cache.  kvsim's default HBM KV capacity is
#: ``gpu_memory_bytes * 0.9 - weights_bytes`` (the remaining 10% stands for activations and
#: the CUDA context, which vLLM measures with a profiling run; see docs/cost-model.md).
VLLM_GPU_MEMORY_UTILIZATION = 0.9


def _h(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class SimConfig:
    """How to replay an event file.  Capacities: ``None`` = the hardware profile's value."""

    hardware: str = field(default="h100-sxm", metadata=_h(
        "hardware profile: a bundled name (kvsim.spec.hardware.list_hardware()) or a .toml path"))
    hbm_gb: float | None = field(default=None, metadata=_h(
        "HBM capacity for KV blocks in GB (1e9 bytes); default: GPU memory x "
        "gpu_memory_utilization - model weights"))
    hbm_blocks: int | None = field(default=None, metadata=_h(
        "exact number of HBM KV blocks (overrides hbm_gb)"))
    dram_gb: float | None = field(default=None, metadata=_h(
        "DRAM tier capacity in GB; 0 disables the tier; default: the profile's"))
    cxl_gb: float | None = field(default=None, metadata=_h(
        "CXL tier capacity in GB; 0 disables the tier; default: the profile's"))
    nvme_gb: float | None = field(default=None, metadata=_h(
        "NVMe tier capacity in GB; 0 disables the tier; default: the profile's"))
    gpu_memory_utilization: float = field(default=VLLM_GPU_MEMORY_UTILIZATION, metadata=_h(
        "fraction of GPU memory for weights + KV (vLLM's default 0.9)"))
    model: str | None = field(default=None, metadata=_h(
        "model for the weights subtracted from GPU memory; default: the trace header's"))
    tier_policies: tuple[tuple[str, str], ...] = field(
        default=(("dram", "lru"), ("cxl", "lru"), ("nvme", "lru")), metadata=_h(
            "eviction policy of each lower tier, e.g. (('dram','lru'),('cxl','s3fifo'))"))
    write_policy: str = field(default="write_back", metadata=_h(
        "host-write policy (SGLang HiCache): write_back (copy down on HBM eviction), "
        "write_through (on first use), write_through_selective (on second use), "
        "vllm_offload (vLLM's native CPU offloading: prompt blocks stored as computed, "
        "vLLM's request-ranked LRU; closed loop with vLLM's scheduler only)"))
    preemption: str = field(default="recompute", metadata=_h(
        "when HBM is full of held blocks: recompute (vLLM v1) or swap (to host memory)"))
    priority_scheduling: bool = field(default=False, metadata=_h(
        "preempt the lowest request_priority instead of the last admitted request"))
    prefetch: bool = field(default=True, metadata=_h(
        "hide a request's lower-tier promotions behind its queueing time (prefetch_ok)"))
    link_model: str = field(default="none", metadata=_h(
        "none (each transfer timed alone: latency + bytes / slowest hop) or queue (every "
        "transfer occupies its link, FIFO per direction, and waits for those before it: "
        "kvsim.replay.kernel.links; docs/cost-model.md, 'Links as queues')"))
    shared_tier_gb: float | None = field(default=None, metadata=_h(
        "closed loop: a KV store shared by every replica (kvsim.modes.closed.shared_tier), "
        "this many GB, in place of the replicas' private DRAM / CXL / NVMe; None = none"))
    shared_tier_policy: str = field(default="lru", metadata=_h(
        "the shared tier's eviction policy (a registered policy name)"))
    shared_link_bytes_per_s: float = field(default=SHARED_LINK_BYTES_PER_S, metadata=_h(
        "bandwidth of each replica's network link to the shared tier, bytes/s"))
    shared_link_latency_us: float = field(default=SHARED_LINK_LATENCY_US, metadata=_h(
        "latency of one transfer batch to or from the shared tier, us"))
    warmup_fraction: float = field(default=0.0, metadata=_h(
        "fraction of the trace's requests, counted in arrival order, excluded from the "
        "metrics (cache warm-up): the first floor(F x requests) requests"))
    warmup_requests: int | None = field(default=None, metadata=_h(
        "absolute alternative to warmup_fraction: the first N requests in arrival order "
        "are warm-up"))
    mode: str = field(default="engine", metadata=_h(
        "engine (the scheduled replay: batching, latencies) or cache (requests one at a "
        "time in arrival order, lookup then insert, no timing)"))
    cache_variant: str = field(default="prefix", metadata=_h(
        "cache mode only: prefix (a lookup stops at the first missing block), vllm (prefix "
        "with vLLM's rules: at most prompt - 1 tokens hit, a partial last block is never "
        "shared) or block (every resident block of the prompt counts, each block one "
        "access)"))
    live_offload: bool = field(default=False, metadata=_h(
        "live KV offload (engine mode, recorded schedule): running requests' blocks may be "
        "spilled to the lower tiers and fetched back before the step that reads them "
        "(kvsim.modes.live.live_offload; docs/memory-model.md, 'Live offload')"))
    log_lifecycle: bool = field(default=False, metadata=_h(
        "decision log also records ALLOCATE/HIT/REVIVE/RELEASE/FREE rows"))
    log_candidates: int = field(default=4, metadata=_h(
        "runners-up recorded per eviction in the decision log (victim included)"))
    seed: int = field(default=0, metadata=_h("seed passed to policies that randomise"))
    engine: str = field(default="auto", metadata=_h(
        "auto (compiled when the policies' compiled core is in the disk cache or the "
        "trace has at least AUTO_COMPILE_MIN_ROWS events, else interpreted), compiled "
        "(numba, cached on disk; the first run of a policy pays its "
        "compile) or interpreted (the same code run by Python: no compile time, ~100x "
        "slower per event; plain-Python policies always use it)"))
    batch_rows: int = field(default=1 << 18, metadata=_h("event rows per streamed batch"))
    check_invariants: bool = field(default=False, metadata=_h(
        "after the replay, check the pool and tier invariants (SimResult.checks)"))
    tenant_quotas: tuple[tuple, ...] = field(default=(), metadata=_h(
        "per-tenant quotas: (tenant, tier, cap_blocks, share_blocks) entries, or (tenant, "
        "tier, cap_blocks, share_blocks, high_blocks, low_blocks) with watermarks, passed to "
        "the tiers' policies as params['tenant_quotas'] (the quota_lru policy enforces them; "
        "docs/policies.md, 'Tenant quotas')"))
    tenant_metrics: bool = field(default=False, metadata=_h(
        "add per-tenant rows to the summary (summary['tenant_rows']: hit rate, TTFT p99, "
        "HBM evictions suffered and caused; kvsim compare --tenants)"))

    def quota_params(self) -> dict:
        """``{tier: ((tenant, cap_blocks, share_blocks), ...)}``: what the tiers' policies
        receive as ``params["tenant_quotas"]`` ({} without quotas); an entry with
        watermarks is ``(tenant, cap_blocks, share_blocks, high_blocks, low_blocks)``."""
        out: dict = {}
        for tenant, tier, *rest in self.tenant_quotas:
            out.setdefault(tier, []).append((int(tenant), *(int(v) for v in rest)))
        return {t: tuple(v) for t, v in out.items()}

    def __post_init__(self) -> None:
        seen = set()
        for q in self.tenant_quotas:
            if len(q) not in (4, 6) or q[1] not in ("hbm", *LOWER_TIERS) or q[2] < 0 \
                    or q[3] < 0 or q[3] > q[2] or (len(q) == 6 and not 0 <= q[5] <= q[4]):
                raise bad_value(None, None, "--tenant-quota", "(tenant, tier in hbm|dram|cxl|"
                                "nvme, cap_blocks >= share_blocks >= 0[, high_blocks >= "
                                "low_blocks >= 0])", q)
            if (q[0], q[1]) in seen:
                raise bad_value(None, None, "--tenant-quota", "one quota per tenant and tier",
                                q)
            seen.add((q[0], q[1]))
        for name in ("hbm_gb", "dram_gb", "cxl_gb", "nvme_gb"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise bad_value(None, None, name, "a capacity >= 0 (GB)", value)
        if self.hbm_blocks is not None and self.hbm_blocks < 1:
            raise bad_value(None, None, "hbm_blocks", "an integer >= 1", self.hbm_blocks)
        if self.hbm_blocks is not None:  # refused now, before any work (the replay checks
            from kvsim.core.limits import get_limits  # --hbm-gb, which needs the block size)

            top = get_limits().max_hbm_blocks
            if self.hbm_blocks > top:
                raise KvsimInputError(f"expected an HBM pool of at most {top:,} blocks (kvsim "
                                      f"limit max_hbm_blocks), got {self.hbm_blocks}", None,
                                      None, "--hbm-blocks")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise bad_value(None, None, "gpu_memory_utilization", "a fraction in (0, 1]",
                            self.gpu_memory_utilization)
        if self.write_policy not in WRITE_POLICIES:
            raise bad_value(None, None, "write_policy", " | ".join(WRITE_POLICIES),
                            self.write_policy)
        if self.preemption not in PREEMPTION_MODES:
            raise bad_value(None, None, "preemption", " | ".join(PREEMPTION_MODES),
                            self.preemption)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise bad_value(None, None, "warmup_fraction", "a fraction in [0, 1)",
                            self.warmup_fraction)
        if self.warmup_requests is not None:
            if self.warmup_requests < 0:
                raise bad_value(None, None, "warmup_requests", "an integer >= 0",
                                self.warmup_requests)
            if self.warmup_fraction > 0:
                raise bad_value(None, None, "warmup_requests",
                                "either warmup_requests or warmup_fraction, not both",
                                self.warmup_requests)
        if self.mode not in MODES:
            raise bad_value(None, None, "mode", " | ".join(MODES), self.mode)
        if self.cache_variant not in CACHE_VARIANTS:
            raise bad_value(None, None, "cache_variant", " | ".join(CACHE_VARIANTS),
                            self.cache_variant)
        if self.live_offload and self.mode != "engine":
            raise bad_value(None, None, "--live-offload", "--mode engine (live offload "
                            "replays engine steps)", f"--mode {self.mode}")
        if self.live_offload and self.preemption != "recompute":
            raise bad_value(None, None, "--live-offload", "--preemption recompute (the "
                            "mode spills blocks instead of swapping requests)",
                            f"--preemption {self.preemption}")
        if not 0 <= self.log_candidates <= 8:
            raise bad_value(None, None, "log_candidates", "an integer in 0..8",
                            self.log_candidates)
        if self.link_model not in LINK_MODELS:
            raise bad_value(None, None, "--link-model", " | ".join(LINK_MODELS),
                            self.link_model)
        if self.shared_link_bytes_per_s <= 0 or self.shared_link_latency_us < 0:
            raise bad_value(None, None, "--shared-link-gbps / --shared-link-latency-us",
                            "a positive bandwidth and a latency >= 0",
                            (self.shared_link_bytes_per_s, self.shared_link_latency_us))
        if self.engine not in ENGINES:
            raise bad_value(None, None, "engine", " | ".join(ENGINES), self.engine)
        if self.batch_rows < 1:
            raise bad_value(None, None, "batch_rows", "an integer >= 1", self.batch_rows)
        for item in self.tier_policies:
            if len(item) != 2 or item[0] not in LOWER_TIERS:
                raise bad_value(None, None, "tier_policies",
                                "pairs (tier, policy) with tier in dram|cxl|nvme", item)

    def warmup_count(self, num_requests: int) -> int:
        """How many requests, in arrival order, are warm-up: ``warmup_requests`` if set,
        else ``floor(warmup_fraction x num_requests)`` (kvcache-simulator's rule).  Raises
        when no request would be left to measure."""
        if self.warmup_requests is not None:
            w = int(self.warmup_requests)
            if w > 0 and w >= num_requests:
                raise bad_value(None, None, "warmup_requests",
                                f"fewer than the trace's {num_requests} requests", w)
            return w
        return int(math.floor(self.warmup_fraction * num_requests))

    def tier_policy(self, tier: str) -> str:
        """The eviction policy of lower tier ``tier`` (the last assignment wins; lru)."""
        name = "lru"
        for t, p in self.tier_policies:
            if t == tier:
                name = p
        return name

    def explicit_hbm_blocks(self, block_bytes: int) -> int | None:
        """The HBM pool in blocks of ``block_bytes`` when the config fixes it
        (``hbm_blocks``, else ``hbm_gb`` in 1e9 bytes, rounded down); None = derived from
        the GPU and the model (:func:`kvsim.engine.cost_model.hbm_kv_capacity_bytes`)."""
        from kvsim.core.limits import get_limits

        top = get_limits().max_hbm_blocks
        if self.hbm_blocks is not None:
            n, option = int(self.hbm_blocks), "--hbm-blocks"
        elif self.hbm_gb is not None:
            from kvsim.core.units import GB

            n, option = int(self.hbm_gb * GB) // int(block_bytes), "--hbm-gb"
        else:
            return None
        if n > top:  # the pool's arrays would not fit in memory (kvsim.core.limits)
            from kvsim.core.errors import bad_option

            raise bad_option(option, f"an HBM pool of at most {top:,} blocks (kvsim limit "
                             f"max_hbm_blocks; this is {n:,} blocks of {block_bytes:,} "
                             "bytes)", self.hbm_blocks if self.hbm_blocks is not None
                             else self.hbm_gb)
        return n

    def lowering_options(self, block_size_tokens: int = 16,
                         default_model: str = DEFAULT_MODEL) -> dict:
        """Keyword arguments for :func:`kvsim.workload.generate` (or
        :func:`kvsim.engine.lowering.import_request_trace`) that lower a workload *for this replay*:
        same hardware and model, and a scheduler KV budget (``num_gpu_blocks``) equal to
        the HBM pool this config replays into.

        Why: the lowering decides how many requests run at once from its block budget.  A
        trace lowered for the whole GPU (the default budget) and replayed into a smaller
        ``hbm_gb`` has more running blocks than HBM holds, so the replay preempts in a loop
        (deadline_pressure, 256 requests, 4 GB: 6,846 preemptions and a 3.8 s p99 step); a
        real engine with that HBM would have admitted fewer requests.  ``kvsim compare
        --profile`` uses this, so ``--hbm-gb`` sizes the scheduler and the pool together."""
        model = self.model or default_model
        opts: dict = {"hardware": self.hardware, "model": model,
                      "block_size_tokens": int(block_size_tokens),
                      "gpu_memory_utilization": self.gpu_memory_utilization}
        if (self.hbm_blocks is not None or self.hbm_gb is not None) and not self.live_offload:
            # (live offload: lowered for the whole GPU, replayed into a smaller HBM)
            from kvsim.spec.kvsize import kv_bytes_per_token
            from kvsim.spec.models import load_model

            block_bytes = kv_bytes_per_token(load_model(model)) * int(block_size_tokens)
            blocks = self.explicit_hbm_blocks(block_bytes)
            if blocks < 1:
                raise bad_value(None, None, "hbm_gb",
                                f"room for at least one KV block ({block_bytes} bytes)",
                                self.hbm_gb)
            opts["num_gpu_blocks"] = blocks
        return opts

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("tenant_quotas", "tenant_metrics"):  # absent at their defaults, so
            if not out[name]:  # every output without tenants stays as it was
                del out[name]
        if out["link_model"] == "none":  # outputs of the default model as before it existed
            del out["link_model"]
        if out["shared_tier_gb"] is None:  # likewise without a shared tier
            for k in ("shared_tier_gb", "shared_tier_policy", "shared_link_bytes_per_s",
                      "shared_link_latency_us"):
                del out[k]
        out["tier_policies"] = {t: self.tier_policy(t) for t in LOWER_TIERS}
        return out


def parse_tier_policies(text: str | None) -> tuple[tuple[str, str], ...]:
    """``"dram=lru,cxl=s3fifo"`` -> ``(("dram","lru"),("cxl","s3fifo"))`` (CLI syntax)."""
    if not text:
        return SimConfig().tier_policies
    pairs = dict(SimConfig().tier_policies)
    for part in text.split(","):
        tier, sep, policy = part.strip().partition("=")
        if not sep or tier not in LOWER_TIERS or not policy:
            raise KvsimInputError(f"expected TIER=POLICY with TIER in dram|cxl|nvme, got "
                                  f"{part.strip()!r}", None, None, "--tier-policy")
        pairs[tier] = policy
    return tuple((t, pairs[t]) for t in LOWER_TIERS)


def parse_tenant_quotas(items) -> tuple[tuple, ...]:
    """``["1:hbm:cap=100,share=20", "2:dram:cap=500"]`` -> ``((1, "hbm", 100, 20), (2,
    "dram", 500, 0))`` (CLI syntax of ``--tenant-quota``; cap defaults to unlimited, share
    to 0; blocks of the tier).  With watermarks (``high=H[,low=L]``, low defaults to high)
    an entry has two more members: ``(tenant, tier, cap, share, high, low)``."""
    out = []
    for text in items or ():
        parts = str(text).strip().split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            tenant, tier = int(parts[0]), parts[1].strip()
            kv = dict(p.split("=", 1) for p in parts[2].split(",") if p.strip())
            if set(kv) - {"cap", "share", "high", "low"} or not kv \
                    or ("low" in kv and "high" not in kv):
                raise ValueError
            cap = int(kv.get("cap", 2**62))
            share = int(kv.get("share", 0))
            marks = (int(kv["high"]), int(kv.get("low", kv["high"]))) if "high" in kv else ()
        except ValueError:
            raise KvsimInputError(f"expected TENANT:TIER:cap=BLOCKS[,share=BLOCKS]"
                                  f"[,high=BLOCKS[,low=BLOCKS]], got {text!r}", None, None,
                                  "--tenant-quota") from None
        out.append((tenant, tier, cap, share, *marks))
    return tuple(out)
