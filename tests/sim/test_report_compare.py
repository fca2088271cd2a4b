"""`kvsim compare --html` and `kvsim report` on a compare's --parquet: one self-contained,
deterministic page (per-policy bars, latency CDFs, per-tier traffic) that renders in
headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.analysis.report_compare import (
    build_compare_report,
    figures_with_data,
    is_compare_table,
    zoomed_limits,
)
from kvsim.analysis.sweep import LATENCY_QUANTILES
from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from tests.sim.test_cli import _trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


@pytest.fixture
def compared(builder, tiny_hw, tmp_path):
    trace = _trace(builder, tmp_path / "t.parquet")
    rows = tmp_path / "rows.parquet"
    page = tmp_path / "report.html"
    res = runner.invoke(app, ["compare", "--trace", str(trace), "--policies",
                              "lru,fifo,belady", "--hardware", tiny_hw, "--hbm-blocks", "4",
                              "--engine", "interpreted", "--parquet", str(rows), "--html",
                              str(page)])
    assert res.exit_code == 0, res.output
    return rows, page


def test_page_is_self_contained_with_every_figure(compared):
    rows, page = compared
    text = page.read_text(encoding="utf-8")
    shown = figures_with_data(pd.read_parquet(rows))
    for name in shown:
        assert f"<figure id='{name}'><svg" in text
    assert text.count("<svg") == len(shown) >= 2
    # the answer first (issue #33): the recommendation precedes every figure
    assert text.index("Recommendation: ") < text.index("<figure")
    assert "fraction" not in text  # percentages throughout
    assert "<script" not in text.lower()
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", text)
    assert all(r.startswith("#") for r in refs), refs
    assert "belady (offline bound)" in text and "lru, fifo" in text  # grouped, bound named
    df = pd.read_parquet(rows)  # the CDFs' data: quantiles at LATENCY_QUANTILES
    assert len(df["step_latency_q_us"].iloc[0]) == len(LATENCY_QUANTILES)


def test_report_command_redraws_it_from_the_parquet_deterministically(compared, tmp_path):
    rows, _ = compared
    assert is_compare_table(rows)
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    for out in (a, b):
        res = runner.invoke(app, ["report", str(rows), "--out", str(out)])
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"policy": ["x"]}).to_parquet(bad)
    with pytest.raises(KvsimInputError, match="missing columns offline"):
        build_compare_report(bad, tmp_path / "c.html")
    assert not (tmp_path / "c.html").exists()


def test_renders_in_headless_chromium(compared, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed (.ci/run installs Debian's chromium when run as "
                    "root; otherwise apt-get install -y chromium); the render check needs "
                    "a headless browser")
    _, page = compared
    shot = tmp_path / "screenshot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={shot}",
                        "--window-size=1400,2000", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (2000, 1400)
    non_white = (img < 0.95).any(axis=2)
    assert non_white.mean() > 0.02  # bars, lines and text drew
    assert len({tuple(np.round(c, 1)) for c in img[non_white][::50]}) >= 4
    shutil.copy(shot, tmp_path.parent / "compare_report_screenshot.png")  # for a human


def test_panels_without_data_are_dropped_and_hit_rates_zoomed():
    """Issue #33: no decode-critical panel when every policy has 0; no CXL legend when
    nothing moved to CXL; the hit-rate axis zoomed onto 58-60 %, not 0-100 %."""
    from kvsim.analysis.report_compare import _bar_panels, _traffic

    df = pd.DataFrame({"policy": ["lru", "fifo", "belady"], "offline": [False, False, True],
                       "hbm_hit_rate": [0.58, 0.60, 0.61],
                       "decode_critical_misses": [0, 0, 0], "ttft_p99_us": [1e6, 2e6, 1e6],
                       "deadline_misses": [0, 0, 0], "bytes_dram_link": [1e9, 2e9, 1e9],
                       "bytes_cxl_link": [0.0, 0.0, 0.0], "evictions_hbm": [5, 6, 4],
                       "spills_hbm": [1, 2, 1], "evictions_cxl": [0, 0, 0],
                       "spills_cxl": [0, 0, 0], "bound_claim": [None, None, "bound"]})
    assert [c for c, _, _ in _bar_panels(df)] == ["hbm_hit_rate", "ttft_p99_us"]
    _, links, tiers = _traffic(df)
    assert "CXL" not in {t[1] for t in tiers}
    assert [col for col, _, _ in links] == ["bytes_dram_link"]
    lo, hi = zoomed_limits([58.0, 60.0, 61.0])
    assert (lo, hi) == pytest.approx((57.5, 61.5))  # range 3 pp, margin at least 0.5
    assert figures_with_data(df) == ["policy_bars", "tier_traffic"]  # no quantiles: no CDFs
