"""`r3 report` in a real browser: headless Chromium (Debian's `chromium`; scripts/test.sh installs it where apt can)
renders the page of a hand-made run (tests/report_run.py), runs its script, and takes a screenshot: the rendered
DOM has every sample and every shaded token, and the screenshot is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from report_run import make_run

from r3_rllib.cli import main as r3_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (scripts/test.sh installs Debian's)"),
]
# Root in CI containers: Chromium's own sandbox needs user namespaces it may not get there.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2400"]


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=timeout, check=True
    )


def test_report_renders_samples_and_shaded_tokens_in_chromium(tmp_path):
    run = make_run(tmp_path)
    out = tmp_path / "report.html"
    assert r3_main(["report", str(run), "-o", str(out)]) == 0
    url = out.resolve().as_uri()

    dom = _chromium("--dump-dom", url).stdout
    # Rendered rows (the script's own template has "${" where a row has a number): 2 iterations x 2 groups x 2.
    assert len(re.findall(r'<div class="sample"><div class="meta">iteration \d', dom)) == 8
    tokens = re.findall(
        r'<span class="tok" title="entropy ([0-9.]+)" style="background:\s*(rgba\([^)]*\))', dom
    )
    assert len(tokens) == 16
    # Entropy 2.5 shades darker than 0.2 (alpha = entropy / 3, capped at 1).
    alphas = {float(e): float(c.rstrip(")").split(",")[-1]) for e, c in tokens}
    assert alphas[2.5] > alphas[0.2] > 0
    assert "8 of 8 shown" in dom
    assert "<svg" in dom and "fired at 3" in dom

    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", url)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1200
    assert float(np.std(pixels[..., :3])) > 0.05  # curves, tables and text: far from a blank page
