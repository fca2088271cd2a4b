"""kvsim report: self-contained HTML, PNGs, deterministic, renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from kvsim.analysis.report import FIGURES, build_report, fig_occupancy_time
from kvsim.analysis.sweep import load_occupancy
from kvsim.core.errors import KvsimInputError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_pixels(path):
    import matplotlib.image as mpimg

    return mpimg.imread(path)


def test_html_is_self_contained_with_every_figure(small_sweep, tmp_path):
    rep = build_report(small_sweep.out_dir, tmp_path / "report.html", tmp_path / "png")
    text = rep.html_path.read_text(encoding="utf-8")
    assert rep.figures == list(FIGURES)
    for name in FIGURES:
        assert f"<figure id='{name}'><svg" in text
    assert text.count("<svg") == len(FIGURES)
    # nothing fetched: no scripts, no external references (SVG namespaces are not fetched)
    assert "<script" not in text.lower()
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", text)
    assert all(r.startswith("#") for r in refs), refs
    assert "belady" in text and "lru" in text
    assert [p.name for p in rep.png_paths] == [f"{n}.png" for n in FIGURES]
    for p in rep.png_paths:
        assert p.read_bytes()[:8] == PNG_MAGIC
        img = _png_pixels(p)
        assert img.shape[0] >= 300 and img.shape[1] >= 400
        assert img[..., :3].std() > 0.05  # not blank: lines and text on a white page


def test_occupancy_over_time_draws_each_policy_series(small_sweep, tmp_path):
    table, occ = small_sweep.table, load_occupancy(small_sweep.out_dir)
    fig = fig_occupancy_time(table, occ)  # default cell: the smallest HBM size, 0.06 GB
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    assert titles[0] == "HBM: held by running requests\n(capacity 28 blocks)"
    assert titles[1] == "HBM: cached (evictable)\n(capacity 28 blocks)"
    assert titles[2].startswith("DRAM: resident\n(capacity ")
    assert fig._suptitle.get_text() == "HBM 0.06 GB, DRAM: profile default"
    for ax, col in ((fig.axes[0], "hbm_used_blocks"), (fig.axes[1], "hbm_cached_blocks"),
                    (fig.axes[2], "dram_used_blocks")):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for pol in ("lru", "belady"):  # a line per policy: exactly its cell's series
            key = table[(table.policy == pol) & (table.hbm_gb == 0.06)]["cell"].iloc[0]
            s = occ[occ.cell == key].sort_values("point")
            assert np.array_equal(lines[pol].get_ydata(), s[col].to_numpy())
            assert np.allclose(lines[pol].get_xdata(), s["end_us"].to_numpy() / 1e6)
    # HBM held reaches its 28-block capacity: the capacity line is drawn there
    cap = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}["capacity"]
    assert list(cap.get_ydata()) == [28, 28]
    # another cell on request
    fig2 = fig_occupancy_time(table, occ, hbm_gb=0.2)
    assert fig2._suptitle.get_text().startswith("HBM 0.2 GB")
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(fig2)


def test_report_names_the_occupancy_cell_and_rejects_unknown_ones(small_sweep, tmp_path):
    rep = build_report(small_sweep.out_dir, tmp_path / "r.html", occupancy_hbm_gb=0.2)
    text = rep.html_path.read_text(encoding="utf-8")
    assert "<h2>Tier occupancy over time</h2>" in text
    assert "Cell: HBM 0.2 GB, the profile&#x27;s DRAM" in text
    with pytest.raises(KvsimInputError, match="occupancy_hbm_gb.*0.06, 0.2 GB"):
        build_report(small_sweep.out_dir, tmp_path / "bad.html", occupancy_hbm_gb=0.1)
    with pytest.raises(KvsimInputError, match="occupancy_dram_gb"):
        build_report(small_sweep.out_dir, tmp_path / "bad.html", occupancy_dram_gb=64)
    assert not (tmp_path / "bad.html").exists()


def test_report_of_a_sweep_without_occupancy_series(small_sweep, tmp_path):
    # results.parquet alone (a sweep made before occupancy series): the page still builds,
    # the figure says how to get the series
    shutil.copy(small_sweep.results_path, tmp_path / "results.parquet")
    rep = build_report(tmp_path / "results.parquet", tmp_path / "r.html")
    text = rep.html_path.read_text(encoding="utf-8")
    assert text.count("<svg") == len(FIGURES)
    assert "No occupancy series in this sweep" in text


def test_report_is_deterministic(small_sweep, tmp_path):
    a = build_report(small_sweep.results_path, tmp_path / "a.html", tmp_path / "pa")
    b = build_report(small_sweep.results_path, tmp_path / "b.html", tmp_path / "pb")
    assert a.html_path.read_bytes() == b.html_path.read_bytes()
    for pa, pb in zip(a.png_paths, b.png_paths):
        assert pa.read_bytes() == pb.read_bytes()


def test_bad_results(tmp_path):
    with pytest.raises(KvsimInputError, match="sweep directory"):
        build_report(tmp_path, tmp_path / "r.html")
    bad = tmp_path / "results.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(KvsimInputError, match="Parquet"):
        build_report(bad, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_renders_in_headless_chromium(small_sweep, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed (apt-get install -y chromium); the HTML render "
                    "check needs a headless browser")
    rep = build_report(small_sweep.out_dir, tmp_path / "report.html")
    shot = tmp_path / "screenshot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={shot}",
                        "--window-size=1400,2000", rep.html_path.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == PNG_MAGIC
    img = _png_pixels(shot)[..., :3]
    assert img.shape[:2] == (2000, 1400)
    # the plots drew: many non-white pixels and several distinct line colours
    non_white = (img < 0.95).any(axis=2)
    assert non_white.mean() > 0.02
    colours = {tuple(np.round(c, 1)) for c in img[non_white][::50]}
    assert len(colours) >= 5
    keep = tmp_path.parent / "report_screenshot.png"
    shutil.copy(shot, keep)  # kept beside the test's tmp dir for a human to look at
