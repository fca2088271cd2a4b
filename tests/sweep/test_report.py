"""kvsim report: self-contained HTML, PNGs, deterministic, renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from kvsim.errors import KvsimInputError
from kvsim.report import FIGURES, build_report

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
