"""The learner's micro-batching: one sequence per pass, fixed rows per pass, and the token budget, one run.

    python bench/bench_micro_batches.py                  # ~19 M-parameter model, 64 responses of 8-512 tokens
    python bench/bench_micro_batches.py --max-len 1024
    python bench/bench_micro_batches.py --smoke          # CI: the tiny random model, one round

Reasoning responses have long-tailed lengths, so how a minibatch is cut into forward/backward passes decides how
many passes run and how much padding they compute. Each path does what the learner does per minibatch on one
rank: cut the samples into micro-batches, pack each (right padding), `token_logprobs`, a token-mean loss,
backward. Paths:

- ``rows=1``: ``micro_batch_size=1`` (no padding, one pass per sequence; the 1.5B configs' earlier setting);
- ``rows=R``: ``micro_batch_size=R`` in sample order (each pass padded to its longest row);
- ``budget``: ``micro_batch_max_tokens`` = the longest sequence, so its peak size equals ``rows=1``'s worst pass.

Response lengths are drawn from a log-normal (median ~1/4 of the limit) and clipped to the limit; a fixed seed
gives every path the same samples. Rounds alternate between paths; medians are reported.
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
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512, help="response length limit")
    ap.add_argument("--rows", type=int, default=8, help="rows per pass of the fixed-rows path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: tiny sizes, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.samples, args.prompt_len, args.max_len, args.rows, args.rounds = 8, 8, 32, 4, 1
    common.setup_process()
    common.print_header("bench_micro_batches", args)

    import numpy as np

    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.core.batching import token_budget_chunks
    from r3_rllib.core.logprobs import token_logprobs
    from r3_rllib.models.tiny import load_tiny
    from r3_rllib.types.samples import Sample

    path = args.model or common.long_response_model("tiny" if args.smoke else "gen")
    model, tok = load_tiny(path)
    model.train()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(args.max_len / 4), 0.8, args.samples), 8, args.max_len).astype(int)
    vocab = model.config.vocab_size
    samples = [
        Sample(
            query_id=str(i),
            prompt_ids=rng.integers(5, vocab, args.prompt_len).tolist(),
            response_ids=rng.integers(5, vocab, n).tolist(),
            behavior_logprobs=np.zeros(n, dtype=np.float32),
            entropies=np.zeros(n, dtype=np.float32),
            reward=0.0,
            correct=False,
            truncated=False,
            policy_version=0,
            advantage=float(rng.normal()),
        )
        for i, n in enumerate(lengths)
    ]
    seq_lens = [args.prompt_len + int(n) for n in lengths]
    index = np.arange(len(samples))
    plans = {
        "rows=1": [index[i : i + 1] for i in index],
        f"rows={args.rows}": np.array_split(index, int(np.ceil(len(index) / args.rows))),
        "budget": token_budget_chunks(seq_lens, max(seq_lens)),
    }
    n_tokens = int(sum(lengths))

    def run(plan) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for chunk in plan:
            packed = pack_samples([samples[i] for i in chunk], tok.pad_token_id or 0, "cpu")
            logp, _ = token_logprobs(model, packed["input_ids"], packed["attention_mask"])
            mask = packed["response_mask"]
            loss = -(logp * packed["advantages"][:, None] * mask).sum() / n_tokens
            loss.backward()
        return time.perf_counter() - t0

    paths = {name: (lambda plan=plan: run(plan)) for name, plan in plans.items()}
    med = common.alternating_medians(paths, args.rounds, warmup=not args.smoke)
    rows = []
    for name, plan in plans.items():
        padded = sum(len(c) * max(seq_lens[i] for i in c) for c in plan)
        rows.append([name, len(plan), f"{1 - sum(seq_lens) / padded:.0%}", med[name], n_tokens / med[name]])
    print(f"response lengths: median {int(np.median(lengths))}, max {int(lengths.max())}, sum {n_tokens}")
    print(common.markdown_table(["path", "passes", "padding", "s (median)", "response tokens/s"], rows))
    speedup = {name: med["rows=1"] / med[name] for name in plans}
    print("\nspeed-up over rows=1: " + ", ".join(f"{name} {v:.2f}x" for name, v in speedup.items()))
    print(f"({common.load_note()})")
    common.write_json(args.json, {"median_s": med, "speedup_over_rows1": speedup, "tokens": n_tokens})
    return 0


if __name__ == "__main__":
    sys.exit(main())
