"""``kvsim estimate-kv``: KV-cache footprint of a model, paged vs naive (API: kvsim.spec.kvsize)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.common import JsonOption, check_limit, emit_json, out_console
from kvsim.core.errors import KvsimInputError
from kvsim.spec.hardware import list_hardware
from kvsim.spec.kvsize import (
    BYTES_PER_GB,
    BYTES_PER_MIB,
    DEFAULT_MEMORY_UTILIZATION,
    KV_DTYPES,
    KvEstimate,
    estimate_kv,
)
from kvsim.spec.models import WEIGHT_DTYPE_BYTES, list_models, load_model

_KV_DTYPE_HELP = ("KV-cache element type: auto (the model's activation dtype, as vLLM "
                  "--kv-cache-dtype auto), " + ", ".join(KV_DTYPES) +
                  ". int8/int4 add a 4-byte fp16 scale + zero point per stored vector "
                  "(per token, KV head, K/V); fp8 scales are per tensor (no per-token bytes).")


def _size_row(table: Table, label: str, nbytes: int | None, note: str = "") -> None:
    if nbytes is None:
        return
    table.add_row(label, f"{nbytes:,}", f"{nbytes / 1e6:,.2f}", f"{nbytes / BYTES_PER_MIB:,.2f}",
                  note)


def _render(est: KvEstimate) -> None:
    from kvsim.cli.render import print_view

    lines: list = []
    head = (f"[bold]{est.model}[/bold]  attention={est.attention}  kv_dtype={est.kv_dtype}  "
            f"block={est.block_size_tokens} tokens  request={est.prompt_tokens}+"
            f"{est.generated_tokens}={est.request_tokens} tokens  "
            f"max_seq_len={est.max_seq_len}  concurrency={est.concurrency}"
            + (f"  tensor_parallel={est.tensor_parallel_size}" if est.tensor_parallel_size > 1
               else ""))
    lines.append(head)
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD)
    for col, justify in (("quantity", "left"), ("bytes", "right"), ("MB (10^6)", "right"),
                         ("MiB (2^20)", "right"), ("note", "left")):
        table.add_column(col, justify=justify)
    _size_row(table, "per token (all layers)", est.bytes_per_token,
              f"{est.bytes_per_layer_token:,} B per layer")
    _size_row(table, "per token if MHA", est.mha_equivalent_bytes_per_token,
              "every query head with its own K and V")
    _size_row(table, "per block", est.block_bytes, f"{est.block_size_tokens} tokens")
    _size_row(table, "request: exact", est.exact_bytes,
              f"{est.num_sliding_layers} sliding layers capped at {est.sliding_window} tokens"
              if est.sliding_window else "")
    _size_row(table, "request: paged", est.paged_bytes,
              f"{est.paged_blocks} blocks; fragmentation {est.fragmentation_bytes:,} B "
              f"({est.fragmentation_fraction:.2%})")
    if len(est.groups) > 1:  # a hybrid model: its layer groups (vLLM's hybrid manager)
        for g in est.groups:
            if g["kind"] == "linear_attention":
                _size_row(table, f"  group linear state ({g['layers']} layers)",
                          g["paged_bytes"], f"1 state block per layer (padded); state "
                          f"{g['state_bytes_per_layer']:,} B per layer")
                continue
            what = ("full attention" if g["window_tokens"] is None
                    else f"window {g['window_tokens']:,}")
            _size_row(table, f"  group {what} ({g['layers']} layers)", g["paged_bytes"],
                      f"{g['blocks_held']} blocks held per layer; exact "
                      f"{g['exact_bytes']:,} B")
    if est.draft_layers:
        _size_row(table, f"  of which MTP draft layers ({est.draft_layers})",
                  est.draft_layers * est.bytes_per_layer_token,
                  f"per token; --spec-method {est.spec_method}, "
                  f"{est.num_speculative_tokens} drafts")
    _size_row(table, "request: naive", est.naive_bytes,
              f"max_seq_len reserved; {est.naive_waste_fraction:.2%} unused")
    _size_row(table, f"total paged (x{est.concurrency})", est.total_paged_bytes)
    _size_row(table, f"total naive (x{est.concurrency})", est.total_naive_bytes)
    if est.tensor_parallel_size > 1:
        _size_row(table, "request: paged per GPU", est.paged_bytes_per_gpu,
                  f"on each of {est.tensor_parallel_size} GPUs")
    _size_row(table, "weights", est.weights_bytes, f"{est.weights_dtype}" if est.weights_dtype
              else "")
    _size_row(table, "KV budget", est.kv_budget_bytes,
              (f"per GPU: {est.memory_utilization} x GPU memory - weights / "
               f"{est.tensor_parallel_size}; vLLM makes {est.vllm_num_gpu_blocks:,} "
               "blocks of it") if est.memory_utilization else "")
    lines.append(table)
    lines.append(f"sequences per GB: paged {est.sequences_per_gb_paged:,.3f}, naive "
                      f"{est.sequences_per_gb_naive:,.3f} (paged fits "
                      f"{est.paged_vs_naive_ratio:,.2f}x as many)")
    if est.fits_sequences is not None:
        verdict = "fits" if est.fits_concurrency else "does NOT fit"
        group = f"{est.tensor_parallel_size} x " if est.tensor_parallel_size > 1 else ""
        lines.append(f"{group}{est.gpu} ({est.gpu_memory_bytes / BYTES_PER_GB:,.2f} GB): "
                          f"{est.fits_sequences:,} sequences fit paged, "
                          f"{est.fits_sequences_naive:,} naive; concurrency "
                          f"{est.concurrency} {verdict}")
    for warning in est.warnings:
        lines.append(f"note: {warning}")
    print_view(*lines)


_GEOMETRY_HELP = ("kv_deadline_scheduler's geometry option (instead of a MODEL): the "
                  "config.json field ")


@app.command("estimate-kv")
def estimate_kv_command(
    model: Annotated[str | None, typer.Argument(
        help="Catalog model name: " + ", ".join(list_models()) + ".", show_default=False)]
    = None,
    model_opt: Annotated[str | None, typer.Option(
        "--model", metavar="NAME", help="The catalog model, as an option (kv_deadline_"
        "scheduler's spelling; same as the MODEL argument).", show_default=False)] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="A Hugging Face config.json (or a model folder holding one) to "
        "read instead of a catalog name.",
        show_default=False)] = None,
    prompt_tokens: Annotated[int, typer.Option(
        "--prompt-tokens", min=0, help="Prompt tokens per request.")] = 1024,
    generated_tokens: Annotated[int, typer.Option(
        "--generated-tokens", min=0, help="Generated (decode) tokens per request.")] = 0,
    block_size: Annotated[int, typer.Option(
        "--block-size", min=1, help="Tokens per KV block (vLLM default 16).")] = 16,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", min=1, help="Requests resident at once (totals multiply by it; "
        "no prefix sharing assumed).")] = 1,
    max_seq_len: Annotated[int | None, typer.Option(
        "--max-seq-len", min=1, help="Tokens a naive allocator reserves per request "
        "(default: the model's max_position_embeddings, or the request if longer).",
        show_default=False)] = None,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help=_KV_DTYPE_HELP)] = "auto",
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="Hardware profile name (" + ", ".join(list_hardware()) + ") or a "
        "profile .toml path; reports how many sequences fit beside the weights, using the "
        "profile's gpu_memory_bytes.", show_default=False)] = None,
    gpu_mem_gb: Annotated[float | None, typer.Option(
        "--gpu-mem-gb", help="GPU memory in GB (10^9 bytes), instead of --gpu.",
        show_default=False)] = None,
    weights_dtype: Annotated[str | None, typer.Option(
        "--weights-dtype", help="dtype of the weights for the fit (" +
        ", ".join(WEIGHT_DTYPE_BYTES) + "; default: the dtype the model is served in, "
        "from the catalog).",
        show_default=False)] = None,
    tensor_parallel_size: Annotated[int, typer.Option(
        "--tensor-parallel-size", "--tp", min=1, help="GPUs the model is split over (vLLM "
        "--tensor-parallel-size): weights and KV heads are divided among them (an MLA "
        "latent is replicated on each); the fit is per GPU.")] = 1,
    memory_utilization: Annotated[float, typer.Option(
        "--memory-utilization", help="Fraction of GPU memory the engine may use for "
        "weights + KV (vLLM --gpu-memory-utilization).")] = DEFAULT_MEMORY_UTILIZATION,
    spec_method: Annotated[str, typer.Option(
        "--spec-method", metavar="none|ngram|mtp", help="Speculative decoding as vLLM "
        "sizes the KV cache (its --speculative-config method): mtp adds the model's "
        "multi-token-prediction layers (num_nextn_predict_layers, default 1) to every "
        "block; any method grows each Mamba / linear state by one conv row per draft and "
        "holds one more state block per draft.  docs/estimate-kv.md, \"Speculative "
        "decoding\".")] = "none",
    num_speculative_tokens: Annotated[int, typer.Option(
        "--num-speculative-tokens", min=0, help="Draft tokens per step (vLLM "
        "num_speculative_tokens); at least 1 with --spec-method mtp.")] = 0,
    list_models_flag: Annotated[bool, typer.Option(
        "--list-models", help="List the catalog models and exit.")] = False,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", min=1, hidden=True, help="kv_deadline_scheduler's name for "
        "--concurrency.", show_default=False)] = None,
    dtype_bytes: Annotated[int | None, typer.Option(
        "--dtype-bytes", hidden=True, help="kv_deadline_scheduler's KV width in bytes "
        "(1, 2, 4) = --kv-dtype fp8 / fp16 / fp32.", show_default=False)] = None,
    num_layers: Annotated[int | None, typer.Option(
        "--num-layers", min=1, hidden=True, show_default=False,
        help=_GEOMETRY_HELP + "num_hidden_layers.")] = None,
    hidden_size: Annotated[int | None, typer.Option(
        "--hidden-size", min=1, hidden=True, show_default=False,
        help=_GEOMETRY_HELP + "hidden_size.")] = None,
    num_attention_heads: Annotated[int | None, typer.Option(
        "--num-attention-heads", min=1, hidden=True, show_default=False,
        help=_GEOMETRY_HELP + "num_attention_heads.")] = None,
    num_kv_heads: Annotated[int | None, typer.Option(
        "--num-kv-heads", min=1, hidden=True, show_default=False,
        help=_GEOMETRY_HELP + "num_key_value_heads.")] = None,
    head_dim: Annotated[int | None, typer.Option(
        "--head-dim", min=1, hidden=True, show_default=False,
        help=_GEOMETRY_HELP + "head_dim.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Size the KV cache of a model: bytes per token and block, paged vs naive per request,
    totals for a concurrency, and how many sequences fit on a GPU beside the weights."""
    if list_models_flag:
        names = list_models()
        if as_json:
            emit_json(names)
        else:
            for name in names:
                out_console.print(name)
        return
    from kvsim.cli import compat

    if model is not None and model_opt is not None and model != model_opt:
        raise KvsimInputError(f"expected one model, got MODEL {model!r} and --model "
                              f"{model_opt!r}", None, None, "--model")
    model = model if model is not None else model_opt
    geometry = {"num_hidden_layers": num_layers, "hidden_size": hidden_size,
                "num_attention_heads": num_attention_heads, "num_key_value_heads": num_kv_heads,
                "head_dim": head_dim}
    given = {k: v for k, v in geometry.items() if v is not None}
    if batch_size is not None:
        concurrency = batch_size
    if dtype_bytes is not None:
        kv_dtype = compat.kv_dtype_for_bytes(dtype_bytes)
    check_limit("--prompt-tokens", prompt_tokens, "max_prompt_tokens")
    check_limit("--generated-tokens", generated_tokens, "max_output_tokens")
    check_limit("--max-seq-len", max_seq_len, "max_prompt_tokens")
    check_limit("--concurrency", concurrency, "max_concurrency")
    if given and (model is not None or config is not None):
        raise KvsimInputError("expected a MODEL, --config FILE, or the geometry options "
                              "(--num-layers ...), not both", None, None, "--num-layers")
    if given:
        spec = compat.spec_from_geometry(given)
    elif (model is None) == (config is None):
        raise KvsimInputError("expected exactly one of a MODEL name (or --model NAME) or "
                              "--config FILE", None, None, "model")
    else:
        spec = load_model(config if config is not None else model)
    est = estimate_kv(spec, prompt_tokens=prompt_tokens, generated_tokens=generated_tokens,
                      block_size_tokens=block_size, concurrency=concurrency,
                      max_seq_len=max_seq_len, kv_dtype=kv_dtype, gpu=gpu,
                      gpu_mem_gb=gpu_mem_gb, weights_dtype=weights_dtype,
                      memory_utilization=memory_utilization,
                      tensor_parallel_size=tensor_parallel_size, spec_method=spec_method,
                      num_speculative_tokens=num_speculative_tokens)
    if as_json:
        emit_json(est.to_dict())
    else:
        _render(est)
