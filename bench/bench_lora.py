"""LoRA against full fine-tuning on SmolLM2-135M-Instruct: the learner's peak memory, update time and the bytes one
weight sync ships to the runners, on the same batch.

    python bench/bench_lora.py                 # rank 16, all-linear; 8 samples of 48 + 24 tokens, 3 timed updates
    python bench/bench_lora.py --smoke         # CI: the shipped tiny model, one timed update

Each mode runs in its own process (so its peak resident set size, Linux VmHWM, is its own): it builds the learner
(`R3Learner`, one process, the learner's defaults for a pretrained model: gradient checkpointing on), runs one
warm-up update (AdamW allocates its state there) and then the timed updates on the same batch of random token ids
with +-1 advantages. Reported per mode: trainable parameters, AdamW state bytes, peak RSS over the timed updates
(the learner's own `peak_rss_gb` metric: model, gradients, optimizer state and activations), median update time,
and the bytes of one weight sync (`weights_ref`'s payload: the full state dict, or the LoRA adapter).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence

import common

from r3_rllib.types import TrainingBatch

MODES = {"full fine-tuning": 0, "LoRA": None}  # None: --rank


def _samples(n: int, prompt: int, response: int, vocab: int, seed: int) -> list:
    import numpy as np

    from r3_rllib.types.samples import Sample

    rng = np.random.default_rng(seed)
    return [
        Sample(
            query_id=f"q{i // 4}",
            prompt_ids=rng.integers(10, vocab, size=prompt).tolist(),
            response_ids=rng.integers(10, vocab, size=response).tolist(),
            behavior_logprobs=np.full(response, -5.0, dtype=np.float32),
            entropies=np.zeros(response, dtype=np.float32),
            reward=float(i % 2),
            correct=bool(i % 2),
            truncated=False,
            policy_version=0,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(n)
    ]


def run_child(args: argparse.Namespace) -> dict:
    """One mode in this process: build the learner, warm up, time the updates, measure the sync payload."""
    common.setup_process(threads=args.threads)
    import time

    import gymnasium as gym

    from r3_rllib import R3Config
    from r3_rllib.algorithms.r3.weight_sync import pack_weights

    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0)
        .training(
            model_path=args.model,
            lr=1e-5,
            micro_batch_max_tokens=None,
            micro_batch_size=args.samples,
            lora_rank=args.child_rank,
            lora_alpha=2.0 * args.rank,
            lora_target_modules="all-linear",
        )
    )
    space = gym.spaces.Text(8)
    learner = cfg.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    vocab = int(learner.policy.config.vocab_size)
    samples = _samples(args.samples, args.prompt, args.response, vocab, seed=0)
    learner.update_from_samples(
        TrainingBatch.from_samples(samples), seed=0
    )  # warm-up: AdamW's state is allocated here
    times, peaks = [], []
    for i in range(args.updates):
        t0 = time.perf_counter()
        metrics = learner.update_from_samples(TrainingBatch.from_samples(samples), seed=i + 1)
        times.append(time.perf_counter() - t0)
        peaks.append(metrics["peak_rss_gb"])
    if learner._lora is not None:
        payload = pack_weights(learner.adapter_state_dict())
    else:
        payload = pack_weights(learner.full_state_dict(copy=False))
    optim_bytes = sum(
        t.numel() * t.element_size()
        for state in learner._optimizer.state.values()
        for t in state.values()
        if hasattr(t, "numel") and t.dim() > 0
    )
    return {
        "trainable": sum(p.numel() for p in learner.policy.parameters() if p.requires_grad),
        "params": sum(p.numel() for p in learner.policy.parameters()),
        "optim_bytes": optim_bytes,
        "peak_rss_gb": max(peaks),
        "update_s": common.median(times),
        "update_times": times,
        "sync_bytes": payload.nbytes,
        "sync_metric": metrics["weight_sync_bytes"],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 * rank)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=48, help="prompt tokens per sample")
    ap.add_argument("--response", type=int, default=24, help="response tokens per sample")
    ap.add_argument("--updates", type=int, default=3, help="timed updates per mode (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="the shipped tiny model, one timed update")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.samples, args.prompt, args.response, args.updates = 4, 8, 4, 1
    return args


def _model_path(args: argparse.Namespace) -> str | None:
    if args.smoke:
        return common.tiny_model_path()
    from r3_rllib.models.smollm2 import ModelUnavailableError, build_smollm2

    try:
        return str(build_smollm2(download=False))
    except ModelUnavailableError as e:
        print(f"bench_lora: SmolLM2-135M is not available: {e}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(run_child(args)), flush=True)
        return 0
    common.setup_process(threads=args.threads)
    model = _model_path(args)
    if model is None:
        return 2
    common.print_header("bench_lora", args)
    results = {}
    for mode, rank in MODES.items():
        rank = args.rank if rank is None else rank
        cmd = [sys.executable, __file__, *(argv or sys.argv[1:]), "--child", mode, "--model", model]
        out = subprocess.run(cmd + ["--child-rank", str(rank)], capture_output=True, text=True, check=False)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"bench_lora: mode {mode!r} failed (exit {out.returncode})")
        results[mode] = json.loads(lines[-1].removeprefix("RESULT "))
    rows = [
        [
            mode,
            f"{r['trainable'] / 1e6:.2f} M of {r['params'] / 1e6:.1f} M",
            f"{r['optim_bytes'] / 1e6:.1f}",
            f"{r['peak_rss_gb']:.2f}",
            f"{r['update_s']:.2f}",
            f"{r['sync_bytes'] / 1e6:.2f}",
        ]
        for mode, r in results.items()
    ]
    headers = ["mode", "trainable params", "AdamW state MB", "peak RSS GB", "update s (median)", "sync MB"]
    print(common.markdown_table(headers, rows))
    common.write_json(args.json, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
