"""Synthetic workloads: a profile + seed -> a Request table -> events (via the lowering).

Generation rule (one ``numpy.random.default_rng(seed)``, draws in a fixed order, so the
same profile, count and seed give the same table and a byte-identical event file):

1. Sessions start as a Poisson process of ``arrivals.sessions_per_s``; each picks a class
   by ``weight`` and draws its number of turns.
2. Turn 1's prompt = [system prompt ``v``] + [``rag_docs_per_request`` documents drawn
   Zipf(``rag_zipf_s``) from a corpus of ``rag_corpus_docs``] + [fresh user tokens,
   ``prompt_tokens``].  Turn k+1's prompt = turn k's prompt + turn k's output + fresh
   ``turn_tokens`` (the client re-sends the history, as chat APIs do).
3. Turn k+1 arrives ``think_time_s`` after turn k's *expected* reply end (arrival +
   ``output_tokens * assumed_tpot_s``): the generator has no engine.
4. Content identity: every token belongs to a segment (system prompt, document, user
   message, model output) with a 63-bit id; the id of a 16-token native block hashes the
   (segment, offset, length) pieces it covers.  Ids cover the prompt *and* the output
   (``hashed_tokens`` = full blocks of prompt + output - 1 tokens, the KV a request
   writes), so a turn's decode blocks carry the hashes the next turn's prompt re-uses.
5. Intent facts: a turn that is not its session's last has ``session_continues`` and
   ``next_turn_gap_us`` = the class's mean think time (what a serving layer can estimate);
   ``shared_prefix_tokens`` = the system prompt.  SLOs (ms, 0 = none) become
   ``ttft_deadline_us`` / ``tpot_deadline_us``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from kvsim.core.errors import bad_value
from kvsim.engine.lowering import lower_requests
from kvsim.events.import_summary import ImportSummary
from kvsim.ingest.hashing import finish63, mix64, name_hash
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.spec.models.catalog import DEFAULT_MODEL
from kvsim.spec.workload_profile import RequestClass, WorkloadProfile, load_profile

#: Native block size of generated content ids (vLLM's default block size).
GEN_BLOCK_TOKENS = 16


@njit(cache=True)
def segment_block_ids(seg_ids, seg_lens, num_blocks, T):
    """Ids of the first ``num_blocks`` T-token blocks of a sequence of segments."""
    out = np.empty(num_blocks, dtype=np.int64)
    s = 0  # current segment
    off = 0  # offset inside it
    for b in range(num_blocks):
        z = mix64(np.uint64(0x5BD1E995))
        need = T
        while need > 0:
            take = min(need, seg_lens[s] - off)
            z = mix64(z ^ mix64(np.uint64(seg_ids[s]) ^ mix64(np.uint64(off * 65536 + take))))
            off += take
            need -= take
            if off == seg_lens[s]:
                s += 1
                off = 0
        out[b] = finish63(z)
    return out


def _zipf_choice(rng: np.random.Generator, n: int, s: float, k: int) -> list[int]:
    """k distinct document ids from 0..n-1 with Zipf(s) popularity (rank 0 most popular)."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return [int(x) for x in rng.choice(n, size=k, replace=False, p=w / w.sum())]


def build_workload(profile: WorkloadProfile, num_requests: int, seed: int) -> RequestTable:
    """The Request table of ``num_requests`` requests drawn from ``profile`` (rule above)."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise bad_value(None, None, "--requests", "an integer >= 1", num_requests)
    rng = np.random.default_rng(seed)
    weights = np.array([c.weight for c in profile.classes], dtype=np.float64)
    weights /= weights.sum()
    ns = name_hash("profile:" + profile.name)
    cols: dict[str, list] = {k: [] for k in (
        "arrival_us", "prompt_tokens", "output_tokens", "block_ids", "hashed_tokens", "session",
        "tenant", "request_priority", "ttft_deadline_us", "tpot_deadline_us", "n",
        "beam_width", "model", "session_continues", "next_turn_gap_us", "shared_prefix_tokens",
        "spec_draft_tokens", "spec_accept_prob")}
    t_s = 0.0
    session = 0
    made = 0
    while made < num_requests:
        t_s += rng.exponential(1.0 / profile.sessions_per_s)
        ci = int(rng.choice(len(profile.classes), p=weights))
        c: RequestClass = profile.classes[ci]
        turns = max(c.turns.sample_int(rng), 1)
        segs: list[tuple[int, int]] = []
        sys_tokens = 0
        if c.system_prompt_tokens > 0:
            v = int(rng.integers(c.system_prompts))
            segs.append((_seg(ns, "sys", ci, v), c.system_prompt_tokens))
            sys_tokens = c.system_prompt_tokens
        for d in (_zipf_choice(rng, c.rag_corpus_docs, c.rag_zipf_s, c.rag_docs_per_request)
                  if c.rag_docs_per_request > 0 else []):
            segs.append((_seg(ns, "doc", 0, d), c.rag_doc_tokens))  # one corpus per profile
        arrival_s = t_s
        for turn in range(turns):
            if made >= num_requests:
                break
            fresh = max((c.prompt_tokens if turn == 0 else c.turn_tokens).sample_int(rng), 1)
            segs.append((_seg(ns, "user", session, turn), fresh))
            out = max(c.output_tokens.sample_int(rng), 1)
            prompt = sum(n for _, n in segs if n > 0)
            out_seg = (_seg(ns, "out", session, turn), out)
            all_segs = [s for s in segs + [out_seg] if s[1] > 0]
            nblocks = (prompt + out - 1) // GEN_BLOCK_TOKENS
            ids = segment_block_ids(np.array([s[0] for s in all_segs], dtype=np.int64),
                                    np.array([s[1] for s in all_segs], dtype=np.int64),
                                    nblocks, GEN_BLOCK_TOKENS)
            last = turn == turns - 1
            cols["arrival_us"].append(int(round(arrival_s * 1e6)))
            cols["prompt_tokens"].append(prompt)
            cols["output_tokens"].append(out)
            cols["block_ids"].append(ids)
            cols["hashed_tokens"].append(nblocks * GEN_BLOCK_TOKENS)
            cols["session"].append(session)
            cols["tenant"].append(c.tenant)
            cols["request_priority"].append(c.request_priority)
            cols["ttft_deadline_us"].append(int(c.ttft_slo_ms * 1000) if c.ttft_slo_ms > 0 else -1)
            cols["tpot_deadline_us"].append(int(c.tpot_slo_ms * 1000) if c.tpot_slo_ms > 0 else -1)
            cols["n"].append(c.n)
            cols["beam_width"].append(c.beam_width)
            cols["model"].append("")
            cols["session_continues"].append(not last)
            cols["next_turn_gap_us"].append(-1 if last else
                                            max(int(_mean(c.think_time_s) * 1e6), 1))
            cols["shared_prefix_tokens"].append(sys_tokens)
            cols["spec_draft_tokens"].append(c.spec_draft_tokens)
            cols["spec_accept_prob"].append(c.spec_accept_prob)
            made += 1
            segs.append(out_seg)
            arrival_s += out * profile.assumed_tpot_s + c.think_time_s.sample(rng)
        session += 1
    return build_request_table(cols, block_size_tokens=GEN_BLOCK_TOKENS,
                               path=profile.source,
                               source={"format": "generate", "profile": profile.name,
                                       "requests": num_requests, "seed": seed})


def _mean(d) -> float:
    if d.dist == "constant":
        return d.value
    if d.dist == "uniform":
        return (d.min + d.max) / 2
    if d.dist == "lognormal":
        return d.median * float(np.exp(d.sigma ** 2 / 2))
    return d.mean


def _seg(ns: int, kind: str, a: int, b: int) -> int:
    return name_hash(f"{ns}:{kind}:{a}:{b}")


def generate(profile: str | Path | WorkloadProfile, num_requests: int, seed: int,
             out_path: str | Path, *, model: str = DEFAULT_MODEL, hardware: str = "h100-sxm",
             block_size_tokens: int = 16, max_num_seqs: int = 256,
             max_num_batched_tokens: int = 8192, num_gpu_blocks: int | None = None,
             gpu_memory_utilization: float | None = None,
             progress: Callable[[int, int], None] | None = None,
             timing: str | None = "auto") -> ImportSummary:
    """Generate ``num_requests`` requests from ``profile`` and lower them to ``out_path``
    (``timing``: the step-time model, :mod:`kvsim.engine.timing.select`).

    Same (profile, num_requests, seed, options) -> byte-identical event file.
    """
    prof = profile if isinstance(profile, WorkloadProfile) else load_profile(profile)
    table = build_workload(prof, num_requests, seed)
    source: dict[str, Any] = dict(table.source)
    return lower_requests(table, out_path, model=model, hardware=hardware,
                          block_size_tokens=block_size_tokens, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                          num_gpu_blocks=num_gpu_blocks,
                          gpu_memory_utilization=gpu_memory_utilization, source=source,
                          progress=progress, timing=timing)
