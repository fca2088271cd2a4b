"""Measure engine-step times of a Llama-3.1-8B-shaped decoder on a real GPU with PyTorch.

A check of kvsim's step clock (kvsim.engine.timing.measured, AIConfigurator's kernel
database) by something nobody on the team wrote: cuBLAS GEMMs and PyTorch's fused
scaled-dot-product attention (flash attention on Hopper), timed with CUDA events.  It is
*not* vLLM: no paged attention (the KV cache is one contiguous tensor per step shape), no
fused QKV/rotary kernels, no quantised GEMMs; every shape is captured once in a CUDA graph
(vLLM captures decode steps in graphs too), so launch overhead is excluded as in vLLM's
decode path.  The weights are random bf16 tensors (timing does not depend on values).

Model shape: meta-llama/Meta-Llama-3.1-8B config.json (hidden 4096, 32 layers, 32 query
heads, 8 KV heads, head dim 128, intermediate 14336, vocab 128256), bf16 weights and KV.

Steps measured (each the median of ``--reps`` graph replays after 3 warm-ups); the GEMMs of
a step run over all its tokens at once (vLLM's flattened batch), attention per sequence
group, logits only for the sampled positions (one per sequence, as vLLM samples):
* ``prefill``: one sequence computing ``chunk`` new tokens after ``context`` cached ones
  (attention over context + chunk keys, causal within the chunk);
* ``prefill_nomask``: the same chunk attending to every key without a mask (FlashAttention's
  fast path; chunk^2 / 2 more attention work): a bracket for the masked chunked rows;
* ``decode``: ``batch`` sequences, one new token each, over ``decode_context`` cached tokens;
* ``mixed``: a prefill chunk and a decode batch in one step (chunked prefill under load).

Output: one JSON document on stdout (and ``--out FILE``) with the device, torch version,
and rows ``{"kind", "chunk"/"batch", "context", "ms"}``.  Runs on a CUDA GPU only; it is a
bench script, never a test dependency (bench/gpu/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

# meta-llama/Meta-Llama-3.1-8B config.json
HIDDEN = 4096
LAYERS = 32
Q_HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
FFN = 14336
VOCAB = 128256
EXPAND_KV = [False]  # set when SDPA refuses enable_gqa with a lower-right causal bias


class Layer:
    def __init__(self, dev):
        def w(o, i):
            return torch.randn(o, i, device=dev, dtype=torch.bfloat16) * 0.02

        self.qkv = w((Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
        self.o = w(HIDDEN, Q_HEADS * HEAD_DIM)
        self.gate_up = w(2 * FFN, HIDDEN)
        self.down = w(HIDDEN, FFN)
        self.n1 = torch.ones(HIDDEN, device=dev, dtype=torch.bfloat16)
        self.n2 = torch.ones(HIDDEN, device=dev, dtype=torch.bfloat16)


def rms(x, g):
    return F.rms_norm(x, (HIDDEN,), g, 1e-5)


def _attend(q, kc, vc, T, ctx, nomask):
    """q: (B, H, T, D) against kc/vc (B, KV, ctx + T, D)."""
    if T == 1 or nomask:  # decode, or a chunk attending to every key (flash, no mask)
        return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    if ctx == 0:
        return F.scaled_dot_product_attention(q, kc, vc, is_causal=True, enable_gqa=True)
    return forward_attn_chunk(q, kc, vc, T, ctx)


def forward_attn_chunk(q, kc, vc, T, ctx):
    bias = causal_lower_right(T, ctx + T)
    if EXPAND_KV[0]:
        kx = kc.repeat_interleave(Q_HEADS // KV_HEADS, 1)
        vx = vc.repeat_interleave(Q_HEADS // KV_HEADS, 1)
        return F.scaled_dot_product_attention(q, kx, vx, attn_mask=bias)
    return F.scaled_dot_product_attention(q, kc, vc, attn_mask=bias, enable_gqa=True)


def forward_mixed(layers, emb, head, p_ids, pk, pv, p_ctx, d_ids, dk, dv, d_ctx, nomask,
                  sampled):
    """One step of one prefill chunk (``p_ids`` (1, T) after ``p_ctx`` cached tokens) and a
    decode batch (``d_ids`` (b, 1) over ``d_ctx`` cached tokens each): the GEMMs run over
    all T + b tokens at once (as vLLM's flattened batch), attention per part."""
    T = p_ids.shape[1] if p_ids is not None else 0
    b = d_ids.shape[0] if d_ids is not None else 0
    parts = []
    if T:
        parts.append(emb[p_ids[0]])
    if b:
        parts.append(emb[d_ids[:, 0]])
    h = torch.cat(parts) if len(parts) > 1 else parts[0]  # (T + b, hidden)
    for L in layers:
        a = rms(h, L.n1)
        qkv = a @ L.qkv.t()
        q, k, v = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        outs = []
        if T:
            qp = q[:T].view(1, T, Q_HEADS, HEAD_DIM).transpose(1, 2)
            pk[:, :, p_ctx:p_ctx + T] = k[:T].view(1, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            pv[:, :, p_ctx:p_ctx + T] = v[:T].view(1, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            att = _attend(qp, pk, pv, T, p_ctx, nomask)
            outs.append(att.transpose(1, 2).reshape(T, Q_HEADS * HEAD_DIM))
        if b:
            qd = q[T:].view(b, 1, Q_HEADS, HEAD_DIM).transpose(1, 2)
            dk[:, :, d_ctx:d_ctx + 1] = k[T:].view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
            dv[:, :, d_ctx:d_ctx + 1] = v[T:].view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
            att = _attend(qd, dk, dv, 1, d_ctx, nomask)
            outs.append(att.transpose(1, 2).reshape(b, Q_HEADS * HEAD_DIM))
        h = h + (torch.cat(outs) if len(outs) > 1 else outs[0]) @ L.o.t()
        m = rms(h, L.n2)
        g, u = (m @ L.gate_up.t()).split(FFN, -1)
        h = h + (F.silu(g) * u) @ L.down.t()
    return h[sampled] @ head.t()  # logits of the sampled positions only


def time_step(layers, emb, head, dev, chunk, p_ctx, batch, d_ctx, reps, nomask=False):
    """Median ms of one captured step: a chunk of ``chunk`` tokens after ``p_ctx`` (0 for
    none) plus ``batch`` decodes over ``d_ctx`` tokens each (0 sequences for none)."""
    bf = dict(device=dev, dtype=torch.bfloat16)
    p_ids = torch.randint(0, VOCAB, (1, chunk), device=dev) if chunk else None
    pk = torch.randn(1, KV_HEADS, p_ctx + chunk, HEAD_DIM, **bf) if chunk else None
    pv = torch.randn_like(pk) if chunk else None
    d_ids = torch.randint(0, VOCAB, (batch, 1), device=dev) if batch else None
    dk = torch.randn(batch, KV_HEADS, d_ctx + 1, HEAD_DIM, **bf) if batch else None
    dv = torch.randn_like(dk) if batch else None

    # the sampled positions (a chunk's last token, every decode), made before the capture: a
    # host-to-device copy cannot be captured
    sampled = torch.tensor(([chunk - 1] if chunk else []) + list(range(chunk, chunk + batch)),
                           device=dev)

    def run():
        return forward_mixed(layers, emb, head, p_ids, pk, pv, p_ctx, d_ids, dk, dv, d_ctx,
                             nomask, sampled)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del g, run
    torch.cuda.empty_cache()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", choices=("default", "long"), default="default",
                    help="default: the 30 recorded shapes; long: long-context decode "
                         "(16k-32k tokens), a 512-sequence decode batch, a 16k-token chunk")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    layers = [Layer(dev) for _ in range(LAYERS)]
    emb = torch.randn(VOCAB, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02
    head = torch.randn(VOCAB, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02
    rows = []
    # (kind, prefill chunk, its cached context, decode batch, decode context)
    shapes = [("prefill", c, ctx, 0, 0) for c, ctx in
              [(128, 0), (512, 0), (1024, 0), (2048, 0), (4096, 0), (8192, 0),
               (2048, 8192), (2048, 30720), (8192, 24576)]]
    # the same chunks attending to every key with no mask: FlashAttention's fast path, with
    # chunk^2 / 2 more attention work than causal (a bracket for the masked rows above)
    shapes += [("prefill_nomask", c, ctx, 0, 0) for c, ctx in
               [(2048, 8192), (2048, 30720), (8192, 24576)]]
    shapes += [("decode", 0, 0, b, ctx) for b in (1, 8, 32, 64, 128, 256) for ctx in (1024, 4096)]
    # chunked prefill beside a decode batch: the steps a busy engine mostly runs
    shapes += [("mixed", c, 0, b, 2048) for c in (512, 2048) for b in (16, 64, 128)]
    if args.shapes == "long":
        # where a KV-cache study spends its time: decode reading long contexts (the step is
        # bound by the batch's KV bytes, not the weights), a wide decode batch, a long chunk
        shapes = [("decode", 0, 0, b, ctx) for b in (1, 16, 64) for ctx in (16384, 32768)]
        shapes += [("decode", 0, 0, 512, ctx) for ctx in (1024, 2048)]
        shapes += [("prefill", 16384, 0, 0, 0), ("prefill_nomask", 4096, 28672, 0, 0)]
    for kind, chunk, p_ctx, batch, d_ctx in shapes:
        row = {"kind": kind, "chunk": chunk, "context": p_ctx, "batch": batch,
               "decode_context": d_ctx}
        for attempt in range(2):
            try:
                row["ms"] = round(time_step(layers, emb, head, dev, chunk, p_ctx, batch, d_ctx,
                                            args.reps, nomask=kind == "prefill_nomask"), 4)
                row.pop("error", None)
                break
            except Exception as e:  # one failing shape must not lose the others
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                if chunk and p_ctx > 0 and not EXPAND_KV[0]:
                    EXPAND_KV[0] = True
                    continue
                break
        if chunk and p_ctx > 0:
            row["kv_heads_expanded"] = EXPAND_KV[0]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cuda": torch.version.cuda, "model_shape": "meta-llama/Meta-Llama-3.1-8B",
           "dtype": "bfloat16", "reps": args.reps, "wall_s": round(time.time() - t0, 1),
           "rows": rows}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
