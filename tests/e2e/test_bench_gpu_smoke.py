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


def test_bench_gpu_rewards_smoke_runs_its_model_parts_on_the_cpu(tmp_path):
    """bench_gpu_rewards.py's teacher, scalar reward model and judge parts at toy sizes ('algo' starts Ray: the
    reward server and distillation e2e tests cover that path). On the CPU both sides of each comparison are the
    same fp32 computation: the gaps are 0."""
    _bench_gpu()  # bench/ on sys.path
    out = tmp_path / "gpu_rewards.json"
    bench = importlib.import_module("bench_gpu_rewards")
    assert bench.main(["--smoke", "--parts", "teacher,scalar,judge", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["scalar"]["max_abs_logit_gap"] == 0.0
    assert results["judge"]["requests"] == 8 and results["teacher"]["shape_1p5b_micro4"]["tokens_per_s"] > 0
