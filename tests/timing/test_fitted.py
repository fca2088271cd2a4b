"""``kvsim calibrate --from-vllm-bench`` (kvsim/engine/timing/fitted.py): known
coefficients recovered exactly from synthetic `vllm bench serve --save-detailed` results,
MAPE reported on noisy ones, malformed files refused with one line, exit 2, nothing
written; the written profile drives --timing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.engine.timing.fitted import BenchFileError, fit_bench, read_profile

runner = CliRunner()
COEF = (6.0, 0.021, 0.05, 1.3e-4)  # a ms, b ms/prefill token, c ms/decode seq, d ms/context token


def synthetic(n=60, coef=COEF, seed=0, jitter_ms=0.0, serial=False, starts=True, osl_max=80):
    """A result file as `vllm bench serve --save-result --save-detailed` writes it, from an
    engine whose every step takes a + b P + c B + d K ms: a step starts when the engine is
    free and has work, admits (prefills whole) every request arrived by then, and decodes
    every running request one token (the rules kvsim's reconstruction assumes)."""
    rng = np.random.default_rng(seed)
    a, b, c, d = coef
    inp = rng.integers(50, 3000, n)
    osl = rng.integers(2, osl_max, n)
    arr = np.sort(rng.uniform(0, 4000.0, n)) if not serial else np.zeros(n)  # ms
    t = 0.0
    waiting = list(range(n))
    running = {}  # request -> tokens emitted
    tok_times = [[] for _ in range(n)]
    done = 0
    while done < n:
        if serial:
            # one request at a time, back to back
            r = waiting.pop(0)
            start = t
            dur = a + b * inp[r]
            t = start + dur
            tok_times[r].append(t)
            arr[r] = start
            for j in range(1, osl[r]):
                t += a + c + d * (inp[r] + j)
                tok_times[r].append(t)
            done += 1
            continue
        if not running and waiting and arr[waiting[0]] > t:
            t = arr[waiting[0]]
        adm = [r for r in waiting if arr[r] <= t]
        waiting = [r for r in waiting if arr[r] > t]
        dec = list(running)
        P = float(sum(inp[r] for r in adm))
        K = float(sum(inp[r] + running[r] for r in dec))
        t = t + a + b * P + c * len(dec) + d * K
        for r in dec:
            tok_times[r].append(t)
            running[r] += 1
            if running[r] >= osl[r]:
                del running[r]
                done += 1
        for r in adm:
            tok_times[r].append(t)
            running[r] = 1
    if jitter_ms:  # the client's timestamps: each token seen late or early by N(0, jitter)
        tok_times = [[x + jitter_ms * rng.standard_normal() for x in tt] for tt in tok_times]
    doc = {"date": "20261128-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B",
           "max_concurrency": 1 if serial else None, "request_rate": "inf",
           "input_lens": [int(x) for x in inp], "output_lens": [int(x) for x in osl],
           "ttfts": [(tok_times[r][0] - arr[r]) / 1e3 for r in range(n)],
           "itls": [[(y - x) / 1e3 for x, y in zip(tok_times[r], tok_times[r][1:])]
                    for r in range(n)],
           "errors": [""] * n, "generated_texts": [""] * n}
    if starts:
        doc["start_times"] = [1000.0 + arr[r] / 1e3 for r in range(n)]
    return doc


def _write(tmp_path, doc, name="result.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def test_exact_coefficients_from_a_synthetic_timeline(tmp_path):
    fit = fit_bench(_write(tmp_path, synthetic()))
    np.testing.assert_allclose(fit.coef, COEF, rtol=1e-6)
    for k in ("step", "ttft", "itl"):
        assert fit.mape[k][1] < 1e-6, (k, fit.mape[k])
    assert fit.requests == 60 and fit.source["reconstruction"] == "timeline"


def test_exact_coefficients_from_a_serial_run_without_start_times(tmp_path):
    fit = fit_bench(_write(tmp_path, synthetic(n=20, serial=True, starts=False)))
    np.testing.assert_allclose(fit.coef, COEF, rtol=1e-6)
    assert fit.source["reconstruction"] == "serial"


def test_noisy_file_reports_mape_and_close_coefficients(tmp_path):
    """Client timestamps jittered by 0.3 ms (a few % of a ~10 ms step): the MAPE is
    reported, the coefficients come out near the true ones."""
    fit = fit_bench(_write(tmp_path, synthetic(n=120, jitter_ms=0.3, seed=3)))
    mean, worst, count = fit.mape["itl"]
    assert 0.005 < mean < 0.08 and count > 1000
    np.testing.assert_allclose(fit.coef[:2], COEF[:2], rtol=0.1)  # a, b well determined
    assert fit.mape["ttft"][0] < 0.1


def test_cli_writes_a_profile_that_drives_timing(tmp_path):
    res_file = _write(tmp_path, synthetic())
    out = tmp_path / "h100-run.toml"
    r = runner.invoke(app, ["calibrate", "--from-vllm-bench", str(res_file), "--out", str(out),
                            "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["timing_model"] == "fitted:h100-run"
    assert set(doc["mape"]) == {"step", "ttft", "itl"}
    coef, prof = read_profile(out)
    np.testing.assert_allclose(coef, COEF, rtol=1e-6)
    assert prof["source"]["sha256"] and prof["source"]["tool"] == "vllm bench serve"
    # the compiled step: a + b P + c B + d K
    from kvsim.engine.engine_model import build_cost_model
    from kvsim.engine.timing.step_time import one_step_us, prefill_cost_us

    cost = build_cost_model("llama-3-8b", "h100-sxm", timing=str(out))
    assert cost.timing_model == "fitted:h100-run"
    fp = cost.as_array()
    got = one_step_us(fp, np.array([1000, 24]), np.array([0, 500]), np.ones(3, np.int64),
                      np.array([100, 200, 300]))
    want = 1000 * (COEF[0] + COEF[1] * 1024 + COEF[2] * 3 + COEF[3] * 600)
    assert got == pytest.approx(want, rel=1e-12)
    assert prefill_cost_us(fp, 0, 16) == pytest.approx(1000 * COEF[1] * 16)
    # text output names the MAPE per metric
    r = runner.invoke(app, ["calibrate", "--from-vllm-bench", str(res_file), "--out",
                            str(tmp_path / "again.toml")])
    assert r.exit_code == 0 and "MAPE" in r.stdout and "itl" in r.stdout


@pytest.mark.parametrize("doc,msg", [
    ("{not json", "not a JSON result file"),
    ("[1, 2]", "expected a JSON object"),
    ({"input_lens": [1]}, "missing output_lens, ttfts, itls"),
    ({"input_lens": [10, 20], "output_lens": [2], "ttfts": [0.1, 0.1], "itls": [[], []]},
     "output_lens: expected a list with one entry per request (2)"),
    ({"input_lens": [10], "output_lens": [2], "ttfts": ["x"], "itls": [[]],
      "start_times": [0.0]}, "request 0: expected numbers"),
    ({"input_lens": [10], "output_lens": [2], "ttfts": [0.1], "itls": [[0.01]],
      "max_concurrency": 8}, "no start_times"),
    ("small", "too little data"),
])
def test_bad_files_exit_2_with_one_line_and_write_nothing(tmp_path, doc, msg):
    if doc == "small":
        doc = synthetic(n=3, osl_max=4)  # at most 9 steps
    p = _write(tmp_path, doc)
    out = tmp_path / "t.toml"
    with pytest.raises(BenchFileError, match="^" + str(p).replace(".", r"\.") + ": "):
        fit_bench(p)
    r = runner.invoke(app, ["calibrate", "--from-vllm-bench", str(p), "--out", str(out)])
    assert r.exit_code == 2, r.output
    err = r.stderr if r.stderr_bytes is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and msg in lines[0], err
    assert not out.exists()


def test_missing_file(tmp_path):
    r = runner.invoke(app, ["calibrate", "--from-vllm-bench", str(tmp_path / "nope.json"),
                            "--out", str(tmp_path / "t.toml")])
    assert r.exit_code == 2 and "no such file" in (r.stderr or r.output)
    assert not (tmp_path / "t.toml").exists()
