"""KV-cache footprint: bytes per token, per block, per request; paged vs naive reservation.

The arithmetic (docs/estimate-kv.md derives each formula with sources):

- One *stored vector* is what one layer keeps for one token for one KV head and one of K or
  V (MHA/GQA/MQA), or the single compressed latent + RoPE key of an MLA layer.  Its bytes
  are ``ceil(width * bits / 8)`` plus, for int8/int4, a 4-byte fp16 scale + zero point.
- Per layer per token: MHA/GQA/MQA ``2 * num_kv_heads * vec(head_dim)``; MLA
  ``vec(kv_lora_rank + qk_rope_head_dim)``.
- A "full" layer keeps every token; a "sliding" layer keeps only the last
  ``sliding_window`` tokens.

Invariants: every byte count is an exact int; ``kv_bytes_for_tokens(m, n) <=
n * kv_bytes_per_token(m)`` with equality iff no layer's window is exceeded; paged bytes
>= exact bytes (blocks are whole); all results are pure functions of their arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.spec.models import (
    WEIGHT_DTYPE_BYTES,
    ModelSpec,
    list_models,
    load_model,
    with_speculative,
)

__all__ = [
    "KV_DTYPES", "KvDtype", "KvEstimate", "ModelSpec", "block_bytes", "estimate_kv",
    "kv_bytes_for_tokens", "kv_bytes_per_layer_token", "kv_bytes_per_token", "list_models",
    "load_model", "DEFAULT_MEMORY_UTILIZATION", "default_kv_dtype",
    "mha_equivalent_bytes_per_token", "kv_bytes_per_layer_token_per_gpu",
    "vllm_block_layout", "kv_cache_blocks",
]

BYTES_PER_GB = 10**9
BYTES_PER_MIB = 2**20

#: Fraction of GPU memory the serving engine may use (weights + KV); vLLM's default
#: ``--gpu-memory-utilization`` (source: vLLM engine args, default 0.9).
DEFAULT_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class KvDtype:
    """A KV-cache element format: bits per element and per-vector scale overhead."""

    name: str
    bits: int
    scale_bytes_per_vector: int
    note: str


#: Scale overheads: fp8 in vLLM/SGLang uses per-tensor (or per-head) scales held once per
#: layer, never per token (vLLM docs "Quantized KV Cache"), so it adds no per-token bytes.
#: int8/int4 follow LMDeploy TurboMind's per-head, per-token asymmetric quantization: every
#: stored vector carries a scale and a zero point, stored here as fp16 + fp16 = 4 bytes
#: (LMDeploy docs "INT4/INT8 KV Cache"; the fp16 storage of both is our assumption).
KV_DTYPES: dict[str, KvDtype] = {d.name: d for d in (
    KvDtype("fp32", 32, 0, "no scale"),
    KvDtype("fp16", 16, 0, "no scale"),
    KvDtype("bf16", 16, 0, "no scale"),
    KvDtype("fp8", 8, 0, "fp8 e4m3 (vLLM 'fp8'); per-tensor scale per layer, no per-token bytes"),
    KvDtype("fp8_e4m3", 8, 0, "per-tensor scale per layer, no per-token bytes"),
    KvDtype("fp8_e5m2", 8, 0, "no scale needed (wide range); no per-token bytes"),
    KvDtype("int8", 8, 4, "+4 bytes per stored vector: fp16 scale + fp16 zero point "
            "(per token, per KV head, K and V separately; LMDeploy-style)"),
    KvDtype("int4", 4, 4, "+4 bytes per stored vector: fp16 scale + fp16 zero point "
            "(per token, per KV head, K and V separately; LMDeploy-style)"),
)}


def default_kv_dtype(model: ModelSpec) -> str:
    """The KV dtype a server uses by default: the model's activation dtype (vLLM
    ``--kv-cache-dtype auto``): its weights dtype when that is fp16/bf16/fp32, else (fp8 or
    int weights) the config's ``torch_dtype`` (bf16 or fp16)."""
    if model.weights_dtype in ("fp16", "bf16", "fp32"):
        return model.weights_dtype
    torch_dtype = model.config.get("torch_dtype") or model.config.get("dtype")
    return "bf16" if torch_dtype == "bfloat16" else "fp16"


def _dtype(kv_dtype: str) -> KvDtype:
    try:
        return KV_DTYPES[kv_dtype]
    except KeyError:
        raise bad_value(None, None, "kv_dtype", f"one of {', '.join(KV_DTYPES)}",
                        kv_dtype) from None


def _vector_bytes(width: int, dtype: KvDtype) -> int:
    return -(-width * dtype.bits // 8) + dtype.scale_bytes_per_vector


def kv_bytes_per_layer_token(model: ModelSpec, kv_dtype: str = "fp16") -> int:
    """Bytes one layer stores for one token (every layer of a model stores the same).

    ``kv_dtype`` is a key of :data:`KV_DTYPES`, or ``"auto"`` (:func:`default_kv_dtype`);
    every function of this module accepts both.
    """
    dtype = _dtype(default_kv_dtype(model) if kv_dtype == "auto" else kv_dtype)
    if model.attention == "mla":
        return _vector_bytes(model.kv_lora_rank + model.qk_rope_head_dim, dtype)
    return 2 * model.num_kv_heads * _vector_bytes(model.head_dim, dtype)


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "fp16") -> int:
    """Bytes per token over all layers, as if every layer were full attention.

    This is the upper bound (no window cap) and what one token of a block costs; use
    :func:`kv_bytes_for_tokens` for the exact footprint of a sequence.
    """
    layers = model.num_full_layers + model.num_sliding_layers  # linear layers keep no KV
    return layers * kv_bytes_per_layer_token(model, kv_dtype)


def mha_equivalent_bytes_per_token(model: ModelSpec, kv_dtype: str = "fp16") -> int:
    """Bytes per token if every query head kept its own K and V (the naive per-head
    arithmetic; for MLA, K of width head_dim and V of width v_head_dim per head)."""
    dtype = _dtype(default_kv_dtype(model) if kv_dtype == "auto" else kv_dtype)
    heads = model.num_attention_heads
    per_layer = heads * (_vector_bytes(model.head_dim, dtype)
                         + _vector_bytes(model.v_head_dim or model.head_dim, dtype))
    return (model.num_full_layers + model.num_sliding_layers) * per_layer


def _check_tokens(value: int, fieldname: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_value(None, None, fieldname, f"an integer >= {minimum}", value)
    return value


def kv_bytes_for_tokens(model: ModelSpec, num_tokens: int, kv_dtype: str = "fp16") -> int:
    """Exact KV bytes of a sequence of ``num_tokens`` (sliding layers capped at their window)."""
    _check_tokens(num_tokens, "num_tokens")
    per_layer = kv_bytes_per_layer_token(model, kv_dtype)
    window_tokens = num_tokens if model.sliding_window is None else min(num_tokens,
                                                                        model.sliding_window)
    return (per_layer * (model.num_full_layers * num_tokens
                         + model.num_sliding_layers * window_tokens)
            + model.num_linear_layers * model.linear_state_bytes)


#: FlashAttention's kernel block alignment (vLLM 0.33
#: ``FlashAttentionBackend.get_supported_kernel_block_sizes``: ``MultipleOf(16)``)
KERNEL_BLOCK_ALIGNMENT_TOKENS = 16


def hybrid_block_size(model: ModelSpec, block_size_tokens: int, kv_dtype: str = "fp16") -> int:
    """The attention block size vLLM serves a linear-attention / Mamba hybrid with: raised
    until one layer's attention page covers one layer's state page (vLLM 0.33
    ``Platform._align_hybrid_block_size``: ``align * cdiv(state, align * page_1_token)``
    with ``align = max(16, block_size)``); the state page is then padded to it.  Models
    without linear layers keep ``block_size_tokens``."""
    if model.num_linear_layers == 0:
        return block_size_tokens
    align = max(KERNEL_BLOCK_ALIGNMENT_TOKENS, block_size_tokens)
    one = kv_bytes_per_layer_token(model, kv_dtype)
    need = align * -(-model.linear_state_bytes // (align * one))
    need = KERNEL_BLOCK_ALIGNMENT_TOKENS * -(-need // KERNEL_BLOCK_ALIGNMENT_TOKENS)
    return max(block_size_tokens, need)


def vllm_block_layout(model: ModelSpec, block_size_tokens: int = 16,
                      kv_dtype: str = "fp16") -> tuple[int, int, int]:
    """``(block size, layers per group, bytes per block)`` of the KV cache vLLM 0.33 lays
    out for ``model`` at tensor parallel 1 (``kv_cache_planning``): one group of every
    layer when all layers are alike; otherwise layers of one kind are bucketed and split
    into groups of equal size -- the smallest bucket's layer count, or the largest when it
    is under 1.5x the smallest (``_get_kv_cache_groups_uniform_page_size``) -- and one
    block id costs one page of each layer of a group: ``bytes per block = layers per group
    x page``, the page being ``block size x one layer's token bytes`` (raised to cover a
    Mamba / linear state page, :func:`hybrid_block_size`).  Pass
    :func:`kvsim.spec.models.with_speculative` to count MTP draft layers."""
    bs = hybrid_block_size(model, block_size_tokens, kv_dtype)
    counts = [n for n in (model.num_full_layers, model.num_sliding_layers,
                          model.num_linear_layers) if n]
    size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    page = bs * kv_bytes_per_layer_token(model, kv_dtype)
    if model.num_linear_layers:
        page = max(page, model.linear_state_bytes)
    return bs, size, size * page


def kv_cache_blocks(model: ModelSpec, available_bytes: int, block_size_tokens: int = 16,
                    kv_dtype: str = "fp16") -> int:
    """KV-cache blocks vLLM 0.33 makes of ``available_bytes`` (``get_kv_cache_configs``:
    ``available // bytes per block``, :func:`vllm_block_layout`; the null block is one of
    them).  tests/test_model_kv_vllm.py checks it against vLLM's own planning."""
    _check_tokens(available_bytes, "available_bytes")
    return available_bytes // vllm_block_layout(model, block_size_tokens, kv_dtype)[2]


def block_bytes(model: ModelSpec, block_size_tokens: int, kv_dtype: str = "fp16") -> int:
    """Bytes of one KV block of ``block_size_tokens`` tokens across all layers, K and V."""
    _check_tokens(block_size_tokens, "block_size_tokens", 1)
    return block_size_tokens * kv_bytes_per_token(model, kv_dtype)


def _blocks_held(num_tokens: int, block_size: int, window: int | None) -> int:
    """Blocks a layer holds for ``num_tokens``: all of them (full), or those overlapping
    the last ``window`` tokens (sliding: blocks wholly outside the window are freed, as
    vLLM's SlidingWindowManager does)."""
    total = -(-num_tokens // block_size)
    if window is None or num_tokens <= window:
        return total
    return total - (num_tokens - window) // block_size


def layer_groups(model: ModelSpec, num_tokens: int, block_size_tokens: int,
                 kv_dtype: str = "fp16", num_speculative_tokens: int = 0) -> tuple[dict, ...]:
    """One request of ``num_tokens`` tokens per layer group, as vLLM's hybrid KV-cache
    manager splits it (one manager per attention type: ``FullAttentionManager``,
    ``SlidingWindowManager``): ``kind`` (``full_attention`` | ``sliding_window``),
    ``layers``, ``window_tokens`` (None for full attention), ``bytes_per_token`` (the
    group's layers, K and V, no cap), ``blocks_held`` (per layer: every block for full
    attention; for a window, only the blocks overlapping the last ``window`` tokens --
    those wholly outside it are freed), ``exact_bytes`` (tokens kept x bytes) and
    ``paged_bytes`` (blocks held x block bytes).  Groups without layers are left out; the
    groups' ``exact_bytes`` and ``paged_bytes`` sum to the request's.  A linear-attention /
    Mamba hybrid adds a ``linear_attention`` group: one state per layer per request
    (``state_bytes_per_layer``), held in one block whose page vLLM pads to the attention
    page (``paged_bytes``); with ``k`` speculative tokens vLLM's ``MambaManager`` holds
    ``k`` more state blocks per request (``MambaSpec.num_speculative_blocks``)."""
    per_layer = kv_bytes_per_layer_token(model, kv_dtype)
    out = []
    for kind, layers, window in (("full_attention", model.num_full_layers, None),
                                 ("sliding_window", model.num_sliding_layers,
                                  model.sliding_window)):
        if layers == 0:
            continue
        kept = num_tokens if window is None else min(num_tokens, window)
        held = _blocks_held(num_tokens, block_size_tokens, window)
        out.append({"kind": kind, "layers": int(layers), "window_tokens": window,
                    "bytes_per_token": int(layers * per_layer), "blocks_held": int(held),
                    "exact_bytes": int(layers * per_layer * kept),
                    "paged_bytes": int(layers * per_layer * held * block_size_tokens)})
    if model.num_linear_layers:
        # vLLM MambaManager ("align"): one state block per request per layer, its page
        # padded to the attention page (block_size x one layer's token bytes)
        layers = model.num_linear_layers
        held = 1 + num_speculative_tokens
        out.append({"kind": "linear_attention", "layers": int(layers), "window_tokens": None,
                    "bytes_per_token": 0, "blocks_held": held,
                    "state_bytes_per_layer": int(model.linear_state_bytes),
                    "exact_bytes": int(layers * held * model.linear_state_bytes),
                    "paged_bytes": int(layers * held * max(model.linear_state_bytes,
                                                           per_layer * block_size_tokens))})
    return tuple(out)


def kv_bytes_per_layer_token_per_gpu(model: ModelSpec, kv_dtype: str = "fp16",
                                     tensor_parallel_size: int = 1) -> int:
    """Bytes one layer stores per token on EACH GPU of a tensor-parallel group.

    KV heads are split across the group; when there are fewer KV heads than GPUs each GPU
    keeps one (replicated), and an MLA latent is replicated on every GPU (vLLM's
    tensor-parallel layouts: ``get_num_kv_heads`` and the MLA backends).
    """
    tp = tensor_parallel_size
    if model.attention == "mla" or tp == 1:
        return kv_bytes_per_layer_token(model, kv_dtype)
    if model.num_attention_heads % tp:
        raise bad_value(None, None, "tensor_parallel_size",
                        f"a divisor of the {model.num_attention_heads} attention heads", tp)
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise bad_value(None, None, "tensor_parallel_size",
                        f"a divisor or multiple of the {kv} KV heads", tp)
    heads_per_gpu = max(1, kv // tp)
    return kv_bytes_per_layer_token(model, kv_dtype) // kv * heads_per_gpu


def _vllm_block_bytes_per_gpu(model, block_size, kv_dtype, per_gpu_layer, tp) -> int:
    """:func:`vllm_block_layout`'s bytes per block on each GPU of a tensor-parallel group
    (KV heads split; a Mamba / linear state split over the group's heads)."""
    _bs, size, _total = vllm_block_layout(model, block_size, kv_dtype)
    page = block_size * per_gpu_layer
    if model.num_linear_layers:
        page = max(page, -(-model.linear_state_bytes // tp))
    return size * page


def _gpu_fit(model, kv_dtype, layer_blocks, naive_layer_tokens, block_size, concurrency, gpu,
             gpu_mem_gb, weights_dtype, memory_utilization, tp, warnings) -> dict:
    """The KvEstimate fields that need a GPU: budget beside the weights and what fits."""
    if gpu is not None and gpu_mem_gb is not None:
        raise KvsimInputError("give either gpu or gpu_mem_gb, not both", None, None, "gpu")
    if gpu is not None:
        from kvsim.spec.hardware import load_hardware

        memory = load_hardware(gpu).gpu_memory_bytes
    else:
        if not gpu_mem_gb > 0:
            raise bad_value(None, None, "gpu_mem_gb", "a positive number", gpu_mem_gb)
        memory = int(round(gpu_mem_gb * BYTES_PER_GB))
    if not 0 < memory_utilization <= 1:
        raise bad_value(None, None, "memory_utilization", "a fraction in (0, 1]",
                        memory_utilization)
    wdtype = weights_dtype or model.weights_dtype
    if wdtype not in WEIGHT_DTYPE_BYTES:
        raise bad_value(None, None, "weights_dtype", f"one of {', '.join(WEIGHT_DTYPE_BYTES)}",
                        wdtype)
    if model.num_params <= 0:
        raise KvsimInputError(f"model {model.name!r} has no parameter count (kvsim cannot "
                              "count this layout); add \"num_params\" to its config.json",
                              model.source, None, "num_params")
    weights = int(model.num_params * WEIGHT_DTYPE_BYTES[wdtype])
    per_gpu_layer = kv_bytes_per_layer_token_per_gpu(model, kv_dtype, tp)
    paged_per_gpu = layer_blocks * block_size * per_gpu_layer
    naive_per_gpu = naive_layer_tokens * per_gpu_layer
    budget = int(memory * memory_utilization) - -(-weights // tp)
    if budget <= 0:
        warnings.append(f"the weights ({weights / BYTES_PER_GB:.1f} GB in {wdtype}, "
                        f"/{tp} GPUs) do not fit in {memory_utilization:g} x "
                        f"{memory / BYTES_PER_GB:.1f} GB")
    fits = max(0, budget // paged_per_gpu)
    return dict(
        gpu=gpu if gpu is not None else f"{gpu_mem_gb:g} GB",
        gpu_memory_bytes=memory,
        paged_bytes_per_gpu=paged_per_gpu,
        memory_utilization=memory_utilization,
        weights_dtype=wdtype,
        weights_bytes=weights,
        kv_budget_bytes=budget,
        # KV layers only: a Mamba / linear layer or an MLP layer holds no KV (BLIS counts
        # every layer: docs/estimate-kv.md, "Hybrid Mamba models")
        kv_budget_blocks=max(0, budget // (block_size * per_gpu_layer * (
            model.num_full_layers + model.num_sliding_layers))),
        vllm_num_gpu_blocks=max(0, budget // _vllm_block_bytes_per_gpu(
            model, block_size, kv_dtype, per_gpu_layer, tp)),
        fits_sequences=fits,
        fits_sequences_naive=max(0, budget // naive_per_gpu),
        fits_concurrency=fits >= concurrency,
    )


@dataclass(frozen=True)
class KvEstimate:
    """Result of :func:`estimate_kv`.  Bytes are exact ints; GB = 10^9 bytes.

    ``paged_*``: blocks allocated on demand, the last one partly empty (vLLM, SGLang).
    ``naive_*``: ``max_seq_len`` tokens reserved per request up front (FasterTransformer /
    HF static cache style).  Totals multiply by ``concurrency`` with no prefix sharing.
    """

    model: str
    kv_dtype: str
    kv_dtype_note: str
    attention: str
    block_size_tokens: int
    concurrency: int
    tensor_parallel_size: int
    prompt_tokens: int
    generated_tokens: int
    request_tokens: int
    max_seq_len: int
    bytes_per_token: int  # all layers, no window cap
    bytes_per_layer_token: int
    mha_equivalent_bytes_per_token: int
    block_bytes: int
    exact_bytes: int  # per request, window-capped
    paged_blocks: int  # block-table length (logical blocks) per request
    paged_layer_blocks: int  # per-layer blocks held, summed over layers (sliding: capped)
    paged_bytes: int
    naive_bytes: int
    fragmentation_bytes: int  # paged - exact
    fragmentation_fraction: float  # (paged - exact) / paged
    naive_waste_fraction: float  # (naive - exact) / naive
    total_exact_bytes: int
    total_paged_bytes: int
    total_naive_bytes: int
    sequences_per_gb_paged: float
    sequences_per_gb_naive: float
    paged_vs_naive_ratio: float  # sequences_per_gb_paged / sequences_per_gb_naive
    num_sliding_layers: int
    sliding_window: int | None
    gpu: str | None = None
    gpu_memory_bytes: int | None = None  # per GPU
    paged_bytes_per_gpu: int | None = None  # one request's KV on each GPU of the TP group
    memory_utilization: float | None = None
    weights_dtype: str | None = None
    weights_bytes: int | None = None  # whole model (each GPU holds 1/tensor_parallel_size)
    kv_budget_bytes: int | None = None  # per GPU
    kv_budget_blocks: int | None = None  # per GPU, blocks of every KV layer
    vllm_num_gpu_blocks: int | None = None  # per GPU, vLLM's num_gpu_blocks (block ids)
    fits_sequences: int | None = None
    fits_sequences_naive: int | None = None
    fits_concurrency: bool | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: per layer group (vLLM's hybrid KV-cache manager keeps one per attention type): dicts
    #: of :func:`layer_groups` (full attention first, then the sliding window)
    groups: tuple[dict, ...] = field(default_factory=tuple)
    #: Mamba / linear-attention state per request, all linear layers (0: none)
    state_bytes_per_request: int = 0
    #: speculative decoding as vLLM sizes it (:func:`kvsim.spec.models.with_speculative`):
    #: ``none`` | ``ngram`` | ``mtp``, the drafts per step, the MTP layers added to the KV
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    draft_layers: int = 0

    #: Keys present only with speculative decoding (``spec_method`` not ``none``).
    SPEC_KEYS = ("spec_method", "num_speculative_tokens", "draft_layers")

    #: Keys present only when a GPU (name or memory) was given.
    GPU_KEYS = ("gpu", "gpu_memory_bytes", "paged_bytes_per_gpu", "memory_utilization", "weights_dtype",
                "weights_bytes", "kv_budget_bytes", "kv_budget_blocks", "vllm_num_gpu_blocks",
                "fits_sequences",
                "fits_sequences_naive", "fits_concurrency")

    def to_dict(self) -> dict:
        """JSON-ready dict (stable keys, docs/estimate-kv.md); GPU keys only with a GPU."""
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        data["groups"] = [dict(g) for g in self.groups]
        if self.gpu_memory_bytes is None:
            for key in self.GPU_KEYS:
                del data[key]
        if self.spec_method == "none":
            for key in self.SPEC_KEYS:
                del data[key]
        return data


def estimate_kv(
    model: ModelSpec | str,
    *,
    prompt_tokens: int,
    generated_tokens: int,
    block_size_tokens: int = 16,
    concurrency: int = 1,
    max_seq_len: int | None = None,
    kv_dtype: str = "fp16",
    gpu: str | None = None,
    gpu_mem_gb: float | None = None,
    weights_dtype: str | None = None,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    tensor_parallel_size: int = 1,
    spec_method: str = "none",
    num_speculative_tokens: int = 0,
) -> KvEstimate:
    """KV footprint of ``concurrency`` requests of ``prompt + generated`` tokens.

    ``max_seq_len`` (default: the model's ``max_position_embeddings``, or the request if
    longer, with a warning) is what a naive allocator reserves per request.  With ``gpu`` (a
    hardware profile name or path, see :mod:`kvsim.spec.hardware`) or ``gpu_mem_gb``, the KV
    budget of each GPU is ``memory * memory_utilization - weights / tensor_parallel_size``
    and ``fits_sequences`` is how many such requests fit, paged, in a tensor-parallel group
    of ``tensor_parallel_size`` GPUs (KV heads split across them; MLA latents replicated).
    ``spec_method`` / ``num_speculative_tokens``: speculative decoding as vLLM sizes it --
    ``mtp`` adds the model's MTP layers to the KV, and any method grows each Mamba /
    linear state by one conv row per draft and holds one more state block per draft
    (:func:`kvsim.spec.models.with_speculative`).
    """
    if isinstance(model, str):
        model = load_model(model)
    target_layers = model.num_layers
    model = with_speculative(model, spec_method, num_speculative_tokens)
    if kv_dtype == "auto":
        kv_dtype = default_kv_dtype(model)
    _check_tokens(prompt_tokens, "prompt_tokens")
    _check_tokens(generated_tokens, "generated_tokens")
    _check_tokens(block_size_tokens, "block_size_tokens", 1)
    _check_tokens(concurrency, "concurrency", 1)
    _check_tokens(tensor_parallel_size, "tensor_parallel_size", 1)
    dtype = _dtype(kv_dtype)
    n = prompt_tokens + generated_tokens
    if n == 0:
        raise KvsimInputError("expected prompt_tokens + generated_tokens >= 1, got 0",
                              None, None, "prompt_tokens")
    warnings: list[str] = []
    context = model.max_position_embeddings
    if context and n > context:
        warnings.append(f"the request ({n:,} tokens) is longer than the model's context "
                        f"(max_position_embeddings {context:,})")
    if max_seq_len is None:
        max_seq_len = max(context, n)
    _check_tokens(max_seq_len, "max_seq_len", 1)
    if max_seq_len < n:
        raise bad_value(None, None, "max_seq_len",
                        f"at least prompt + generated tokens ({n})", max_seq_len)

    per_layer = kv_bytes_per_layer_token(model, kv_dtype)
    aligned = hybrid_block_size(model, block_size_tokens, kv_dtype)
    if aligned != block_size_tokens:
        warnings.append(f"block size raised from {block_size_tokens} to {aligned} tokens, as "
                        "vLLM does so that an attention page covers a linear-attention "
                        f"state page ({model.linear_state_bytes:,} bytes per layer)")
        block_size_tokens = aligned
    exact = kv_bytes_for_tokens(model, n, kv_dtype)
    state = model.num_linear_layers * model.linear_state_bytes
    if num_speculative_tokens and model.num_linear_layers:  # the drafts' state blocks
        exact += state * num_speculative_tokens
    full_blocks = _blocks_held(n, block_size_tokens, None)
    sliding_blocks = _blocks_held(n, block_size_tokens, model.sliding_window)
    layer_blocks = (model.num_full_layers * full_blocks
                    + model.num_sliding_layers * sliding_blocks
                    # one (padded) state block per linear layer, one more per draft
                    + model.num_linear_layers * (1 + num_speculative_tokens))
    paged = layer_blocks * block_size_tokens * per_layer
    naive = kv_bytes_for_tokens(model, max_seq_len, kv_dtype)
    if dtype.scale_bytes_per_vector:
        warnings.append(f"{kv_dtype}: {dtype.note}")

    hw_fields: dict = {}
    if not 0 < memory_utilization <= 1:  # checked with or without a GPU (main: only with)
        raise bad_value(None, None, "memory_utilization", "a fraction in (0, 1]",
                        memory_utilization)
    if gpu is not None or gpu_mem_gb is not None:
        hw_fields = _gpu_fit(model, kv_dtype, layer_blocks, naive // per_layer,
                             block_size_tokens, concurrency, gpu, gpu_mem_gb, weights_dtype,
                             memory_utilization, tensor_parallel_size, warnings)
    elif tensor_parallel_size != 1:
        kv_bytes_per_layer_token_per_gpu(model, kv_dtype, tensor_parallel_size)  # validates

    return KvEstimate(
        model=model.name,
        kv_dtype=kv_dtype,
        kv_dtype_note=dtype.note,
        attention=model.attention,
        block_size_tokens=block_size_tokens,
        concurrency=concurrency,
        tensor_parallel_size=tensor_parallel_size,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        request_tokens=n,
        max_seq_len=max_seq_len,
        bytes_per_token=kv_bytes_per_token(model, kv_dtype),
        bytes_per_layer_token=per_layer,
        mha_equivalent_bytes_per_token=mha_equivalent_bytes_per_token(model, kv_dtype),
        block_bytes=block_bytes(model, block_size_tokens, kv_dtype),
        exact_bytes=exact,
        paged_blocks=full_blocks,
        paged_layer_blocks=layer_blocks,
        paged_bytes=paged,
        naive_bytes=naive,
        fragmentation_bytes=paged - exact,
        fragmentation_fraction=(paged - exact) / paged,
        naive_waste_fraction=(naive - exact) / naive,
        total_exact_bytes=exact * concurrency,
        total_paged_bytes=paged * concurrency,
        total_naive_bytes=naive * concurrency,
        sequences_per_gb_paged=BYTES_PER_GB / paged,
        sequences_per_gb_naive=BYTES_PER_GB / naive,
        paged_vs_naive_ratio=naive / paged,
        num_sliding_layers=model.num_sliding_layers,
        sliding_window=model.sliding_window,
        warnings=tuple(warnings),
        groups=layer_groups(model, n, block_size_tokens, kv_dtype, num_speculative_tokens),
        state_bytes_per_request=state,
        spec_method=spec_method,
        num_speculative_tokens=num_speculative_tokens,
        draft_layers=model.num_layers - target_layers,
        **hw_fields,
    )
