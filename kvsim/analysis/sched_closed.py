"""``kvsim validate --sched-recording FILE --closed-loop``: a recording of vLLM's scheduler
replayed through kvsim's real closed loop (:mod:`kvsim.modes.closed.closed_loop`, the
engine users run), scheduler ``vllm``, policy ``lru``, HBM only.

The recording's requests become a Request table (block ids: the chain hashes of their
full blocks, so content identity is exact; ``cache_salt`` -> tenant; vLLM priority p ->
``request_priority`` 50 - p), its engine config the closed loop's (block size, usable
blocks = ``num_gpu_blocks`` - 1, max_num_seqs, max_num_batched_tokens,
long_prefill_token_threshold, watermark, reserve_full_isl, fcfs / priority), and its step
clock the step-time model: a ``fitted`` profile ``step_ms = step_base_ms + per_token_ms x
(prefill tokens + decode sequences)``, which is the recorder's clock exactly
(docs/vllm-recordings.md, "The step clock").

Each closed-loop step is compared with the recording's next step that did something
(scheduled or preempted; vLLM's trailing no-op step is not one): the scheduled set and
tokens, preemptions, admissions with their hit tokens, finished requests, the KV events of
the scheduler's KV manager, and the replay's own HBM pool: its free blocks after the
step (``free``) must equal vLLM's, so the replay (hits, evictions, preemptions' releases)
holds exactly vLLM's blocks.  Resets (``reset_prefix_cache``, the recording's actions)
are replayed (:meth:`kvsim.modes.closed.closed_loop.Engine.set_resets`) and their outcomes
compared (``reset``): a recording step ``k`` becomes the closed loop's engine step that many
steps that did something later (a step that schedules nothing is no engine step there), a
reset before a request's arrival stays before it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.analysis.sched_validate import (
    SchedDivergence,
    SchedValidation,
    _requests_of,
    build_requests,
    recorded_step,
)
from kvsim.core.errors import KvsimInputError
from kvsim.ingest.vllm_sched import load_sched_recording, unruns

__all__ = ["validate_sched_closed"]

#: fields compared through the closed loop (``blocks``: the scheduler's block ids are the
#: KV manager's, compared as the step function's are)
CLOSED_FIELDS = ("sched", "preempted", "hits", "finished", "free", "events", "reset")


def _table(rec, reqs):
    from kvsim.ingest.requests import build_request_table

    bs = rec.block_size
    salts: dict = {None: 0}
    arrivals = rec.arrival_ms_of()
    cols: dict[str, list] = {k: [] for k in ("arrival_us", "prompt_tokens", "output_tokens",
                                             "block_ids", "hashed_tokens", "tenant",
                                             "request_priority")}
    for r, t in zip(reqs, arrivals):
        cols["arrival_us"].append(int(round(t * 1000.0)))
        cols["prompt_tokens"].append(r.prompt_len)
        cols["output_tokens"].append(r.output_len)
        cols["block_ids"].append(list(r.hashes))
        cols["hashed_tokens"].append(len(r.hashes) * bs)
        cols["tenant"].append(salts.setdefault(r.cache_salt, len(salts)))
        cols["request_priority"].append(50 - r.priority)
    # the table is sorted by arrival (ties in recording order, as the recorder adds them):
    # row j is recording request perm[j]
    perm = np.argsort(np.asarray(cols["arrival_us"], dtype=np.int64), kind="stable")
    table = build_request_table(cols, block_size_tokens=bs, path="<recording>",
                                source={"salt_by_tenant": True})  # tenant = cache_salt
    return table, perm


def _clock_profile(rec, folder: Path) -> Path:
    clock = rec.header.get("clock") or {}
    base = float(clock.get("step_base_ms", 10.0))
    per = float(clock.get("per_token_ms", 0.05))
    p = folder / "recording_clock.toml"
    p.write_text('schema = "kvsim.timing.fitted/1"\nmodel = ""\ngpu = ""\n\n[fit]\n'
                 f"a_ms = {base!r}\nb_ms_per_prefill_token = {per!r}\n"
                 f"c_ms_per_decode_seq = {per!r}\nd_ms_per_context_token = 0.0\n")
    return p


def _resets(rec, perm) -> list[dict]:
    """The recording's ``reset_prefix_cache`` actions for :meth:`Engine.set_resets`:
    ``at_step`` k (a recording step) -> the number of recording steps before k that
    scheduled or preempted something (the closed loop's engine step: an empty step is no
    step there); ``before_arrival_of`` i (a recording request) -> its table row."""
    acts = [a for a in rec.header.get("actions") or [] if a.get("do") == "reset_prefix_cache"]
    if not acts:
        return []
    busy = [bool(s.get("sched") or s.get("preempted")) for s in rec.steps]
    row = {int(q): j for j, q in enumerate(perm)}
    out = []
    for a in acts:
        run = bool(a.get("reset_running_requests", False))
        if "at_step" in a:
            out.append({"at_step": sum(busy[:int(a["at_step"])]),
                        "reset_running_requests": run})
        else:
            out.append({"before_arrival_of": row[int(a["before_arrival_of"])],
                        "reset_running_requests": run})
    return out


def validate_sched_closed(path: str | Path, write_policy: str | None = None
                          ) -> SchedValidation:
    """Replay a scheduler recording through the closed loop and compare every step.

    A recording of vLLM's native CPU offloading (header ``offload``) is replayed with a DRAM
    tier of its CPU chunks under ``write_policy`` (default ``vllm_offload``; another one
    shows how kvsim's other DRAM tiers differ), and each step's CPU tier contents are
    compared too (field ``offload``)."""
    from kvsim.engine import vllm_step as V
    from kvsim.engine.vllm_rows import (
        VS_ADM,
        VS_EV,
        VS_FIN,
        VS_H0,
        VS_HH,
        VS_OC,
        VS_PRE,
        VS_RES,
        VS_SCHED,
    )
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    rec = load_sched_recording(path)
    eng = rec.engine
    reqs = build_requests(rec)
    hashes = {r.idx: r.hashes for r in reqs}
    table, perm = _table(rec, reqs)
    policy = resolve_policy("lru")
    off = rec.header.get("offload")  # vLLM's native CPU offloading (OffloadingConnector)
    if off is not None and (off.get("eviction_policy", "lru") != "lru"
                            or int(off.get("store_threshold", 0)) >= 2):
        raise KvsimInputError("--closed-loop: kvsim's vllm_offload follows vLLM's lru cache "
                              "policy without a store_threshold; the recording has "
                              f"{off.get('eviction_policy')!r}, store_threshold "
                              f"{off.get('store_threshold')}", field="--sched-recording")
    with tempfile.TemporaryDirectory() as tmp:
        config = SimConfig(mode="engine", hbm_blocks=int(eng["num_gpu_blocks"]) - 1,
                           dram_gb=0, cxl_gb=0, nvme_gb=0,
                           priority_scheduling=eng.get("policy") == "priority",
                           engine="compiled")
        opts = EngineOptions(
            block_size_tokens=rec.block_size, max_num_seqs=int(eng["max_num_seqs"]),
            max_num_batched_tokens=int(eng["max_num_batched_tokens"]),
            timing=str(_clock_profile(rec, Path(tmp))), scheduler="vllm",
            long_prefill_token_threshold=int(eng.get("long_prefill_token_threshold") or 0),
            reserve_full_isl=bool(eng.get("scheduler_reserve_full_isl", True)),
            watermark=float(eng.get("watermark") or 0.0))
        if off is not None:  # a DRAM tier of the recording's CPU chunks, vLLM's rules
            import dataclasses

            from kvsim.core.units import GB
            bb = prepare(table, config, opts)[3]
            config = dataclasses.replace(
                config, dram_gb=(int(off["cpu_blocks"]) + 0.5) * bb / GB,
                write_policy=write_policy or "vllm_offload")
        cost, hbm_blocks, costs, block_bytes, offs, ids, table2, dropped = \
            prepare(table, config, opts)
        if dropped:
            raise KvsimInputError(f"--closed-loop: {dropped} requests never fit the pool",
                                  field="--sched-recording")
        e = Engine(table2, offs, ids, policy, config, opts, cost, hbm_blocks, costs,
                   block_bytes)
        e.set_block_facts(block_facts(table2, offs, ids, opts.block_size_tokens,
                                        next_use=policy.offline))
        resets = _resets(rec, perm)
        if resets:
            e.set_resets(resets)
        mine: list[dict[str, Any]] = []
        vs = e.vs
        pool = e.run.st
        # the scheduler's hashes (chained over the table's block ids) -> the recording's
        h0, hh = vs[VS_H0], vs[VS_HH]
        to_port = {int(hh[h0[j] + b]): h for j, q in enumerate(perm)
                   for b, h in enumerate(reqs[q].hashes)}
        perm_rid = [int(q) for q in perm]  # closed-loop request (table row) -> recording's

        def capture():
            vs = e.vs  # vLLM's rows are the core's request-table rows: their requests
            rid = [perm_rid[int(j)] if j >= 0 else -1 for j in e.slots.rid_of]
            oc = vs[VS_OC]
            adm = vs[VS_ADM][:oc[V.O_ADM]]
            events: list[tuple] = []
            for kind, a, b, c in vs[VS_EV][:oc[V.O_EV]]:
                if kind == V.E_STORED:
                    hs = hashes[rid[a]]
                    events.append(("S", hs[b - 1] if b else None, tuple(hs[b:b + c])))
                elif kind == V.E_REMOVED:
                    events.append(("R", to_port[int(a)]))
                else:  # E_CLEARED: a reset_prefix_cache() that succeeded
                    events.append(("C",))
            mine.append({
                "sched": [(rid[i], int(n)) for i, n in vs[VS_SCHED][:oc[V.O_SCHED]]],
                "preempted": [rid[i] for i in vs[VS_PRE][:oc[V.O_PRE], 0]],
                "hits": ([("new", rid[i], int(h)) for i, h, r in adm if not r]
                         + [("resumed", rid[i], int(h)) for i, h, r in adm if r]),
                "finished": [rid[i] for i in vs[VS_FIN][:oc[V.O_FIN]]],
                "free": int(pool.sc[0] + pool.sc[1]),
                "events": events,
                "reset": [bool(x) for x in vs[VS_RES][:oc[V.O_RESET]]],
            })
            if off is not None:  # the CPU tier's contents after the step
                T = e.run.T[0]
                res = np.flatnonzero(T.L_i[:, 3] == 1)
                mine[-1]["offload"] = sorted(to_port[int(h)]
                                             for h in e.run.views[1].content_hash[res])

        e.advance(-1.0, max_steps=1, on_yield=capture)
        capture()  # the last step (advance returned idle after it)
        e.finish()
        replay = {"preemptions": int(e.run.C[_m_preemptions()]),
                  "lost_hit_tokens": e.lost_hit_tokens, "steps": e.steps}
        if off is not None:
            from kvsim.core import layout as L
            C = e.run.C
            replay["offload"] = {"load": int(C[L.M_HIT_BLK + 1]),
                                 "store": int(C[L.M_WRITE_THROUGH]),
                                 "evict": int(C[L.M_EVICT + 1])}
    theirs_all = []
    content: dict[int, int] = {}
    resident: set[int] = set()  # vLLM's CPU tier (in kvsim's hashes)
    for s in rec.steps:
        st = recorded_step(rec, s, content, hashes)
        if off is not None:
            o = s.get("off", {})
            resident.difference_update(content[i] for i in unruns(o.get("evict", [])))
            for _, hs in o.get("store", []):
                resident.update(content[i] for i in unruns(hs))
            st["offload"] = sorted(resident)
        if st["sched"] or st["preempted"]:
            theirs_all.append(st)
    mine = [m for m in mine if m["sched"] or m["preempted"]]
    fields = CLOSED_FIELDS
    if off is not None:
        fields += ("offload",)
    result = SchedValidation(path=str(path), case=str(rec.header.get("case", "")),
                             vllm_version=str(rec.header.get("vllm_version", "")),
                             num_requests=len(reqs), steps_vllm=len(theirs_all),
                             steps_kvsim=len(mine),
                             pool="scheduler vllm, lru, " + ("DRAM vllm_offload" if off
                                                             else "HBM only"),
                             engine="closed-loop")
    agree = dict.fromkeys(fields, 0)
    differ = dict.fromkeys(fields, 0)
    first = None
    pre = {"vllm": 0, "kvsim": 0}
    hit = {"new": {"vllm": 0, "kvsim": 0}, "resumed": {"vllm": 0, "kvsim": 0}}
    for k in range(max(len(mine), len(theirs_all))):
        a = theirs_all[k] if k < len(theirs_all) else None
        b = mine[k] if k < len(mine) else None
        for side, st in (("vllm", a), ("kvsim", b)):
            if st is None:
                continue
            pre[side] += len(st["preempted"])
            for kind, _, h in st["hits"]:
                hit[kind][side] += h
        for name in fields:
            va = None if a is None else (a["free"][1] if name == "free" else a[name])
            vb = None if b is None else b[name]
            if a is not None and b is not None and va == vb:
                agree[name] += 1
                continue
            differ[name] += 1
            if first is None:
                first = SchedDivergence(k, name, _requests_of(name, va or [], vb or [])
                                        if name != "free" else [], va, vb)
    result.agree = agree
    result.divergences = {n: c for n, c in differ.items() if c}
    result.preemptions = pre
    result.replay = replay
    result.hit_tokens = hit
    result.first_divergence = first
    return result


def _m_preemptions() -> int:
    from kvsim.core.layout import M_PREEMPTIONS

    return M_PREEMPTIONS
