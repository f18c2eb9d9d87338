"""bench/bench_gpu.py stays runnable where CI runs (no GPU): its parts at toy sizes on the CPU (``--smoke``); the
learner-precision part must show fp32 master weights that every step moves, and the bf16-weights variant the
rounded-away updates the learner no longer has. Figures from a GPU are in BENCHMARKS.md section 27."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
from repo_paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def _bench_gpu():
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module("bench_gpu")


def test_bench_gpu_smoke_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    # 'algo' starts Ray: the e2e algorithm tests cover that path.
    parts = "precision,engine,learner_1p5b,learner_sweep"
    assert _bench_gpu().main(["--smoke", "--parts", parts, "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["precision"]["auto"]["param_dtype"] == "torch.float32"
    sweep = results["learner_sweep"]
    # fp32 master weights: every weight with a gradient moves; weights cast to bf16: only those within ~1e-4 of 0.
    assert sweep["mbt11264_ckpt"]["moved_fraction_after_steps"] > 0.5
    assert sweep["bf16_weights_mbt11264_ckpt"]["moved_fraction_after_steps"] < 0.1
