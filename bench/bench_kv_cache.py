"""The HF engine's preallocated KV cache against transformers' DynamicCache, same engine, same prompts, one run.

    python bench/bench_kv_cache.py                 # ~19 M-parameter model, 4 prompts x 8 samples x 128 tokens
    python bench/bench_kv_cache.py --tokens 512    # longer responses (the cache copy grows with length)
    python bench/bench_kv_cache.py --smoke         # CI: the tiny random model, one short round

Both paths are ``HFEngine`` on one model object (one thread); only ``kv_cache`` differs. Rounds alternate between
the two paths so that a shared machine slows both alike; medians are reported. The responses never stop early
(the model's eos cannot be sampled), so both paths generate the same number of tokens. Seeded sampling: the two
caches give the same logits up to float rounding, so the sampled tokens agree almost everywhere (printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import common


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the ~19 M-parameter bench model)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: tiny sizes, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.samples, args.tokens, args.rounds = 2, 2, 8, 1
    common.setup_process()
    common.print_header("bench_kv_cache", args)

    import numpy as np

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.models.tiny import load_tiny

    path = args.model or common.long_response_model("tiny" if args.smoke else "gen")
    model, tok = load_tiny(path)
    engines = {name: HFEngine(model, tok, kv_cache=name) for name in ("dynamic", "preallocated")}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 30, size=8).tolist() for _ in range(args.prompts)]
    times: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(args.rounds + (0 if args.smoke else 1)):  # round 0 warms up
        for name, engine in engines.items():
            params = SamplingParams(max_new_tokens=args.tokens, seed=r)
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.samples, params)
            dt = time.perf_counter() - t0
            if r > 0 or args.smoke:
                times[name].append(dt)
            tokens[name] = [c.token_ids for row in out for c in row]
    n_tok = sum(len(t) for t in tokens["preallocated"])
    pairs = zip(tokens["dynamic"], tokens["preallocated"], strict=True)
    same = float(np.mean([a == b for x, y in pairs for a, b in zip(x, y, strict=False)]))
    med = {name: common.median(v) for name, v in times.items()}
    rows = [[name, med[name], n_tok / med[name]] for name in engines]
    print(common.markdown_table(["kv cache", "s per generate (median)", "tokens/s"], rows))
    ratio = med["dynamic"] / med["preallocated"]
    print(f"\npreallocated / dynamic tokens/s: {ratio:.2f}  (same sampled token: {same:.3f} of positions)")
    print(f"({common.load_note()})")
    common.write_json(
        args.json, {"median_s": med, "tokens": n_tok, "speedup": ratio, "same_token_frac": same}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
