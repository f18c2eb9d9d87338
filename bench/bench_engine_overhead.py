"""Generation through our EnvRunner against the same engine called directly, on the same prompts, in one run.

    python bench/bench_engine_overhead.py                    # tiny + gen model, HF and vLLM engines
    python bench/bench_engine_overhead.py --engines hf --models tiny
    python bench/bench_engine_overhead.py --smoke            # CI: HF engine, tiny sizes, one round

For each (model, engine) pair an algorithm is built (GRPO preset, one remote EnvRunner) and, in the driver process,
the same engine class is built on the same model folder. Each round:

1. ``runner.sample(num_queries=Q)`` through ``algo.env_runner_group`` (what ``algo.train()`` calls), timed from the
   driver: env resets, tokenization, engine call, grading, building the groups and returning them through Ray;
2. ``engine.generate`` called directly on exactly the prompts the runner just used, with the same sampling params.

Reported: generated tokens/s of (a) the runner seen from the driver, (b) the engine call inside the runner (its own
timer), (c) the direct engine call; the ratios (a)/(c) and (b)/(c) (target >= 0.9); and, from two ``algo.train()``
iterations, tokens/s over the algorithm's ``sample_s`` timer. For the HF engine, stock transformers ``generate`` on
the same prompts is timed too (a reference for the engine's own decode loop). Sampling draws different tokens in the two paths, so
token counts differ when responses stop at eos (tiny model); the ``gen`` model never stops early.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import common


def transformers_generate_rate(model, prompts: list[list[int]], n: int, max_new_tokens: int, tok) -> float:
    """Tokens/s of stock ``model.generate`` (sampling, ``num_return_sequences=n``) on the same prompts: a reference
    for the HF engine's own decode loop (which also returns log-probs and entropies)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    dt = time.perf_counter() - t0
    comp = out[:, width:]
    is_eos = comp == tok.eos_token_id
    lengths = torch.where(
        is_eos.any(1),
        is_eos.int().argmax(1) + 1,
        torch.full_like(is_eos[:, 0], comp.shape[1], dtype=torch.long),
    )
    return float(lengths.sum()) / dt


def measure(model_name: str, model_path: str, engine: str, args) -> dict[str, Any]:
    import numpy as np

    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.models.tiny import load_tokenizer

    q, g, length = (
        (args.queries, args.group_size, args.tiny_tokens)
        if model_name == "tiny"
        else (args.gen_queries, args.group_size, args.gen_tokens)
    )
    config = common.grpo_config(
        model_path,
        engine=engine,
        group_size=g,
        queries=q,
        max_new_tokens=length,
        seed=args.seed,
        rank_all_wrong=model_name != "tiny",
    )
    algo = config.build_algo()
    tok = load_tokenizer(model_path)
    direct = make_engine(engine, model_path, tok, dtype="float32")
    stop = (tok.eos_token_id,)
    rows: dict[str, list[float]] = {"runner_e2e": [], "runner_engine": [], "direct": [], "hf_generate": []}
    try:
        for r in range(args.warmup + args.rounds):
            t0 = time.perf_counter()
            out = algo.env_runner_group.foreach_env_runner(
                lambda runner, _q=q: runner.sample(num_queries=_q), local_env_runner=False
            )[0]
            runner_s = time.perf_counter() - t0
            prompts = [grp.samples[0].prompt_ids for grp in out.groups]
            params = SamplingParams(
                max_new_tokens=length, temperature=1.0, stop_token_ids=stop, seed=10_000 + r
            )
            t0 = time.perf_counter()
            comps = direct.generate(prompts, g, params)
            direct_s = time.perf_counter() - t0
            direct_tokens = sum(len(c.token_ids) for cs in comps for c in cs)
            if engine == "hf":
                rows["hf_generate"].append(transformers_generate_rate(direct.model, prompts, g, length, tok))
            if r < args.warmup:
                rows["hf_generate"] = []
                continue
            tokens = out.generated_tokens
            rows["runner_e2e"].append(tokens / runner_s)
            rows["runner_engine"].append(tokens / out.timings.generate_s)
            rows["direct"].append(direct_tokens / direct_s)
        train_rates = []
        for _ in range(args.train_iterations):
            result = algo.train()
            ph = common.phases_from_result(result, q * g)
            train_rates.append(ph["gen_tokens"] / result["timers_s"]["sample_s"])
    finally:
        algo.stop()
        direct.shutdown()
    med = {k: common.median(v) for k, v in rows.items()}
    return {
        "model": model_name,
        "engine": engine,
        "Q": q,
        "G": g,
        "max_new_tokens": length,
        "runner_e2e_tok_s": med["runner_e2e"],
        "runner_engine_tok_s": med["runner_engine"],
        "direct_tok_s": med["direct"],
        "hf_generate_tok_s": common.median(rows["hf_generate"]) if rows["hf_generate"] else float("nan"),
        "train_sample_tok_s": common.median(train_rates) if train_rates else float("nan"),
        "ratio_e2e": med["runner_e2e"] / med["direct"],
        "ratio_engine": med["runner_engine"] / med["direct"],
        "ratio_train": (common.median(train_rates) / med["direct"]) if train_rates else float("nan"),
        "rounds": len(rows["direct"]),
        "spread_direct": float(np.ptp(rows["direct"])) if rows["direct"] else float("nan"),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument(
        "--models", default="tiny,gen", help="tiny: shipped model; gen: ~19 M random, long responses"
    )
    ap.add_argument("--model", default=None, help="folder for the 'tiny' entry (default: the shipped model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--train-iterations", type=int, default=2)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tiny-tokens", type=int, default=8)
    ap.add_argument("--gen-queries", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: HF engine, tiny model, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.engines, args.models, args.rounds, args.warmup, args.train_iterations = "hf", "tiny", 1, 0, 1
        args.queries, args.group_size = 2, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common)
    common.print_header("bench_engine_overhead", args)
    started = common.start_ray()
    results = []
    try:
        for model_name in args.models.split(","):
            if model_name == "tiny":
                path = args.model or common.tiny_model_path()
            else:
                path = common.long_response_model("gen")
            for engine in args.engines.split(","):
                print(f"measuring {model_name} / {engine} ...", flush=True)
                results.append(measure(model_name, path, engine, args))
                print(f"  {results[-1]}  ({common.load_note()})", flush=True)
    finally:
        common.stop_ray(started)
    print()
    print(
        common.markdown_table(
            [
                "model / engine",
                "Q x G x max tokens",
                "runner via Ray (tok/s)",
                "engine inside runner",
                "direct engine",
                "runner/direct",
                "inside/direct",
                "train() sample_s tok/s",
                "train/direct",
                "transformers generate",
            ],
            [
                [
                    f"{r['model']} / {r['engine']}",
                    f"{r['Q']} x {r['G']} x {r['max_new_tokens']}",
                    r["runner_e2e_tok_s"],
                    r["runner_engine_tok_s"],
                    r["direct_tok_s"],
                    r["ratio_e2e"],
                    r["ratio_engine"],
                    r["train_sample_tok_s"],
                    r["ratio_train"],
                    r["hf_generate_tok_s"],
                ]
                for r in results
            ],
        )
    )
    print(f"({common.load_note()})")
    common.write_json(
        args.json, {"machine": common.machine(), "versions": common.versions(), "results": results}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
