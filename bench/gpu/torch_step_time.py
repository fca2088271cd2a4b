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

Steps measured (each the median of ``--reps`` graph replays after 3 warm-ups):
* prefill: one sequence computing ``chunk`` new tokens after ``context_before`` cached ones
  (attention over context_before + chunk keys, causal within the chunk), logits for the
  last token only (as vLLM samples one token per sequence);
* decode: ``batch`` sequences, one new token each, over ``context`` cached tokens each.

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


def forward(layers, emb, head, x_ids, k_cache, v_cache, ctx, last_idx):
    """x_ids: (B, T) new tokens; k/v_cache: (B, KV_HEADS, ctx + T, HEAD_DIM) (one tensor
    shared by every layer: same bytes read per layer, a fraction of the memory)."""
    B, T = x_ids.shape
    h = emb[x_ids]
    causal = T > 1
    for L in layers:
        a = rms(h, L.n1)
        qkv = a @ L.qkv.t()
        q, k, v = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(B, T, Q_HEADS, HEAD_DIM).transpose(1, 2)
        k_cache[:, :, ctx:ctx + T] = k.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v_cache[:, :, ctx:ctx + T] = v.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if causal and ctx == 0:
            att = F.scaled_dot_product_attention(q, k_cache, v_cache, is_causal=True,
                                                 enable_gqa=True)
        elif causal:
            # chunked prefill: the chunk attends to every cached key and causally to itself
            # (the causal mask aligned to the bottom right, which flash attention runs)
            bias = causal_lower_right(T, ctx + T)
            if EXPAND_KV[0]:  # this torch's kernels refused GQA with the bias: expand heads
                kx = k_cache.repeat_interleave(Q_HEADS // KV_HEADS, 1)
                vx = v_cache.repeat_interleave(Q_HEADS // KV_HEADS, 1)
                att = F.scaled_dot_product_attention(q, kx, vx, attn_mask=bias)
            else:
                att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=bias,
                                                     enable_gqa=True)
        else:
            att = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        h = h + att.transpose(1, 2).reshape(B, T, Q_HEADS * HEAD_DIM) @ L.o.t()
        m = rms(h, L.n2)
        g, u = (m @ L.gate_up.t()).split(FFN, -1)
        h = h + (F.silu(g) * u) @ L.down.t()
    return h[:, last_idx] @ head.t()


def time_shape(layers, emb, head, dev, batch, new_tokens, context, reps):
    ids = torch.randint(0, VOCAB, (batch, new_tokens), device=dev)
    kc = torch.randn(batch, KV_HEADS, context + new_tokens, HEAD_DIM, device=dev,
                     dtype=torch.bfloat16)
    vc = torch.randn_like(kc)

    def run(kc=kc, vc=vc):
        return forward(layers, emb, head, ids, kc, vc, context, new_tokens - 1)

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
    del g, kc, vc
    torch.cuda.empty_cache()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
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
    prefill = [(128, 0), (512, 0), (1024, 0), (2048, 0), (4096, 0), (8192, 0),
               (2048, 8192), (2048, 30720), (8192, 24576)]
    shapes = [("prefill", 1, chunk, ctx) for chunk, ctx in prefill]
    shapes += [("decode", b, 1, ctx) for b in (1, 8, 32, 64, 128, 256) for ctx in (1024, 4096)]
    for kind, batch, new, ctx in shapes:
        row = {"kind": kind, "batch": batch, "chunk": new, "context": ctx}
        for attempt in range(2):
            try:
                row["ms"] = round(time_shape(layers, emb, head, dev, batch, new, ctx,
                                             args.reps), 4)
                row.pop("error", None)
                break
            except Exception as e:  # one failing shape must not lose the others
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                if kind == "prefill" and ctx > 0 and not EXPAND_KV[0]:
                    EXPAND_KV[0] = True
                    continue
                break
        if kind == "prefill" and ctx > 0:
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
