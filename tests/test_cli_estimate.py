"""``kvsim estimate-kv`` through typer's CliRunner: JSON keys, table, errors, help."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()

JSON_KEYS = ("bytes_per_token", "block_bytes", "request_tokens", "paged_blocks", "paged_bytes",
             "naive_bytes", "total_paged_bytes", "total_naive_bytes", "sequences_per_gb_paged",
             "sequences_per_gb_naive")


def _json(args):
    result = runner.invoke(app, ["estimate-kv", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_keys_and_exact_values():
    data = _json(["opt-13b", "--prompt-tokens", "1000", "--generated-tokens", "30",
                  "--concurrency", "4", "--max-seq-len", "2048", "--kv-dtype", "fp16"])
    for key in JSON_KEYS:
        assert key in data
    assert "fits_sequences" not in data  # no GPU given
    assert data["bytes_per_token"] == 819_200
    assert data["block_bytes"] == 16 * 819_200
    assert data["request_tokens"] == 1030
    assert data["paged_blocks"] == 65  # ceil(1030 / 16)
    assert data["paged_bytes"] == 65 * 16 * 819_200
    assert data["naive_bytes"] == 2048 * 819_200
    assert data["total_paged_bytes"] == 4 * 65 * 16 * 819_200
    assert data["total_naive_bytes"] == 4 * 2048 * 819_200
    assert data["sequences_per_gb_paged"] == 1e9 / (65 * 16 * 819_200)
    assert data["sequences_per_gb_naive"] == 1e9 / (2048 * 819_200)


def test_gpu_gives_fits_sequences():
    data = _json(["llama-3-8b", "--prompt-tokens", "1024", "--gpu", "h100-sxm"])
    assert data["fits_sequences"] == 453  # see test_kvsize.test_gpu_fit_beside_the_weights
    data = _json(["llama-3-8b", "--prompt-tokens", "1024", "--gpu-mem-gb", "80",
                  "--weights-dtype", "fp8", "--memory-utilization", "1.0"])
    assert data["fits_sequences"] == (80 * 10**9 - 8_030_261_248) // 134_217_728
    data = _json(["llama-3.1-405b", "--prompt-tokens", "4000", "--generated-tokens", "96",
                  "--gpu", "h100-sxm", "--tp", "8", "--weights-dtype", "fp8"])
    assert (data["tensor_parallel_size"], data["paged_bytes_per_gpu"]) == (8, 264_241_152)
    assert data["fits_sequences"] == 99  # see test_kvsize.test_tensor_parallel_...


def test_config_file_and_list_models(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "hidden_size": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    data = _json(["--config", str(path), "--prompt-tokens", "16"])
    assert data["bytes_per_token"] == 131_072 and data["model"] == tmp_path.name
    names = _json(["--list-models"])
    assert "deepseek-v3" in names and "gemma-2-9b" in names


def test_table_shows_bytes_mb_and_mib():
    result = runner.invoke(app, ["estimate-kv", "llama-3-8b", "--prompt-tokens", "128000",
                                 "--kv-dtype", "bf16"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "MB (10^6)" in out and "MiB (2^20)" in out
    assert "131,072" in out and "16,777,216,000" in out and "16,777.22" in out
    assert "longer than the model's context" in out


def test_unknown_model_exits_2_with_close_matches():
    result = runner.invoke(app, ["estimate-kv", "llama-3-8", "--prompt-tokens", "10"])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "did you mean llama-3-8b" in lines[0]


def test_config_missing_field_exits_2_naming_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 256}))
    result = runner.invoke(app, ["estimate-kv", "--config", str(path), "--prompt-tokens", "1"])
    assert result.exit_code == 2
    assert "num_attention_heads" in result.stderr and str(path) in result.stderr


def test_model_and_config_are_exclusive(tmp_path):
    result = runner.invoke(app, ["estimate-kv", "--prompt-tokens", "1"])
    assert result.exit_code == 2 and "exactly one" in result.stderr


def test_help_documents_every_option():
    result = runner.invoke(app, ["estimate-kv", "--help"])
    assert result.exit_code == 0
    for option in ("--config", "--prompt-tokens", "--generated-tokens", "--block-size",
                   "--concurrency", "--max-seq-len", "--kv-dtype", "--gpu", "--gpu-mem-gb",
                   "--weights-dtype", "--memory-utilization", "--tensor-parallel-size", "--list-models", "--json"):
        assert option in result.stdout, option


def test_nemotron_h_and_mtp_json():
    """Nemotron-H: KV of the 4 attention layers only plus 24 Mamba2 states per request;
    --spec-method mtp adds DeepSeek-V3's MTP layer (docs/estimate-kv.md)."""
    data = _json(["nemotron-h-8b", "--prompt-tokens", "8192", "--gpu", "h100-sxm"])
    assert data["bytes_per_token"] == 16_384
    assert data["state_bytes_per_request"] == 102_137_856
    assert data["block_size_tokens"] == 1040
    assert (data["vllm_num_gpu_blocks"], data["fits_sequences"]) == (3566, 254)
    assert "spec_method" not in data
    mtp = _json(["deepseek-v3", "--prompt-tokens", "8192", "--gpu", "h200", "--tp", "8",
                 "--spec-method", "mtp", "--num-speculative-tokens", "1"])
    assert (mtp["spec_method"], mtp["num_speculative_tokens"], mtp["draft_layers"]) == \
        ("mtp", 1, 1)
    assert mtp["bytes_per_token"] == 62 * 1152
    assert (mtp["vllm_num_gpu_blocks"], mtp["fits_sequences"]) == (45_331, 88)
    result = runner.invoke(app, ["estimate-kv", "deepseek-v3", "--prompt-tokens", "8192",
                                 "--spec-method", "mtp", "--num-speculative-tokens", "1"])
    assert result.exit_code == 0 and "MTP draft layers (1)" in result.stdout
