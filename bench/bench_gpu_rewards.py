"""The reward server's models and the distillation teacher on a CUDA GPU: what only a GPU machine shows.

    python bench/bench_gpu_rewards.py --out gpu_rewards.json     # every part (one GPU, ~3 min on an H100)
    python bench/bench_gpu_rewards.py --smoke                    # the same code at toy sizes on the CPU

Parts:

- ``teacher``: the teacher's scorer (``r3_rllib.distill.teacher.TeacherScorer``: bf16 autocast on the GPU) against
  the same scorer on the CPU in fp32, on responses the shipped tiny model sampled (mean and max |log-prob
  difference|); then a randomly initialised teacher of DeepSeek-R1-Distill-Qwen-1.5B's shape scoring 16 rows of
  1,024 prompt + 3,072 response tokens: tokens/s and peak GPU memory per micro-batch size (what a teacher of the
  user's target size costs per iteration).
- ``scalar``: a tiny one-label sequence classifier (``ScalarRewardModel``) on the GPU against the CPU: the largest
  |logit difference| over 64 responses, and responses/s.
- ``judge``: a generative judge (``GenerativeJudge``, the HF engine on the GPU) on the shipped tiny model: seconds
  per request (the tiny model writes no verdicts: the path, not the verdicts).
- ``algo``: a whole run on the GPU: ``grpo_preset()`` on 2-digit arithmetic, 2 EnvRunners (HF engine, 0.2 GPU each),
  one learner (0.4 GPU), overlap_generation, a reward server worker (0.1 GPU) holding a scalar reward model term
  (weight 0.1) beside the env's reward, and a distillation teacher (the shipped tiny model, 0.1 GPU, advantage
  mode): 3 iterations, with the reward server's and the teacher's metrics of each.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_gpu
import common
import numpy as np


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _sampled_rows(n: int, max_new: int) -> list[tuple[list[int], list[int], None]]:
    """``n`` (prompt ids, response ids, no mask) rows the shipped tiny model sampled at T = 1 on the CPU."""
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    env = ArithmeticEnv(digits=2, num_queries=n, seed=0)
    from r3_rllib.models import load_tiny

    model, tok = load_tiny(common.tiny_model_path())
    engine = HFEngine(model, tok)
    prompts = []
    for _ in range(n):
        obs, _ = env.reset()
        prompts.append(tok(obs, add_special_tokens=False)["input_ids"])
    groups = engine.generate(prompts, 1, SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=0))
    return [(list(p), list(g[0].token_ids), None) for p, g in zip(prompts, groups, strict=True)]


def part_teacher(smoke: bool) -> dict[str, Any]:
    import torch

    from r3_rllib.distill.teacher import TeacherScorer

    rows = _sampled_rows(8 if smoke else 64, 16)
    scorer = TeacherScorer(common.tiny_model_path(), temperature=1.0, micro_batch_size=16)
    on_device = scorer.score(rows) if _device() == "cuda" else None
    scorer.model.to("cpu")  # the same scorer on the CPU in fp32 (autocast is on only for CUDA)
    scorer.device = torch.device("cpu")
    on_cpu = scorer.score(rows)
    out: dict[str, Any] = {"rows": len(rows), "tokens": int(sum(len(r[1]) for r in rows))}
    if on_device is not None:
        gap = np.abs(np.concatenate(on_device) - np.concatenate(on_cpu))
        out.update(mean_abs_gap=float(gap.mean()), max_abs_gap=float(gap.max()))
    shape = bench_gpu.SMOKE_SHAPE if smoke else bench_gpu.R1_DISTILL_1P5B
    prompt, response, n_rows = (16, 32, 4) if smoke else (1024, 3072, 16)
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_gpu._build_1p5b(shape, Path(tmp) / "teacher")
        rng = np.random.default_rng(0)
        big = [
            (rng.integers(3, 100, prompt).tolist(), rng.integers(3, 100, response).tolist(), None)
            for _ in range(n_rows)
        ]
        for micro in (1, 4):
            scorer = TeacherScorer(path, temperature=0.6, micro_batch_size=micro)
            if _device() == "cuda":
                torch.cuda.reset_peak_memory_stats()
            scorer.score(big[:micro])  # warm-up
            start = time.perf_counter()
            scorer.score(big)
            if _device() == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            out[f"shape_1p5b_micro{micro}"] = {
                "seconds": seconds,
                "tokens_per_s": n_rows * (prompt + response) / seconds,
                "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if _device() == "cuda" else None,
            }
            print("  teacher", micro, out[f"shape_1p5b_micro{micro}"], flush=True)
            del scorer
    return out


def _classifier_folder(folder: Path) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from r3_rllib.models.tiny import build_tiny_tokenizer, save_tiny

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return str(save_tiny(Qwen2ForSequenceClassification(config).eval(), tok, folder))


def part_scalar(smoke: bool) -> dict[str, Any]:
    import torch

    from r3_rllib.reward_models.scalar import ScalarRewardModel
    from r3_rllib.reward_models.specs import RewardModelSpec
    from r3_rllib.rewards.scoring import RewardRequest

    n = 8 if smoke else 64
    with tempfile.TemporaryDirectory() as tmp:
        spec = RewardModelSpec(name="rm", type="scalar", model=_classifier_folder(Path(tmp) / "rm"))
        requests = [RewardRequest(str(i), f"{i}+{i}=", str(2 * i + i % 3), 0.0, False) for i in range(n)]
        scorer = ScalarRewardModel(spec)
        scorer.score(requests[:2])  # warm-up
        start = time.perf_counter()
        on_device = [s.value for s in scorer.score(requests)]
        seconds = time.perf_counter() - start
        scorer.model.to(device="cpu", dtype=torch.float32)  # the reference: fp32 on the CPU
        scorer.device = torch.device("cpu")
        on_cpu = [s.value for s in scorer.score(requests)]
    return {
        "responses": n,
        "responses_per_s": n / seconds,
        "max_abs_logit_gap": float(np.max(np.abs(np.asarray(on_device) - np.asarray(on_cpu)))),
    }


def part_judge(smoke: bool) -> dict[str, Any]:
    """A generative judge (HF engine on the GPU) on the shipped tiny model: seconds per request and the reasons
    (the tiny model writes no verdicts: this measures the path, not the verdicts)."""
    from collections import Counter

    from r3_rllib.reward_models.judge import GenerativeJudge
    from r3_rllib.reward_models.specs import RewardModelSpec
    from r3_rllib.rewards.scoring import RewardRequest

    n = 8 if smoke else 64
    spec = RewardModelSpec(name="judge", type="judge", model=common.tiny_model_path(), max_new_tokens=32)
    judge = GenerativeJudge(spec)
    requests = [RewardRequest(str(i), f"{i}+{i}=", str(2 * i), 0.0, False, gold=str(2 * i)) for i in range(n)]
    judge.score(requests[:2])  # warm-up
    start = time.perf_counter()
    scores = judge.score(requests)
    seconds = time.perf_counter() - start
    return {
        "requests": n,
        "seconds_per_request": seconds / n,
        "reasons": dict(Counter(str(s.reason) for s in scores)),
    }


def part_algo(smoke: bool) -> dict[str, Any]:
    import r3_rllib  # noqa: F401  (registers R3)

    gpu = _device() == "cuda"
    # 2 runners, 1 learner, a reward worker and a teacher worker (1 CPU each) and the driver's share
    started = common.start_ray(num_cpus=12 if gpu else 6)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rm = _classifier_folder(Path(tmp) / "rm")
            config = common.grpo_config(
                common.tiny_model_path(),
                queries=16,
                max_new_tokens=8,
                lr=1e-4,
                engine_kwargs={"device": "cuda"} if gpu else {},
            )
            config.env_runners(num_env_runners=2, num_gpus_per_env_runner=0.2 if gpu else 0)
            config.learners(num_learners=1, num_gpus_per_learner=0.4 if gpu else 0)
            config.training(
                overlap_generation=True,
                reward_models=[{"name": "rm", "type": "scalar", "model": rm, "weight": 0.1}],
                reward_num_gpus_per_worker=0.1 if gpu else 0,
                distill_teacher=common.tiny_model_path(),
                distill_num_gpus_per_worker=0.1 if gpu else 0,
            )
            algo = config.build_algo()
            rows = []
            for _ in range(1 if smoke else 3):
                t0 = time.perf_counter()
                result = algo.train()
                flat = bench_gpu._flat(result)
                rows.append(
                    {
                        "seconds": time.perf_counter() - t0,
                        "accuracy": result.get("rollout", {}).get("accuracy"),
                        **{k: v for k, v in flat.items() if k.startswith(("reward_server/", "distill/"))},
                        **{k: v for k, v in flat.items() if "distill" in k and k.startswith("learner")},
                    }
                )
                print("  algo iteration", rows[-1], flush=True)
            algo.stop()
        return {"iterations": rows}
    finally:
        common.stop_ray(started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="teacher,scalar,judge,algo")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on any device")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    common.setup_process(threads=4)
    common.print_header("reward models and the distillation teacher on a GPU", args)
    import torch

    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    parts = {"teacher": part_teacher, "scalar": part_scalar, "judge": part_judge, "algo": part_algo}
    return bench_gpu.run_parts(
        {k: functools.partial(f, args.smoke) for k, f in parts.items()},
        args.parts.split(","),
        results,
        args.out,
    )


if __name__ == "__main__":
    sys.exit(main())
