#!/usr/bin/env python3
"""Read and check a vLLM scheduler recording (schema ``kvsim-vllm-sched`` v1).

Standard library only, so kvsim's tests or importers can use it without vLLM::

    python bench/vllm/read_recording.py tests/fixtures/vllm_sched/*.jsonl.gz

For each file it expands every request's tokens from the token mapping, walks the steps
and checks that

* every BlockStored event's tokens, taken by reference (request ``r``, first block
  ``b``), equal its inline tokens when the recording has them;
* the hashes are a function of content: the same (parent, 16 tokens, salt on the first
  block) always has the same interned hash and its parent is the hash of the
  request's previous block;
* the event-derived count of cached blocks never goes negative, and an admission's hit
  covers only blocks that were cached at the start of the step or stored earlier in it;
* the per-step records add up to the summary (steps, preemptions, stored and removed
  blocks, clears, hit tokens, vLLM's prefix-cache stats).

``load(path)`` returns the parsed recording for other code to use.
"""

from __future__ import annotations

import gzip
import json
import sys

NS_STRIDE = 1 << 27


def _open(path):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def unruns(enc):
    out = []
    for x in enc:
        if isinstance(x, list):
            a, b = x
            out.extend(range(a, b + 1) if b >= a else range(a, b - 1, -1))
        else:
            out.append(x)
    return out


def expand_prompt(segments, reqs):
    out = []
    for seg in segments:
        if "tok" in seg:
            out.extend(seg["tok"])
        elif "rep" in seg:
            tok, n = seg["rep"]
            out.extend([tok] * n)
        elif "range" in seg:
            start, n = seg["range"]
            out.extend(range(start, start + n))
        elif "blk" in seg:
            ns, bs, h, n = seg["blk"]
            base = 1 + ns * NS_STRIDE + bs * h
            out.extend(range(base, base + n))
        elif "prompt_of" in seg:
            out.extend(reqs[seg["prompt_of"]]["prompt_tokens"])
        elif "output_of" in seg:
            r = reqs[seg["output_of"]]
            n = seg.get("n", r["output_len"])
            out.extend(range(r["output_base"], r["output_base"] + n))
        else:
            raise ValueError(f"unknown prompt segment {seg!r}")
    return out


def load(path):
    """-> dict(header, requests, steps, hashes, summary); each request gains
    ``prompt_tokens`` and ``all_tokens`` (prompt + its output tokens)."""
    header, reqs, steps, hashes, summary = None, [], [], None, None
    with _open(path) as fh:
        for line in fh:
            d = json.loads(line)
            k = d["kind"]
            if k == "header":
                header = d
            elif k == "request":
                reqs.append(d)
            elif k == "step":
                steps.append(d)
            elif k == "hashes":
                hashes = d
            elif k == "summary":
                summary = d
    if header is None or header.get("schema") != "kvsim-vllm-sched":
        raise ValueError(f"{path}: not a kvsim-vllm-sched recording")
    if header["version"] != 1:
        raise ValueError(f"{path}: schema version {header['version']} not understood")
    for i, r in enumerate(reqs):
        assert r["idx"] == i
        r["prompt_tokens"] = expand_prompt(r["prompt"], reqs)
        assert len(r["prompt_tokens"]) == r["prompt_len"], r["id"]
        r["all_tokens"] = r["prompt_tokens"] + list(
            range(r["output_base"], r["output_base"] + r["output_len"]))
    return {"header": header, "requests": reqs, "steps": steps, "hashes": hashes,
            "summary": summary}


def check(rec) -> dict:
    h, reqs, steps, summ = rec["header"], rec["requests"], rec["steps"], rec["summary"]
    bs = h["engine"]["block_size"]
    content: dict = {}        # (parent id, tokens, salt) -> hash id
    chain: dict = {}          # (request, block) -> hash id, as learned from events
    cached: dict = {}         # hash id -> number of cached blocks with it
    t = {"steps": 0, "preemptions": 0, "stored_blocks": 0, "stored_events": 0,
         "removed_blocks": 0, "cleared": 0, "new_hit_tokens": 0, "resumed_hit_tokens": 0,
         "scheduled_tokens": 0, "duplicate_stores": 0}
    pc = [0] * 6
    finished = set()
    usable = h["kv_cache"]["num_gpu_blocks"] - 1
    clk = h["clock"]
    held: dict = {}           # request -> its block table (block ids)
    computed: dict = {}       # request -> computed tokens after the step
    arrival: dict = {i: r["arrival_ms"] for i, r in enumerate(reqs) if "arrival_ms" in r}
    if clk.get("ignore_timestamps"):
        arrival = {i: 0.0 for i in arrival}
    T = last_T = 0.0
    for s in steps:
        assert s["step"] == t["steps"], s["step"]
        t["steps"] += 1
        if "arrived" in s:
            # the clock only jumps forward (to the next arrival, when idle)
            assert s["t_ms"] >= T - 1e-3, f"step {s['step']}: clock went back"
            T = s["t_ms"]
            for i in s["arrived"]:
                assert arrival[i] <= T + 1e-3, f"step {s['step']}: {i} arrived early"
                assert s["step"] == 0 or arrival[i] > last_T - 1e-3, \
                    f"step {s['step']}: {i} arrived late"
        # block tables: preempted requests drop theirs, admissions bring a whole one
        for i in s.get("preempted", ()):
            held.pop(i, None)
            computed[i] = 0
        n_sched = dict((i, n) for i, n in s["sched"])
        admitted = {i: hit for i, hit in s.get("new", []) + s.get("resumed", [])}
        for i, ids in s.get("blocks", ()):
            if i in admitted:
                held[i] = unruns(ids)
            else:
                held.setdefault(i, []).extend(unruns(ids))
        for i, n in n_sched.items():
            computed[i] = (admitted[i] if i in admitted else computed.get(i, 0)) + n
            # with speculative decoding the rejected drafts roll computed tokens back while
            # their blocks stay (and the recording does not say how many were accepted):
            # only the free-block counts below are checked then
            if h["block_ids"] and not h["engine"].get("num_speculative_tokens"):
                assert len(held.get(i, ())) == -(-computed[i] // bs), \
                    f"step {s['step']}: request {i} holds {len(held.get(i, ()))} blocks " \
                    f"for {computed[i]} tokens"
        if h["block_ids"]:
            in_use = set()
            for ids in held.values():
                in_use.update(ids)
            assert 0 not in in_use and max(in_use, default=1) <= usable
            assert s.get("free_sched", s["free"]) == usable - len(in_use), \
                f"step {s['step']}: free after schedule"
        for i in s.get("finished", ()):
            held.pop(i, None)
            for j, r in enumerate(reqs):
                if r.get("after", {}).get("req") == i:
                    arrival[j] = T + clk["step_base_ms"] + clk["per_token_ms"] * \
                        sum(n_sched.values()) + r["after"].get("delay_ms", 0.0)
        if h["block_ids"]:
            in_use = set()
            for ids in held.values():
                in_use.update(ids)
            assert s["free"] == usable - len(in_use), f"step {s['step']}: free"
        last_T = T
        T += clk["step_base_ms"] + clk["per_token_ms"] * sum(n_sched.values())
        start_cached = {k for k, v in cached.items() if v > 0}
        stored_here = set()
        for e in s.get("ev", ()):
            if "S" in e:
                ids = unruns(e["S"])
                r, b = e["r"], e["b"]
                toks = reqs[r]["all_tokens"][b * bs:(b + len(ids)) * bs]
                assert len(toks) == len(ids) * bs, (s["step"], e)
                if "t" in e:
                    assert e["t"] == toks, f"step {s['step']}: inline tokens differ"
                parent = e["p"]
                if b > 0 and (r, b - 1) in chain:
                    assert chain[(r, b - 1)] == parent, f"step {s['step']}: parent"
                if b == 0:
                    assert parent is None
                salt = reqs[r]["cache_salt"]
                for j, hid in enumerate(ids):
                    key = (parent, tuple(toks[j * bs:(j + 1) * bs]),
                           salt if b + j == 0 else None)
                    if cached.get(hid, 0) > 0:
                        t["duplicate_stores"] += 1
                    old = content.setdefault(key, hid)
                    assert old == hid, f"step {s['step']}: same content, other hash"
                    chain[(r, b + j)] = hid
                    cached[hid] = cached.get(hid, 0) + 1
                    stored_here.add(hid)
                    parent = hid
                t["stored_events"] += 1
                t["stored_blocks"] += len(ids)
            elif "R" in e:
                for hid in unruns(e["R"]):
                    cached[hid] = cached.get(hid, 0) - 1
                    assert cached[hid] >= 0, f"step {s['step']}: removed an uncached hash"
                    t["removed_blocks"] += 1
            elif "C" in e:
                cached.clear()
                start_cached = set()
                t["cleared"] += 1
        for key, tot in (("new", "new_hit_tokens"), ("resumed", "resumed_hit_tokens")):
            for i, hit in s.get(key, ()):
                assert hit % bs == 0 and hit <= len(reqs[i]["all_tokens"]) - 1
                t[tot] += hit
                # the hit blocks were cached at step start or stored earlier this step
                toks = reqs[i]["all_tokens"]
                parent = None
                salt = reqs[i]["cache_salt"]
                for b in range(hit // bs):
                    key2 = (parent, tuple(toks[b * bs:(b + 1) * bs]),
                            salt if b == 0 else None)
                    hid = content.get(key2)
                    assert hid is not None and (hid in start_cached or hid in stored_here), \
                        f"step {s['step']}: request {i} hit an uncached block {b}"
                    parent = hid
        t["preemptions"] += len(s.get("preempted", ()))
        t["scheduled_tokens"] += sum(n for _, n in s["sched"])
        for i in s.get("finished", ()):
            assert i not in finished
            finished.add(i)
        for j, v in enumerate(s.get("pc", [0] * 6)):
            pc[j] += v
    assert len(finished) == len(reqs), "not every request finished"
    for k, v in t.items():
        assert summ[k] == v, f"summary {k}: {summ[k]} != {v}"
    vp = summ["vllm_prefix_cache"]
    assert [vp["requests"], vp["queries"], vp["hits"], vp["preempted_requests"],
            vp["preempted_queries"], vp["preempted_hits"]] == pc
    # with the OffloadingConnector an admission's hit also counts the tokens loaded from
    # the CPU tier, which vLLM's prefix-cache stats (GPU hits) leave out
    loaded = rec["header"]["engine"]["block_size"] * summ["offload"]["load"] \
        if "offload" in summ else 0
    assert vp["hits"] + vp["preempted_hits"] + loaded == \
        t["new_hit_tokens"] + t["resumed_hit_tokens"], "hit tokens"
    if not loaded:
        assert vp["hits"] == t["new_hit_tokens"]
        assert vp["preempted_hits"] == t["resumed_hit_tokens"]
    assert abs(T - summ["end_ms"]) < 1e-2, f"end of clock {T} != {summ['end_ms']}"
    return t


def main(argv):
    bad = 0
    for p in argv:
        try:
            rec = load(p)
            t = check(rec)
            s = rec["summary"]
            print(f"{p}: ok: {t['steps']} steps, {t['preemptions']} preemptions, "
                  f"{t['stored_blocks']} stored / {t['removed_blocks']} removed blocks, "
                  f"{t['cleared']} clears, hits {s['vllm_prefix_cache']['hits']}/"
                  f"{s['vllm_prefix_cache']['queries']} tokens")
        except AssertionError as exc:
            bad += 1
            print(f"{p}: FAILED: {exc}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
