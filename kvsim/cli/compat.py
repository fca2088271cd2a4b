"""kv_deadline_scheduler (``kvmi``) compatibility: its option spellings, mapped to kvsim's.

kvmi users type ``--hbm-mb 4096 --dram-mb 65536``, ``estimate-kv --model llama-3-8b``,
``--decode-steps``, ``--logical-block-mb``.  Where kvsim has the concept the option is
accepted and converted (:func:`capacity_gb`, :func:`kv_dtype_for_bytes`); where it does not,
the option is accepted, ignored, and ONE line on stderr names what kvsim does instead
(:func:`kvmi_only`).  docs/migrating-from-kvmi.md lists every mapping.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvsim.core.errors import KvsimInputError

#: kvmi's MB is a mebibyte: ``value * 1024 * 1024`` bytes
#: (kv_deadline_scheduler src/kv_memory_intent/cli.py, ``_mb_to_bytes``); kvsim's GB is 1e9.
MIB_BYTES = 1024 * 1024


def capacity_gb(gb: float | None, mb: float | None, tier: str) -> float | None:
    """The tier capacity in GB (1e9 bytes) from ``--<tier>-gb`` or kvmi's ``--<tier>-mb``
    (MiB); both given is an error."""
    if mb is None:
        return gb
    if gb is not None:
        raise KvsimInputError(f"expected one of --{tier}-gb or --{tier}-mb, got both", None,
                              None, f"--{tier}-mb")
    if mb < 0:
        raise KvsimInputError(f"expected a capacity >= 0 MiB, got {mb:g}", None, None,
                              f"--{tier}-mb")
    return mb * MIB_BYTES / 1e9


def mb_option(tier: str):
    """The ``--<tier>-mb`` option (kvmi's spelling of a capacity)."""
    return Annotated[float | None, typer.Option(
        f"--{tier}-mb", metavar="MiB",
        help=f"{tier.upper()} capacity in MiB (kv_deadline_scheduler's unit: 1 MiB = "
             f"1,048,576 bytes), instead of --{tier}-gb.", show_default=False)]


#: ``--map kvmi``: kv_deadline_scheduler's request-trace JSONL (RequestTraceRecord:
#: request_id, arrival_ms, prompt_tokens, generated_tokens, request_priority, deadline_ms;
#: integrations/external_trace/request_trace_format.md) read by the generic reader.  kvmi's
#: ``deadline_ms`` is the request's deadline; kvsim's nearest concept is the TTFT deadline.
KVMI_REQUEST_MAP = "output_tokens=generated_tokens,ttft_deadline_ms=deadline_ms"

#: kvmi ``--dtype-bytes`` -> kvsim ``--kv-dtype``.
_DTYPE_BY_BYTES = {1: "fp8", 2: "fp16", 4: "fp32"}


def kv_dtype_for_bytes(dtype_bytes: int) -> str:
    if dtype_bytes not in _DTYPE_BY_BYTES:
        raise KvsimInputError(f"expected 1, 2 or 4 bytes per value, got {dtype_bytes}", None,
                              None, "--dtype-bytes")
    return _DTYPE_BY_BYTES[dtype_bytes]


#: kvmi options kvsim has no direct equivalent of -> what kvsim does instead.
KVMI_ONLY = {
    "--decode-steps": "decode lengths come from the workload profile's output_tokens "
                      "distribution (profiles/workloads/*.toml) or the trace's output tokens",
    "--blocks-per-request": "blocks per request follow from each request's tokens and "
                            "--block-size (vLLM paging)",
    "--block-kb": "block bytes follow from the model: --block-size tokens x the model's KV "
                  "bytes per token (kvsim estimate-kv MODEL)",
    "--logical-block-mb": "blocks are --block-size tokens (vLLM, default 16); their bytes "
                          "follow from --model (kvsim estimate-kv MODEL shows them)",
    "--max-blocks-per-request": "a request holds the blocks its tokens need; the engine "
                                "model's --max-num-batched-tokens and KV budget bound them",
}


def kvmi_only(option: str, value) -> None:
    """If ``value`` was given, say on stderr (one line) that kvsim ignores ``option`` and
    what it does instead."""
    if value is None or value is False:
        return
    sys.stderr.write(f"note: {option} is kv_deadline_scheduler's and is ignored: "
                     f"{KVMI_ONLY[option]}\n")


def kvmi_only_option(option: str, metavar: str = "N"):
    """A hidden option accepting a kvmi-only flag (see :data:`KVMI_ONLY`)."""
    return Annotated[float | None, typer.Option(
        option, metavar=metavar, hidden=True, show_default=False,
        help=f"kv_deadline_scheduler's option, accepted and ignored: {KVMI_ONLY[option]}.")]


def spec_from_geometry(fields: dict):
    """A model from kvmi's geometry options (``--num-layers --hidden-size
    --num-attention-heads --num-kv-heads --head-dim``), parsed as a config.json with those
    fields (parameter count unknown: no fit beside weights)."""
    from kvsim.spec.models.catalog import spec_from_config

    for need in ("num_hidden_layers", "num_attention_heads"):
        if need not in fields:
            flag = {"num_hidden_layers": "--num-layers",
                    "num_attention_heads": "--num-attention-heads"}[need]
            raise KvsimInputError(f"missing; the geometry options need {flag}", None, None,
                                  flag)
    cfg = dict(fields)
    if "hidden_size" not in cfg:
        if "head_dim" not in cfg:
            raise KvsimInputError("missing; expected --hidden-size or --head-dim", None,
                                  None, "--hidden-size")
        cfg["hidden_size"] = cfg["head_dim"] * cfg["num_attention_heads"]
    return spec_from_config(cfg, name="custom (geometry options)", source="command line")


def _register_demo() -> None:
    from kvsim.cli import app

    @app.command("demo", hidden=True, context_settings={"allow_extra_args": True,
                                                        "ignore_unknown_options": True})
    def demo_command(
        profile: Annotated[str, typer.Option("--profile", help="kvmi's demo profile.")]
        = "balanced",
        seed: Annotated[int, typer.Option("--seed", help="kvmi's demo seed.")] = 42,
    ) -> None:
        """kv_deadline_scheduler's `kvmi demo`: kvsim's equivalent is `kvsim compare
        --profile NAME` (this command only says so)."""
        raise KvsimInputError(
            f"kvsim has no demo command; run `kvsim compare --profile {profile} --requests 256 "
            f"--seed {seed} --hbm-gb 8` (every policy on a generated workload)", None, None,
            "demo")


_register_demo()
