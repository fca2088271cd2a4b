"""Per-token KV bytes, per-request Mamba state bytes and KV-cache block counts against vLLM
0.33.0's own functions (docs/estimate-kv.md, "Hybrid Mamba models", "MLA",
"Speculative decoding").

tests/fixtures/vllm_model_kv.json is bench/vllm/record_model_kv.py's recording, made in
vLLM's environment from kvsim's catalog configs: ``FullAttentionSpec`` /
``MLAAttentionSpec`` page sizes, the models' own ``get_mamba_state_shape_from_config`` /
``get_mamba_state_dtype_from_config`` (``MambaStateShapeCalculator.mamba2_state_shape``,
``gated_delta_net_state_shape``) as ``MambaSpec.page_size_bytes`` for 0..3 draft tokens,
and ``num_blocks`` from ``get_global_kv_cache_groups`` + ``get_kv_cache_configs`` with and
without the MTP drafter's layers.  Every number below must match exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.memory.hybrid import MAMBA, model_groups
from kvsim.spec.kvsize import (
    estimate_kv,
    kv_bytes_per_layer_token,
    kv_bytes_per_token,
    kv_cache_blocks,
    vllm_block_layout,
)
from kvsim.spec.models import linear_state_bytes, load_model, mtp_layers, with_speculative

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm_model_kv.json"
RECORDING = json.loads(FIXTURE.read_text())
MODELS = RECORDING["models"]
AVAILABLE = RECORDING["available_bytes"]


def test_recording_is_vllm_033_and_covers_the_three_models():
    assert RECORDING["vllm"].startswith("0.33")
    assert sorted(MODELS) == ["deepseek-v3", "nemotron-h-8b", "qwen3-next-80b-a3b"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_per_token_kv_bytes_equal_vllm_page_size(name):
    """One attention layer's bytes per token = vLLM's spec page at block size 1; the
    model's bytes per token count the attention layers only."""
    rec, m = MODELS[name], load_model(name)
    assert kv_bytes_per_layer_token(m, "auto") == rec["attn_page_1_token"]
    assert m.num_full_layers + m.num_sliding_layers == rec["attn_layers"]
    assert m.num_linear_layers == rec["linear_layers"]
    assert kv_bytes_per_token(m, "auto") == rec["attn_layers"] * rec["attn_page_1_token"]


def test_deepseek_v3_mla_is_one_latent_per_layer_as_vllm_mla_spec():
    """MLA: vLLM's MLAAttentionSpec holds one KV "head" of kv_lora_rank + qk_rope_head_dim
    per layer (no K/V split, no per-head copies): (512 + 64) x 2 B = 1,152 B per layer,
    x 61 layers = 70,272 B per token in bf16."""
    rec, m = MODELS["deepseek-v3"], load_model("deepseek-v3")
    assert rec["spec_class"] == "MLAAttentionSpec"
    assert rec["attn_page_1_token"] == (512 + 64) * 2 == 1152
    assert m.attention == "mla"
    assert kv_bytes_per_token(m, "bf16") == 61 * 1152 == 70_272
    est = estimate_kv("deepseek-v3", prompt_tokens=1000, generated_tokens=0, kv_dtype="auto")
    assert (est.bytes_per_layer_token, est.bytes_per_token) == (1152, 70_272)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_state_bytes_per_request_equal_vllm_mamba_spec(name):
    """Each linear layer's state = vLLM's MambaSpec page for the model's own state shapes
    and dtypes, with 0..3 speculative tokens (the conv state grows one row per draft)."""
    m = load_model(name)
    for st in MODELS[name]["state"]:
        assert linear_state_bytes(m, st["num_spec"]) == st["page_size_bytes"], st
    assert m.linear_state_bytes == MODELS[name]["state"][0]["page_size_bytes"]


def test_nemotron_h_mamba2_state_by_hand():
    """Nemotron-H-8B: conv (128 x 64 + 2 x 8 x 128) x (4 - 1) rows in bf16 = 61,440 B, SSM
    128 x 64 x 128 in float32 (vLLM NemotronH's default mamba_ssm_cache_dtype) =
    4,194,304 B: 4,255,744 B per Mamba2 layer, x 24 layers = 102,137,856 B per request."""
    rec = MODELS["nemotron-h-8b"]["state"][0]
    assert rec["shapes"] == [[3, 10240], [128, 64, 128]]
    assert rec["dtypes"] == ["bfloat16", "float32"]
    m = load_model("nemotron-h-8b")
    assert m.linear_state_kind == "mamba2"
    assert m.linear_state_bytes == 10240 * 3 * 2 + 128 * 64 * 128 * 4 == 4_255_744
    assert (m.num_full_layers, m.num_linear_layers, m.num_mlp_layers) == (4, 24, 24)
    est = estimate_kv("nemotron-h-8b", prompt_tokens=8192, generated_tokens=0, kv_dtype="auto")
    assert est.kv_dtype == "bf16"
    assert est.bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    assert est.state_bytes_per_request == 24 * 4_255_744 == 102_137_856
    assert est.exact_bytes == 16_384 * 8192 + 102_137_856
    assert est.block_size_tokens == 1040  # 16 x cdiv(4,255,744, 16 x 4,096)


def test_blis_style_all_layer_count_overstates_nemotron_h_13x():
    """BLIS (inference-sim #1552/#1558) sizes KV as num_layers x 2 x head_dim x kv_heads x
    bytes: 52 x 4,096 = 212,992 B per token against the 4 attention layers' 16,384 B."""
    m = load_model("nemotron-h-8b")
    blis = m.num_layers * 2 * 128 * 8 * 2
    assert blis == 212_992 and blis // kv_bytes_per_token(m, "bf16") == 13
    est = estimate_kv(m, prompt_tokens=1000, generated_tokens=0, gpu_mem_gb=80.0)
    per_layer_block = est.block_size_tokens * 4096
    assert est.kv_budget_blocks == est.kv_budget_bytes // (4 * per_layer_block)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_kv_cache_blocks_with_and_without_mtp_equal_vllm(name):
    """vLLM's num_blocks for 40 GB, for every recorded drafter: kvsim's layout (block size,
    layers per group) and block count, and the hybrid pool's groups, agree exactly."""
    m = load_model(name)
    for run in MODELS[name]["blocks"]:
        mm = with_speculative(m, run["method"], run["num_spec"])
        assert mm.num_layers - m.num_layers == run["draft_layers"]
        bs, size, _per_block = vllm_block_layout(mm, 16, "auto")
        assert (bs, size) == (run["block_size"], run["layers_per_group"]), run
        assert kv_cache_blocks(mm, AVAILABLE, 16, "auto") == run["num_blocks"], run
        groups, gsize, block_id_bytes = model_groups(mm, 16, "auto")
        assert (len(groups), gsize) == (run["num_groups"], run["layers_per_group"])
        assert AVAILABLE // block_id_bytes == run["num_blocks"]
        if m.num_linear_layers:
            assert sum(g.kind == MAMBA for g in groups) >= 1


def test_mtp_blocks_by_hand():
    """DeepSeek-V3: the MTP layer (num_nextn_predict_layers 1) is a 62nd MLA layer in every
    block: 40e9 // (61 x 16 x 1,152) = 35,576 blocks, with MTP 40e9 // (62 x 16 x 1,152) =
    35,002.  Qwen3-Next: the MTP layer is a 13th full-attention layer, so a group holds 13
    layers, not 12 (3 padding layers in the last Gated DeltaNet group): 40e9 // (12 x 544 x
    2,048) = 2,991 -> 40e9 // (13 x 544 x 2,048) = 2,761 with one draft; with two the
    state (conv 8,192 x 5 rows) raises the block to 560 tokens: 2,682."""
    ds = load_model("deepseek-v3")
    assert mtp_layers(ds) == 1
    assert kv_cache_blocks(ds, AVAILABLE, 16, "bf16") == 35_576
    assert kv_cache_blocks(with_speculative(ds, "mtp", 3), AVAILABLE, 16, "bf16") == 35_002
    qn = load_model("qwen3-next-80b-a3b")
    assert kv_cache_blocks(qn, AVAILABLE, 16, "bf16") == 2_991
    assert kv_cache_blocks(with_speculative(qn, "mtp", 1), AVAILABLE, 16, "bf16") == 2_761
    assert kv_cache_blocks(with_speculative(qn, "mtp", 2), AVAILABLE, 16, "bf16") == 2_682


def test_estimate_kv_mtp_fields_and_state_blocks():
    """--spec-method mtp: the draft layer joins the per-token bytes; each Gated DeltaNet
    layer holds 1 + k state blocks per request (vLLM MambaSpec.num_speculative_blocks)."""
    est = estimate_kv("qwen3-next-80b-a3b", prompt_tokens=1000, generated_tokens=0,
                      kv_dtype="bf16", spec_method="mtp", num_speculative_tokens=2)
    d = est.to_dict()
    assert (d["spec_method"], d["num_speculative_tokens"], d["draft_layers"]) == ("mtp", 2, 1)
    assert est.bytes_per_token == 13 * 2048
    assert est.block_size_tokens == 560
    full, linear = est.groups
    assert linear["blocks_held"] == 3 and linear["state_bytes_per_layer"] == 1_130_496
    assert linear["paged_bytes"] == 36 * 3 * 560 * 2048
    assert est.paged_bytes == full["paged_bytes"] + linear["paged_bytes"]
    assert est.exact_bytes == full["exact_bytes"] + linear["exact_bytes"]
    plain = estimate_kv("qwen3-next-80b-a3b", prompt_tokens=1000, generated_tokens=0)
    assert "spec_method" not in plain.to_dict() and plain.draft_layers == 0


def test_simulate_capacity_counts_mtp_layers():
    """EngineOptions(spec_method="mtp"): the closed loop's cost model and HBM pool include
    the MTP layer, as vLLM's num_gpu_blocks does."""
    from kvsim.engine.engine_model import build_cost_model
    from kvsim.modes.closed.closed_loop import EngineOptions, hbm_pool_blocks
    from kvsim.spec.sim_config import SimConfig

    config = SimConfig(mode="engine", hbm_gb=40.0, model="deepseek-v3")
    plain = build_cost_model("deepseek-v3", config.hardware)
    mtp = build_cost_model("deepseek-v3", config.hardware, spec_method="mtp")
    assert (plain.kv_bytes_per_token, mtp.kv_bytes_per_token) == (61 * 1152, 62 * 1152)
    assert hbm_pool_blocks(config, plain) == 35_576
    assert hbm_pool_blocks(config, mtp) == 35_002
    opts = EngineOptions(model="deepseek-v3", spec_method="mtp")
    assert opts.spec_lookahead and opts.identity()["spec_method"] == "mtp"
    assert "spec_method" not in EngineOptions().identity()


def test_bad_spec_method_is_one_line():
    from kvsim.core.errors import KvsimInputError

    with pytest.raises(KvsimInputError, match="spec_method"):
        estimate_kv("deepseek-v3", prompt_tokens=10, generated_tokens=0, spec_method="eagle")
    with pytest.raises(KvsimInputError, match="at least 1"):
        estimate_kv("deepseek-v3", prompt_tokens=10, generated_tokens=0, spec_method="mtp")
    with pytest.raises(KvsimInputError, match="MTP layers"):  # vLLM has no MTP drafter
        estimate_kv("llama-3-8b", prompt_tokens=10, generated_tokens=0, spec_method="mtp",
                    num_speculative_tokens=1)
    assert with_speculative(load_model("llama-3-8b"), "ngram", 3) == load_model("llama-3-8b")
