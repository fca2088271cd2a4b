"""Regenerate the command-line bad-input corpus: ``python tests/bad_inputs/make_cli_corpus.py``.

Writes the input files of ``cli_cases.toml`` into ``tests/bad_inputs/cli/``: request
traces for every importer with one defect each, and user policy files that misbehave in
one way each.  Deterministic: running it twice gives identical bytes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "cli"

MC = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}
OPENAI = {"timestamp": 1700000000, "model": "m", "usage": {"prompt_tokens": 40,
                                                           "completion_tokens": 5}}
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"
GEN_HEADER = "arrival_ms,prompt_tokens,output_tokens,block_ids\n"


def write(name: str, data: str | bytes) -> None:
    path = HERE / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def jl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def importers() -> None:
    write("empty.jsonl", b"")
    write("empty.jsonl.gz", gz(b""))
    import zstandard

    write("empty.jsonl.zst", zstandard.ZstdCompressor(level=3).compress(b""))
    write("blank_lines.jsonl", "\n\n  \n")
    write("azure_header_only.csv", AZ_HEADER)
    write("garbage.jsonl", jl(MC).encode() + bytes(range(128, 256)) + b"\n")
    write("plain_text.jsonl.gz", jl(MC))
    write("truncated.jsonl.gz", gz(jl(*[MC] * 200).encode())[:60])
    write("truncated.parquet", b"PAR1" + bytes(range(64)))
    write("garbage.parquet", bytes(range(256)) * 4)
    write("empty.parquet", b"")
    write("mc_bigint_hash.jsonl", jl(MC, dict(MC, hash_ids=[1, 2**70])))
    write("mc_ts_1e300.jsonl", jl(MC, dict(MC, timestamp=1e300)))
    write("mc_arabic_digits.jsonl", jl(MC, '{"timestamp": 0, "input_length": "\u0663\u0660\u0660",'
                                           ' "output_length": 10, "hash_ids": [1]}'))
    write("mc_fullwidth_digits.jsonl", jl(MC, '{"timestamp": 0, "input_length": 300, '
                                              '"output_length": "\uff13\uff10\uff10", '
                                              '"hash_ids": [1]}'))
    write("mc_output_1e11.jsonl", jl(MC, dict(MC, output_length=10**11)))
    write("mc_output_float_1e11.jsonl", jl(MC, dict(MC, output_length=1e11)))
    write("mc_input_20m.jsonl", jl(dict(MC, input_length=20_000_000,
                                        hash_ids=list(range(39063)))))
    write("mc_not_prefix_tree.jsonl", jl(MC, dict(MC, hash_ids=[3, 2])))
    write("mc_missing_field.jsonl", jl(MC, {"timestamp": 0, "input_length": 10,
                                            "hash_ids": [1]}))
    write("mc_ids_count.jsonl", jl(MC, dict(MC, hash_ids=[1, 2, 3])))
    write("mc_huge_int_text.jsonl", jl(MC, '{"timestamp": 0, "input_length": '
                                           + "9" * 5000 + ', "output_length": 1, '
                                           '"hash_ids": [1]}'))
    write("mc_nested.jsonl", jl(MC, "[" * 100_000 + "]" * 100_000))
    write("mc_nan_timestamp.jsonl", jl(MC, '{"timestamp": NaN, "input_length": 10, '
                                           '"output_length": 1, "hash_ids": [1]}'))
    write("mc_bom_bad_line.jsonl", b"\xef\xbb\xbf" + jl(MC, dict(MC, output_length=-1))
          .encode())
    write("azure_bad_time.csv", AZ_HEADER + AZ_ROW + "yesterday,10,1\n")
    write("azure_arabic_digits.csv", AZ_HEADER + AZ_ROW
          + "2023-11-16 18:17:04.0,\u0663\u0660,1\n")
    write("azure_short_row.csv", AZ_HEADER + AZ_ROW + "2023-11-16 18:17:04.0,10\n")
    write("azure_nul.csv", AZ_HEADER + AZ_ROW + "2023-11-16 18:17:04.0,1\x000,1\n")
    write("openai_ts_1e300.jsonl", jl(OPENAI, dict(OPENAI, timestamp=1e300)))
    write("openai_token_bigint.jsonl", jl(OPENAI, dict(OPENAI, prompt_token_ids=[1, 2**64])))
    write("openai_priority.jsonl", jl(OPENAI, dict(OPENAI, priority=101)))
    write("openai_fanout.jsonl", jl(OPENAI, dict(OPENAI, n=1_000_000)))
    write("generic_block_bigint.csv", GEN_HEADER + "0,40,5,1 2\n1,40,5,1 "
          + str(2**65) + "\n")
    write("generic_no_arrival.csv", "prompt_tokens,output_tokens\n40,5\n")
    write("generic_arrival_1e300.csv", GEN_HEADER + "0,40,5,1\n1e300,40,5,1\n")
    write("generic_extra_field.csv", GEN_HEADER + "0,40,5,1\n1,40,5,1,9\n")
    write("agentic_bad_json.json", '{"id": "x", "requests": [\n{"t": 0, "in": 10,}\n]}')
    write("agentic_in_limit.json", json.dumps({"id": "x", "block_size": 64, "requests": [
        {"t": 0, "type": "n", "in": 64, "out": 1, "hash_ids": [1]},
        {"t": 1, "type": "n", "in": 64, "out": 50_000_000, "hash_ids": [1]}]}))
    # a 100M-character line (the default limit is 64 Mi characters) in a ~100 KB .gz
    write("mc_long_line.jsonl.gz", gz(jl(MC).encode() + b'{"timestamp": 0, "input_length": '
                                      + b"1" * 100_000_000 + b"}\n"))
    write("profile_turns0.toml", '[arrivals]\nsessions_per_s = 1.0\n\n[[classes]]\n'
          'name = "chat"\nweight = 1.0\nturns = 0\n'.replace("[arrivals]",
                                                              'name = "t0"\n\n[arrivals]'))
    write("agentic_t_inf.json", '{"id": "x", "requests": [{"t": 1e999, "type": "n", '
          '"in": 64, "out": 1, "hash_ids": [1]}]}')


POLICY = '''"""Bad-input corpus: a user policy that {doc}."""
NAME = "{name}"
DESCRIPTION = "corpus policy: {doc}"
REASONS = ("first in, first out",)


def init(capacity_blocks, num_slots, params):
    {init}


def on_insert(state, view, b, now_us):
    state[0].append(b)
    {on_insert}


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    order = state[0]
    if not order:
        return -1, 0, 0
    {victim}
'''

POLICIES = {
    # name: (doc, init body, extra on_insert line, victim body)
    "pol_victim_raises": ("raises in victim", "return ([],)", "",
                          "raise RuntimeError('policy bug')"),
    "pol_victim_not_candidate": ("names a block that is not a candidate", "return ([],)", "",
                                 "return order[0] + 1 if order[0] + 1 not in order else "
                                 "max(order) + 1, 0, 0"),
    "pol_victim_out_of_range": ("names a block id beyond the pool", "return ([],)", "",
                                "return 10**9, 0, 0"),
    "pol_victim_none_left": ("returns -1 while candidates exist", "return ([],)", "",
                             "return -1, 0, 0"),
    "pol_bad_reason": ("returns a reason code outside REASONS", "return ([],)", "",
                       "return order[0], 5, 0"),
    "pol_bad_n_alt": ("returns more runners-up than alt_blocks holds", "return ([],)", "",
                      "return order[0], 0, alt_blocks.shape[0] + 1"),
    "pol_victim_junk": ("returns a string", "return ([],)", "", "return 'oldest'"),
    "pol_writes_view": ("writes into the view", "return ([],)",
                        "view.size_bytes[b] = 1", "return order[0], 0, 0"),
    "pol_insert_returns": ("returns a value from on_insert", "return ([],)", "return True",
                           "return order[0], 0, 0"),
    "pol_init_list": ("returns a list from init", "return [[]]", "",
                      "return order[0], 0, 0"),
    "pol_exit3_in_victim": ("calls sys.exit(3) in victim", "return ([],)", "",
                            "raise SystemExit(3)"),
    "pol_base_exception": ("raises a BaseException in on_insert", "return ([],)",
                           "raise BaseException('odd')", "return order[0], 0, 0"),
}
#: Module-level code appended to a corpus policy (run at import).
AT_IMPORT = {"pol_exit0_at_import": "import sys\nsys.exit(0)\n"}


def policies() -> None:
    for name, (doc, init, on_insert, victim) in POLICIES.items():
        write(f"{name}.py", POLICY.format(name=name, doc=doc, init=init,
                                          on_insert=on_insert or "pass", victim=victim))
    for name, code in AT_IMPORT.items():
        write(f"{name}.py", POLICY.format(name=name, doc="exits at import", init="return ([],)",
                                          on_insert="pass", victim="return order[0], 0, 0")
              + code)


WEKA = {"id": "t1", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
        "requests": [{"t": 0.0, "type": "n", "model": "m", "in": 130, "out": 5,
                      "hash_ids": [1, 2, 3]}]}
DYN_REQ = {"request_id": "r0", "output_tokens": 4, "request_received_ms": 1777312800000,
           "replay": {"trace_block_size": 64, "input_length": 128,
                      "input_sequence_hashes": [14879255164371896291, 274632075616497421]}}
DYN = {"schema": "dynamo.request.trace.v1", "event_type": "request_end", "request": DYN_REQ}


def new_formats() -> None:
    """Weka, ServeGen, Dynamo and Azure multimodal traces with one defect each (issue 37)."""
    r = dict(WEKA["requests"][0], hash_ids=[1, 2], **{"in": 200})
    write("weka_ids_count.jsonl", jl(WEKA, dict(WEKA, id="t2", requests=[r])))
    write("weka_scope.jsonl", jl(dict(WEKA, hash_id_scope="session")))
    write("weka_block_size_mix.jsonl", jl(WEKA, dict(WEKA, id="t2", block_size=16)))
    sg = {"request_id": 0, "type": "text", "input_length": 40, "hash_ids": [1, 2, 3],
          "img_ids": []}
    write("servegen_ids_count.jsonl", jl(sg, dict(sg, request_id=1, input_length=100)))
    write("servegen_dup_id.jsonl", jl(sg, sg))
    write("servegen_mixed.jsonl", jl(sg, {"request_id": 1, "type": "text", "input_length": 5,
                                          "output_length": 3, "duration": 10}))
    write("dynamo_hash_u65.jsonl", jl(DYN, {**DYN, "request": {**DYN_REQ, "replay": {
        **DYN_REQ["replay"], "input_sequence_hashes": [1, 2 ** 64]}}}))
    write("dynamo_no_replay.jsonl", jl(DYN, {**DYN, "request": {"request_id": "r1",
                                                                 "output_tokens": 3}}))
    span = {"traceId": "t", "spanId": "s", "startTimeUnixNano": "nan", "attributes": [
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}}]}
    write("otel_bad_start.jsonl", jl({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}))
    write("azure_mm_images.csv", "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
          "2024-10-15 00:00:00.0100000,1,1200,40\n2024-10-15 00:00:01.0000000,-2,300,12\n")


def recordings() -> None:
    """vLLM KV-event recordings (msgpack) with a frame over the ``max_line_chars`` limit."""
    import struct

    import msgpack

    def frame(ts: float, tokens: list[int], hashes: list[int]) -> bytes:
        return msgpack.packb([ts, [["BlockStored", hashes, None, tokens, 4, None]]])

    ok = frame(1.0, [1, 2, 3, 4], [11])
    # frame 2 holds 2,000 tokens (~2 KB): over --limit max_line_chars=1000
    write("vllm_frame_2kb.msgpack", ok + frame(2.0, [5] * 2000, list(range(12, 512))))
    # frame 2 holds 70M tokens (70 MB: over the default 64 Mi) in a ~70 KB .gz; written
    # by hand (msgpack's packb would build the 70M-item list): [2.0, [["BlockStored",
    # [12], None, <array32 of 70M x 1>, 4, None]]]
    n = 70_000_000
    big = (b"\x92\xcb" + struct.pack(">d", 2.0) + b"\x91\x96" + msgpack.packb("BlockStored")
           + b"\x91\x0c\xc0\xdd" + struct.pack(">I", n) + b"\x01" * n + b"\x04\xc0")
    write("vllm_frame_70mb.msgpack.gz", gz(ok + big))
    # JSONL recordings (session 22, audit10): a negative token id; a block whose parent is
    # itself (main read both: -7 as a token, the block as a chain)
    def stored(ts: float, hashes: list[int], parent, tokens: list[int]) -> dict:
        return {"ts": ts, "events": [{"type": "BlockStored", "block_hashes": hashes,
                                      "parent_block_hash": parent, "token_ids": tokens,
                                      "block_size": 4}]}

    first = stored(1.0, [11], None, [1, 2, 3, 4])
    write("vllm_negative_token.jsonl", jl(first, stored(2.0, [12, 13], 11,
                                                         [1, 2, 3, 4, 5, 6, -7, 8])))
    write("vllm_self_parent.jsonl", jl(first, stored(2.0, [12], 12, [5, 6, 7, 8])))
    write("vllm_self_parent_in_chain.jsonl", jl(stored(1.0, [11, 11], None,
                                                       [1, 2, 3, 4, 1, 2, 3, 4])))


def toml_files() -> None:
    """Hardware and workload profiles with one bad value each (session 20's audit)."""
    base = '[arrivals]\nsessions_per_s = 1.0\n\n[[classes]]\nname = "chat"\nweight = 1.0\n'
    write("profile_rate_nan.toml", 'name = "n"\n\n' + base.replace("1.0\n\n", "nan\n\n", 1))
    write("profile_prompt_1e15.toml", 'name = "p"\n\n' + base + "prompt_tokens = 1e15\n")
    write("hw_latin1.toml", '# caf\xe9\nname = "x"\n'.encode("latin-1"))
    # a DRAM tier whose link has no bandwidth (session 21: the error named the profile's
    # name, not this file)
    write("hw_dram_link_zero.toml", HW_DRAM_LINK_ZERO)
    # session 22 (audit10): a divisor of 0 (main: ZeroDivisionError traceback) and
    # distribution parameters outside their domain (main: drawn from silently)
    write("hw_hbm_bandwidth_zero.toml", HW_DRAM_LINK_ZERO.replace(
        "hbm_bandwidth_bytes_per_s = 2.039e12", "hbm_bandwidth_bytes_per_s = 0"))
    write("profile_sigma_negative.toml", 'name = "s"\n\n' + base +
          'prompt_tokens = { dist = "lognormal", median = 500, sigma = -0.9 }\n')
    write("profile_think_time_negative.toml", 'name = "t"\n\n' + base +
          'think_time_s = { dist = "exponential", mean = -20.0 }\n')


HW_DRAM_LINK_ZERO = """name = "zero-link"

[compute]
peak_dense_bf16_flops_per_s = 312e12
achievable_flops_fraction = 0.5
hbm_bandwidth_bytes_per_s = 2.039e12
achievable_bandwidth_fraction = 0.8
gpu_memory_bytes = 85_899_345_920

[tiers.hbm]
read_bandwidth_bytes_per_s = 2.039e12
write_bandwidth_bytes_per_s = 2.039e12
latency_us = 0.0

[tiers.dram]
capacity_bytes = 137_438_953_472
read_bandwidth_bytes_per_s = 204.8e9
write_bandwidth_bytes_per_s = 204.8e9
latency_us = 0.12
link = "pcie4-x16"
link_bandwidth_bytes_per_s = 0
link_latency_us = 5.0
"""


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    importers()
    new_formats()
    recordings()
    toml_files()
    policies()
