"""What loading a checkpoint's driver state through the checked unpickler costs, against plain ``pickle.loads``.

    python bench/bench_safe_pickle.py              # replay-shaped state: 100k samples x 256 tokens (~211 MB)
    python bench/bench_safe_pickle.py --smoke      # CI: 1k samples, one rep
    git show REV:r3_rllib/algorithms/r3/safe_pickle.py > /tmp/safe_pickle_rev.py
    python bench/bench_safe_pickle.py --also /tmp/safe_pickle_rev.py   # another version's safe_loads beside

``r3_rllib.algorithms.r3.safe_pickle.safe_loads`` walks the file's opcodes (declared sizes) and then unpickles it
with the pure-Python unpickler, an allow-list of globals and numpy's dtypes and arrays checked before numpy sees
them. Its cost grows with the number of opcodes, not bytes: the replay buffer's state is columnar (a few large arrays,
a string per sample), which is what the state here imitates. Baseline: the C unpickler on the same bytes, no checks
(what a plain ``pickle.load`` of an untrusted file would do).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from typing import Any

import common


def replay_state(samples: int, queries: int, tokens: int, seed: int = 0) -> dict[str, Any]:
    """A driver state shaped like the replay buffer's packed columns (``r3_rllib.replay.buffer.to_columns``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    columns = {
        "query_id": [f"q{i % queries}" for i in range(samples)],
        "prompt_lens": np.full(queries, 64),
        "prompts": rng.integers(0, 50_000, queries * 64, dtype=np.int32),
        "prompt_index": np.arange(samples) % queries,
        "response_lens": np.full(samples, tokens),
        "response_ids": rng.integers(0, 50_000, samples * tokens, dtype=np.int32),
        "behavior_logprobs": rng.random(samples * tokens, dtype=np.float32),
        "reward": rng.random(samples),
        "correct": rng.random(samples) > 0.5,
        "policy_version": np.arange(samples),
        "truncated": np.zeros(samples, bool),
        "response_text": [f"the answer is {i}" for i in range(samples)],
        "loss_mask": None,
    }
    return {"replay": {"samples": columns, "stats": {f"q{i}": [0.5, 3] for i in range(queries)}}}


def module_from_file(path: str) -> Any:
    """The module in the file at ``path`` (another version of ``safe_pickle.py``; its imports resolve to this
    checkout's package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("safe_pickle_also", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=256, help="response tokens per sample")
    parser.add_argument(
        "--reps",
        type=int,
        default=5,
        help="loads per path, taking turns after a warm-up round; the median is shown",
    )
    parser.add_argument("--smoke", action="store_true", help="1k samples, one rep")
    parser.add_argument(
        "--also", default=None, help="a safe_pickle.py of another version, timed as a third path"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.samples, args.reps = 1000, 1
    from r3_rllib.algorithms.r3.safe_pickle import safe_loads

    common.print_header("safe_loads vs pickle.loads on a replay-shaped driver state", args)
    data = pickle.dumps(replay_state(args.samples, max(1, args.samples // 100), args.tokens), protocol=4)

    def timed(load: Any) -> Any:
        def run() -> float:
            t0 = time.perf_counter()
            load(data)
            return time.perf_counter() - t0

        return run

    baseline = "pickle.loads (C, unchecked)"
    paths = {baseline: timed(pickle.loads), "safe_loads": timed(lambda b: safe_loads(b, "bench"))}
    if args.also:
        also = module_from_file(args.also).safe_loads
        paths[f"safe_loads of {args.also}"] = timed(lambda b: also(b, "bench"))
    medians = common.alternating_medians(
        paths,
        args.reps,
        warmup=not args.smoke,
    )
    print(
        f"state: {args.samples} samples x {args.tokens} tokens, {len(data) / 1e6:.1f} MB; {common.load_note()}"
    )
    rows = [(name, m, m / medians[baseline]) for name, m in medians.items()]
    print(common.markdown_table(["path", "median s", "x baseline"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
