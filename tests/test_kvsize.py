"""KV footprint arithmetic and the model catalog: exact byte counts, derived by hand.

Every expected number below is written as the arithmetic that produces it (layers x KV
heads x head_dim x K/V x bytes), from the published config.json values, so a reader can
check it without running kvsim.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.core.errors import KvsimInputError
from kvsim.spec.kvsize import (
    block_bytes,
    default_kv_dtype,
    estimate_kv,
    kv_bytes_for_tokens,
    kv_bytes_per_layer_token,
    kv_bytes_per_layer_token_per_gpu,
    kv_bytes_per_token,
    mha_equivalent_bytes_per_token,
)
from kvsim.spec.models import estimate_num_params, list_models, load_model

# name -> fp16 bytes per token, as layers * (K and V = 2) * kv_heads * head_dim * 2 bytes
# (MLA: layers * (kv_lora_rank + qk_rope_head_dim) * 2 bytes: one latent, no K/V pair).
HAND_BYTES_PER_TOKEN_FP16 = {
    "gpt2": 12 * 2 * 12 * 64 * 2,  # MHA, 768 / 12 heads = 64
    "opt-13b": 40 * 2 * 40 * 128 * 2,  # MHA, 5120 / 40 = 128  (= 2 x 40 x 5120 x 2)
    "llama-2-7b": 32 * 2 * 32 * 128 * 2,  # MHA
    "llama-2-70b": 80 * 2 * 8 * 128 * 2,  # GQA 64/8
    "llama-3-8b": 32 * 2 * 8 * 128 * 2,  # GQA 32/8
    "llama-3-70b": 80 * 2 * 8 * 128 * 2,  # GQA 64/8
    "llama-3.1-405b": 126 * 2 * 8 * 128 * 2,  # GQA 128/8, 16384 / 128 = 128
    "mistral-7b": 32 * 2 * 8 * 128 * 2,  # GQA 32/8 (window caps the sequence, not this)
    "mixtral-8x7b": 32 * 2 * 8 * 128 * 2,  # GQA 32/8
    "qwen2.5-7b": 28 * 2 * 4 * 128 * 2,  # GQA 28/4, 3584 / 28 = 128
    "qwen2.5-72b": 80 * 2 * 8 * 128 * 2,  # GQA 64/8
    "qwen2.5-7b-1m": 28 * 2 * 4 * 128 * 2,  # Qwen2.5-7B's shapes, 1,010,000-token context
    "gemma-2-9b": 42 * 2 * 8 * 256 * 2,  # GQA 16/8, explicit head_dim 256
    "deepseek-v3": 61 * (512 + 64) * 2,  # MLA: latent 512 + rope key 64 per layer
    "deepseek-r1": 61 * (512 + 64) * 2,  # the V3 architecture
    "deepseek-v3.1": 61 * (512 + 64) * 2,
    "llama-3.1-8b": 32 * 2 * 8 * 128 * 2,  # GQA 32/8
    "llama-3.1-70b": 80 * 2 * 8 * 128 * 2,  # GQA 64/8
    "llama-3.3-70b": 80 * 2 * 8 * 128 * 2,
    "qwen3-8b": 36 * 2 * 8 * 128 * 2,  # GQA 32/8, head_dim 128
    "qwen3-32b": 64 * 2 * 8 * 128 * 2,  # GQA 64/8, head_dim 128 (not 5120/64 = 80)
    "qwen3-30b-a3b": 48 * 2 * 4 * 128 * 2,  # MoE: KV is attention's only, GQA 32/4
    "qwen3-235b-a22b": 94 * 2 * 4 * 128 * 2,  # GQA 64/4
    "gpt-oss-20b": 24 * 2 * 8 * 64 * 2,  # per token, before the 128-token window caps half
    "gpt-oss-120b": 36 * 2 * 8 * 64 * 2,
    # 12 of 48 layers are full attention (GQA 16/2, head_dim 256); 36 Gated DeltaNet
    # layers keep a fixed state per request instead of KV
    "qwen3-next-80b-a3b": 12 * 2 * 2 * 256 * 2,
    # Nemotron-H: 4 of 52 layers are attention (GQA 32/8 x 128); 24 Mamba2 layers keep a
    # state per request, 24 MLP layers keep nothing
    "nemotron-h-8b": 4 * 2 * 8 * 128 * 2,
    "mistral-small": 40 * 2 * 8 * 128 * 2,
    "mistral-large": 88 * 2 * 8 * 128 * 2,
    "gemma-3-27b": 62 * 2 * 16 * 128 * 2,  # GQA 32/16; 52 of 62 layers slide over 1024
}

#: (sliding layers, window) of the hybrid-attention models: what caps their KV.
HYBRID = {"gemma-2-9b": (21, 4096), "gemma-3-27b": (52, 1024), "gpt-oss-20b": (12, 128),
          "gpt-oss-120b": (18, 128), "mistral-7b": (32, 4096)}


def test_catalog_has_every_required_model_and_nothing_unchecked():
    assert set(list_models()) == set(HAND_BYTES_PER_TOKEN_FP16)


@pytest.mark.parametrize("name", sorted(HAND_BYTES_PER_TOKEN_FP16))
def test_bytes_per_token_fp16_matches_hand_derivation(name):
    model = load_model(name)
    assert kv_bytes_per_token(model, "fp16") == HAND_BYTES_PER_TOKEN_FP16[name]
    assert kv_bytes_per_token(model, "bf16") == HAND_BYTES_PER_TOKEN_FP16[name]
    assert kv_bytes_per_token(model, "fp32") == 2 * HAND_BYTES_PER_TOKEN_FP16[name]
    assert kv_bytes_per_token(model, "fp8") == HAND_BYTES_PER_TOKEN_FP16[name] // 2
    assert block_bytes(model, 16) == 16 * HAND_BYTES_PER_TOKEN_FP16[name]
    assert model.source.startswith("https://huggingface.co/") and model.source.endswith(
        "/config.json")


def test_issue_anchor_values():
    assert kv_bytes_per_token(load_model("opt-13b")) == 819_200 == 2 * 40 * 5120 * 2
    llama = load_model("llama-3-8b")
    assert llama.attention == "gqa" and llama.num_kv_heads == 8
    assert kv_bytes_per_token(llama, "bf16") == 131_072
    assert default_kv_dtype(llama) == "bf16" and kv_bytes_per_token(llama, "auto") == 131_072
    assert kv_bytes_for_tokens(llama, 128_000, "bf16") == 16_777_216_000  # 16.78 GB
    # per-head MHA arithmetic (32 heads each with K and V) would give 4x as much
    assert mha_equivalent_bytes_per_token(llama, "bf16") == 32 * 2 * 32 * 128 * 2 == 524_288


def test_deepseek_v3_mla_is_far_below_its_head_count():
    ds = load_model("deepseek-v3")
    assert (ds.attention, ds.kv_lora_rank, ds.qk_rope_head_dim) == ("mla", 512, 64)
    assert kv_bytes_per_layer_token(ds, "bf16") == (512 + 64) * 2 == 1152
    assert kv_bytes_per_token(ds, "bf16") == 70_272
    # 128 heads, K of 192 (128 nope + 64 rope) and V of 128 per head, 61 layers, bf16
    assert mha_equivalent_bytes_per_token(ds, "bf16") == 61 * 128 * (192 + 128) * 2 == 4_997_120
    assert default_kv_dtype(ds) == "bf16"  # fp8 weights, bf16 activations


def test_quantized_dtypes_carry_their_scale_overhead():
    llama = load_model("llama-3-8b")
    # int8: 128 one-byte elements + 4 bytes (fp16 scale + zero) per vector
    assert kv_bytes_per_token(llama, "int8") == 32 * 2 * 8 * (128 + 4) == 67_584
    # int4: 128 half-byte elements = 64 bytes + 4
    assert kv_bytes_per_token(llama, "int4") == 32 * 2 * 8 * (64 + 4) == 34_816
    assert kv_bytes_per_token(llama, "fp8_e4m3") == kv_bytes_per_token(llama, "fp8_e5m2") \
        == 32 * 2 * 8 * 128
    ds = load_model("deepseek-v3")
    assert kv_bytes_per_token(ds, "int4") == 61 * (576 // 2 + 4) == 17_812
    est = estimate_kv(llama, prompt_tokens=16, generated_tokens=0, kv_dtype="int8")
    assert any("scale" in w for w in est.warnings)


def test_sliding_windows_cap_the_sequence():
    mistral = load_model("mistral-7b")
    assert mistral.layer_types == ("sliding",) * 32 and mistral.sliding_window == 4096
    assert kv_bytes_for_tokens(mistral, 1000) == 1000 * 131_072
    assert kv_bytes_for_tokens(mistral, 10_000) == 4096 * 131_072  # every layer capped
    gemma = load_model("gemma-2-9b")
    assert gemma.layer_types[:4] == ("sliding", "full", "sliding", "full")
    assert gemma.num_sliding_layers == gemma.num_full_layers == 21
    per_layer = 2 * 8 * 256 * 2
    assert kv_bytes_for_tokens(gemma, 8000) == per_layer * (21 * 8000 + 21 * 4096)
    for name in ("mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b", "llama-3-8b"):
        assert load_model(name).sliding_window is None


def test_gemma_paged_blocks_free_what_left_the_window():
    est = estimate_kv("gemma-2-9b", prompt_tokens=8000, generated_tokens=100,
                      block_size_tokens=16, kv_dtype="bf16")
    full_blocks = -(-8100 // 16)  # 507
    sliding_blocks = full_blocks - (8100 - 4096) // 16  # 507 - 250 = 257
    assert sliding_blocks == 257
    assert est.paged_blocks == full_blocks == 507
    assert est.paged_layer_blocks == 21 * 507 + 21 * 257 == 16_044
    assert est.paged_bytes == 16_044 * 16 * 8192
    assert est.exact_bytes == 8192 * (21 * 8100 + 21 * 4096)
    assert est.naive_bytes == 8192 * (21 * 8192 + 21 * 4096)  # max_seq_len = 8192


def test_paged_vs_naive_and_fragmentation_exact():
    est = estimate_kv("llama-3-8b", prompt_tokens=1000, generated_tokens=0,
                      block_size_tokens=16, concurrency=10, max_seq_len=8192, kv_dtype="bf16")
    assert est.request_tokens == 1000
    assert est.paged_blocks == 63
    assert est.exact_bytes == 1000 * 131_072 == 131_072_000
    assert est.paged_bytes == 63 * 16 * 131_072 == 132_120_576
    assert est.fragmentation_bytes == 8 * 131_072
    assert est.naive_bytes == 8192 * 131_072 == 1_073_741_824
    assert est.total_paged_bytes == 10 * 132_120_576
    assert est.total_naive_bytes == 10 * 1_073_741_824
    assert est.sequences_per_gb_paged == pytest.approx(1e9 / 132_120_576)
    assert est.sequences_per_gb_naive == pytest.approx(1e9 / 1_073_741_824)
    assert est.paged_vs_naive_ratio == pytest.approx(8192 / 1008)
    assert est.fits_sequences is None and "fits_sequences" not in est.to_dict()


def test_gpu_fit_beside_the_weights():
    est = estimate_kv("llama-3-8b", prompt_tokens=1024, generated_tokens=0, gpu="h100-sxm",
                      concurrency=500)
    memory = 81_559 * 2**20  # nvidia-smi total of an H100 80GB HBM3
    weights = 8_030_261_248 * 2  # bf16
    assert est.gpu_memory_bytes == memory and est.weights_bytes == weights
    assert est.kv_budget_bytes == int(memory * 0.9) - weights == 60_908_206_489
    assert est.fits_sequences == 60_908_206_489 // (64 * 2_097_152) == 453
    assert est.fits_concurrency is False
    est = estimate_kv("llama-3-8b", prompt_tokens=1024, generated_tokens=0, gpu_mem_gb=80,
                      weights_dtype="fp8", memory_utilization=1.0)
    assert est.kv_budget_bytes == 80 * 10**9 - 8_030_261_248
    assert est.fits_sequences == (80 * 10**9 - 8_030_261_248) // 134_217_728
    assert est.to_dict()["fits_sequences"] == est.fits_sequences


def test_weights_that_do_not_fit_give_zero_and_a_warning():
    est = estimate_kv("deepseek-v3", prompt_tokens=100, generated_tokens=0, gpu="h200")
    assert est.weights_bytes == 671 * 10**9 and est.fits_sequences == 0
    assert any("do not fit" in w for w in est.warnings)


@pytest.mark.parametrize("name", sorted(HAND_BYTES_PER_TOKEN_FP16))
def test_spec_invariants_and_parameter_counts(name):
    m = load_model(name)
    assert len(m.layer_types) == m.num_layers
    assert set(m.layer_types) <= {"full", "sliding", "linear", "mlp"}
    assert ("linear" in m.layer_types) == (m.linear_state_bytes > 0)
    assert ("sliding" in m.layer_types) == (m.sliding_window is not None)
    assert (m.attention == "mla") == (m.kv_lora_rank > 0)
    assert 0 < m.num_active_params <= m.num_params
    counted = estimate_num_params(m.config)
    if name.startswith(("deepseek", "qwen3-next")):
        assert counted is None  # published figures, not counted
    else:  # the catalog's published counts re-derived from the config's tensor shapes
        assert counted == (m.num_params, m.num_active_params)


def test_catalog_entry_and_its_config_json_give_the_same_spec(tmp_path):
    for name in list_models():
        spec = load_model(name)
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(spec.config))
        from_file = load_model(str(path))
        assert load_model(str(path.parent)).name == name  # a snapshot folder works too
        for attr in ("num_layers", "num_kv_heads", "head_dim", "attention", "layer_types",
                     "sliding_window", "kv_lora_rank", "qk_rope_head_dim"):
            assert getattr(from_file, attr) == getattr(spec, attr), (name, attr)
        assert kv_bytes_per_token(from_file) == kv_bytes_per_token(spec)


def _write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_config_styles(tmp_path):
    base = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
            "hidden_size": 512}
    mqa = load_model(_write(tmp_path, {**base, "num_key_value_heads": 1}))
    assert mqa.attention == "mqa" and kv_bytes_per_token(mqa) == 4 * 2 * 1 * 64 * 2
    mha = load_model(_write(tmp_path, base))  # no num_key_value_heads: MHA
    assert mha.attention == "mha" and mha.num_kv_heads == 8
    typed = load_model(_write(tmp_path, {**base, "sliding_window": 128, "layer_types": [
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"]}))
    assert typed.layer_types == ("sliding", "full", "sliding", "full")
    assert kv_bytes_for_tokens(typed, 1000) == 2 * 8 * 64 * 2 * (2 * 1000 + 2 * 128)
    qwen = load_model(_write(tmp_path, {**base, "model_type": "qwen2", "sliding_window": 64,
                                        "use_sliding_window": True, "max_window_layers": 3}))
    assert qwen.layer_types == ("full", "full", "full", "sliding")
    gemma3 = load_model(_write(tmp_path, {**base, "num_hidden_layers": 6, "sliding_window": 32,
                                          "sliding_window_pattern": 3}))
    assert gemma3.layer_types == ("sliding", "sliding", "full") * 2


@pytest.mark.parametrize("drop, field_name", [
    ("num_hidden_layers", "num_hidden_layers"),
    ("num_attention_heads", "num_attention_heads"),
    ("hidden_size", "hidden_size"),
])
def test_config_missing_field_names_it(tmp_path, drop, field_name):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
           "hidden_size": 512}
    del cfg[drop]
    path = _write(tmp_path, cfg)
    with pytest.raises(KvsimInputError) as err:
        load_model(path)
    assert err.value.field == field_name and str(err.value).startswith(path)


def test_config_bad_values_name_the_field(tmp_path):
    cases = [
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),  # MLA needs the rope width
        ({"hidden_size": 500}, "head_dim"),  # 500 / 8 heads is not whole
        ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 8 % 3 != 0
        ({"layer_types": ["full_attention"]}, "layer_types"),  # wrong length
        ({"layer_types": ["sliding_attention"] * 4}, "sliding_window"),  # no window given
        ({"sliding_window": -5}, "sliding_window"),
    ]
    for extra, field_name in cases:
        cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
               "hidden_size": 512, **extra}
        with pytest.raises(KvsimInputError) as err:
            load_model(_write(tmp_path, cfg))
        assert err.value.field == field_name, extra
    with pytest.raises(KvsimInputError, match="no such file"):
        load_model(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(KvsimInputError, match="line 1"):
        load_model(str(tmp_path / "broken.json"))


def test_unknown_model_lists_close_matches():
    with pytest.raises(KvsimInputError) as err:
        load_model("llama3-8b")
    assert "did you mean llama-3-8b" in str(err.value) and "\n" not in str(err.value)


def test_bad_estimate_inputs():
    with pytest.raises(KvsimInputError, match="max_seq_len"):
        estimate_kv("llama-3-8b", prompt_tokens=100, generated_tokens=0, max_seq_len=50)
    with pytest.raises(KvsimInputError, match="kv_dtype"):
        estimate_kv("llama-3-8b", prompt_tokens=100, generated_tokens=0, kv_dtype="int3")
    with pytest.raises(KvsimInputError, match="gpu"):
        estimate_kv("llama-3-8b", prompt_tokens=1, generated_tokens=0, gpu="h100-sxm",
                    gpu_mem_gb=80)
    with pytest.raises(KvsimInputError, match="block_size_tokens"):
        estimate_kv("llama-3-8b", prompt_tokens=1, generated_tokens=0, block_size_tokens=0)
    with pytest.raises(KvsimInputError, match="weights_dtype"):
        estimate_kv("llama-3-8b", prompt_tokens=1, generated_tokens=0, gpu_mem_gb=80,
                    weights_dtype="fp64")


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(sorted(HAND_BYTES_PER_TOKEN_FP16)),
       n=st.integers(1, 300_000), block=st.sampled_from([1, 8, 16, 32, 128]))
def test_paged_bounds_hold_for_any_length(name, n, block):
    m = load_model(name)
    est = estimate_kv(m, prompt_tokens=n, generated_tokens=0, block_size_tokens=block)
    block = est.block_size_tokens  # a linear-attention hybrid's block is raised (vLLM)
    state = m.num_linear_layers * m.linear_state_bytes
    assert est.exact_bytes <= est.paged_bytes
    assert est.exact_bytes <= n * kv_bytes_per_token(m) + state
    # at most one partly filled block per layer (sliding layers: one at each window edge;
    # linear layers: the state page's padding)
    slack_blocks = m.num_full_layers + 2 * m.num_sliding_layers + m.num_linear_layers
    slack_bytes = slack_blocks * block * kv_bytes_per_layer_token(m)
    assert est.paged_bytes - est.exact_bytes < slack_bytes
    if m.sliding_window is None or n <= m.sliding_window:
        # (naive reserves max_seq_len tokens; when that is not a multiple of the block, a
        # length in the last partial block pages up to one block past it)
        assert est.paged_bytes <= est.naive_bytes or n > est.max_seq_len - block
    else:
        # a naive ring buffer holds exactly the window; paging may hold a partial block
        # at each edge of it, so paged can exceed naive by less than the slack
        assert est.paged_bytes - est.naive_bytes < slack_bytes
    assert kv_bytes_for_tokens(m, n + 1) >= kv_bytes_for_tokens(m, n)


def test_tensor_parallel_splits_weights_and_kv_heads():
    est = estimate_kv("llama-3.1-405b", prompt_tokens=4000, generated_tokens=96,
                      gpu="h100-sxm", tensor_parallel_size=8, weights_dtype="fp8")
    # 8 KV heads over 8 GPUs: one head (K and V, 128 x 2 bytes each) per layer per GPU
    assert est.paged_bytes_per_gpu == 256 * 16 * 126 * (2 * 1 * 128 * 2) == 264_241_152
    assert est.paged_bytes == 8 * est.paged_bytes_per_gpu
    budget = int(81_559 * 2**20 * 0.9) - 405_853_388_800 // 8
    assert est.kv_budget_bytes == budget == 26_237_055_385
    assert est.fits_sequences == budget // 264_241_152 == 99
    # MLA: the latent is replicated on every GPU, not split
    ds = estimate_kv("deepseek-v3", prompt_tokens=4000, generated_tokens=96, gpu="h200",
                     tensor_parallel_size=8)
    assert ds.paged_bytes_per_gpu == ds.paged_bytes == 256 * 16 * 70_272
    assert ds.kv_budget_bytes == int(143_771 * 2**20 * 0.9) - 671 * 10**9 // 8
    # more GPUs than KV heads: each GPU keeps one KV head (replicated)
    llama = load_model("llama-3-8b")
    assert kv_bytes_per_layer_token_per_gpu(llama, "bf16", 16) == 2 * 1 * 128 * 2
    assert kv_bytes_per_layer_token_per_gpu(llama, "bf16", 2) == 2 * 4 * 128 * 2
    with pytest.raises(KvsimInputError, match="tensor_parallel_size"):
        estimate_kv(llama, prompt_tokens=1, generated_tokens=0, tensor_parallel_size=3)
    with pytest.raises(KvsimInputError, match="tensor_parallel_size"):
        kv_bytes_per_layer_token_per_gpu(load_model("qwen2.5-7b"), "bf16", 7)  # 4 KV heads


def test_recent_config_styles(tmp_path):
    # Qwen3 style: explicit head_dim (128) differs from hidden / heads (1024 / 16 = 64)
    qwen3 = load_model(_write(tmp_path, {
        "model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024,
        "sliding_window": None, "use_sliding_window": False, "max_window_layers": 28}))
    assert qwen3.layer_types == ("full",) * 28
    assert kv_bytes_per_token(qwen3, "bf16") == 28 * 2 * 8 * 128 * 2
    assert qwen3.num_params == 0  # layout kvsim does not count: fit needs num_params
    with pytest.raises(KvsimInputError, match="num_params"):
        estimate_kv(qwen3, prompt_tokens=10, generated_tokens=0, gpu_mem_gb=24)
    # gpt-oss style: declared layer_types alternating a 128-token window with full layers
    oss = load_model(_write(tmp_path, {
        "model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2}))
    assert kv_bytes_for_tokens(oss, 1000, "bf16") == 2 * 8 * 64 * 2 * (2 * 1000 + 2 * 128)
    # DeepSeek-V2-Lite style MLA: no q_lora_rank, latent 512 + rope 64
    lite = load_model(_write(tmp_path, {
        "model_type": "deepseek_v2", "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_key_value_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128}))
    assert lite.attention == "mla" and kv_bytes_per_token(lite, "bf16") == 27 * 576 * 2
    # a user-supplied parameter count makes the GPU fit possible
    counted = load_model(_write(tmp_path, {
        "model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024,
        "num_params": 596_049_920}))
    est = estimate_kv(counted, prompt_tokens=10, generated_tokens=0, gpu_mem_gb=24,
                      memory_utilization=1.0)
    assert est.weights_bytes == 596_049_920 * 2  # served in fp16: no torch_dtype given


@pytest.mark.parametrize("name", sorted(HAND_BYTES_PER_TOKEN_FP16))
def test_hybrid_attention_layers_and_window(name):
    m = load_model(name)
    assert (m.num_sliding_layers, m.sliding_window) == HYBRID.get(name, (0, None))


def test_hybrid_models_cap_sliding_layers_at_the_window():
    """gpt-oss-20b at 100,000 tokens: 12 full layers hold every token, 12 sliding layers
    only the last 128."""
    m = load_model("gpt-oss-20b")
    per_layer = 2 * 8 * 64 * 2
    assert kv_bytes_for_tokens(m, 100_000) == per_layer * (12 * 100_000 + 12 * 128)
    gemma = load_model("gemma-3-27b")
    assert gemma.layer_types[:6] == ("sliding",) * 5 + ("full",)
    assert gemma.config["vocab_size"] == 262_208  # transformers' default: config omits it


def test_layer_groups_of_a_hybrid_model_exact():
    """gpt-oss-20b: 12 full-attention and 12 sliding layers (window 128), 8 KV heads of 64,
    bf16: 2 * 8 * 64 * 2 = 2,048 B per layer and token.  1,000 tokens in 16-token blocks:
    63 blocks; a sliding layer keeps only the blocks overlapping tokens 872..999, blocks
    54..62 = 9 (vLLM's SlidingWindowManager frees the 54 wholly outside the window)."""
    from kvsim.spec.kvsize import estimate_kv

    est = estimate_kv("gpt-oss-20b", prompt_tokens=1000, generated_tokens=0,
                      kv_dtype="bf16")
    full, window = est.groups
    assert full == {"kind": "full_attention", "layers": 12, "window_tokens": None,
                    "bytes_per_token": 12 * 2048, "blocks_held": 63,
                    "exact_bytes": 12 * 2048 * 1000, "paged_bytes": 12 * 2048 * 63 * 16}
    assert window == {"kind": "sliding_window", "layers": 12, "window_tokens": 128,
                      "bytes_per_token": 12 * 2048, "blocks_held": 9,
                      "exact_bytes": 12 * 2048 * 128, "paged_bytes": 12 * 2048 * 9 * 16}
    assert full["exact_bytes"] + window["exact_bytes"] == est.exact_bytes
    assert full["paged_bytes"] + window["paged_bytes"] == est.paged_bytes
    dense = estimate_kv("llama-3-8b", prompt_tokens=100, generated_tokens=0)
    assert [g["kind"] for g in dense.groups] == ["full_attention"]
    assert dense.to_dict()["groups"][0]["paged_bytes"] == dense.paged_bytes


def test_linear_attention_hybrid_groups_exact():
    """Qwen3-Next-80B-A3B: 12 full-attention layers (2 KV heads of 256, bf16: 2,048 B per
    layer and token) and 36 Gated DeltaNet layers, each with one state per request: conv
    (2 * 16 * 128 + 32 * 128) x 3 + recurrent 32 x 128 x 128, bf16 = 1,097,728 B.  vLLM
    raises the block to 16 * cdiv(1,097,728, 16 * 2,048) = 544 tokens and pads the state
    page to 544 * 2,048 = 1,114,112 B (Platform._align_hybrid_block_size)."""
    from kvsim.spec.kvsize import estimate_kv, hybrid_block_size

    m = load_model("qwen3-next-80b-a3b")
    assert (m.num_full_layers, m.num_linear_layers, m.linear_state_bytes) == (12, 36, 1097728)
    assert m.layer_types[:4] == ("linear", "linear", "linear", "full")
    assert hybrid_block_size(m, 16, "bf16") == 544
    assert hybrid_block_size(m, 1024, "bf16") == 1024
    assert hybrid_block_size(load_model("gpt-oss-20b"), 16, "bf16") == 16
    est = estimate_kv(m, prompt_tokens=1000, generated_tokens=0, kv_dtype="bf16")
    assert est.block_size_tokens == 544
    assert any("raised from 16 to 544" in w for w in est.warnings)
    full, linear = est.groups
    assert full == {"kind": "full_attention", "layers": 12, "window_tokens": None,
                    "bytes_per_token": 12 * 2048, "blocks_held": 2,
                    "exact_bytes": 12 * 2048 * 1000, "paged_bytes": 12 * 2048 * 2 * 544}
    assert linear == {"kind": "linear_attention", "layers": 36, "window_tokens": None,
                      "bytes_per_token": 0, "blocks_held": 1,
                      "state_bytes_per_layer": 1097728, "exact_bytes": 36 * 1097728,
                      "paged_bytes": 36 * 544 * 2048}
    assert est.exact_bytes == full["exact_bytes"] + linear["exact_bytes"]
    assert est.paged_bytes == full["paged_bytes"] + linear["paged_bytes"]
