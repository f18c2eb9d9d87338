"""Which CPU computations follow torch's thread count, and what threads buy a vLLM-CPU runner (BENCHMARKS 33).

    python bench/bench_thread_invariance.py            # ~2 min on 2 cores
    python bench/bench_thread_invariance.py --smoke    # small shapes, no vLLM

1. Matrix products of learner-sized shapes and whole-tensor sums at 1-4 threads: bit-identical to 1 thread or not;
   ``core/reductions.py invariant_sum`` beside the plain sum.
2. The HF engine's sampling (tiny model, 8 x 48 tokens, temperature 0.7) at 1 and 2 threads: same tokens, and the
   largest log-prob difference.
3. vLLM-CPU (when installed): 32 x 128 tokens from section 1b's ~19 M model at 1 and 2 threads, set between calls
   with ``torch._C.set_num_threads`` (vLLM replaces ``torch.set_num_threads`` with a no-op once its worker starts):
   seconds per call and whether tokens and log-probs are bit-identical.
4. This process's threads after torch work at 2 threads (BENCHMARKS 34): the tasks ``/proc/loadavg`` counts
   runnable and how many of them are this process's (its OpenMP worker spinning), 0-100 ms after the work, and what
   ``core/threads.py runnable_tasks`` makes of them (this process counted once).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import common

GEMMS = (
    (576, 8192, 1536),
    (4096, 576, 49152),
    (1536, 65536, 576),
    (8, 100000, 8),
    (1, 4096, 4096),
    (32, 576, 576),
)
SMOKE_GEMMS = ((64, 4096, 64), (8, 40000, 8))


def products_and_sums(smoke: bool) -> None:
    import torch

    from r3_rllib.core.reductions import invariant_sum

    g = torch.Generator().manual_seed(0)
    print("\n## 1. matrix products and sums: bit-identical to 1 thread at 2, 3, 4 threads?")
    for m, k, n in SMOKE_GEMMS if smoke else GEMMS:
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        torch.set_num_threads(1)
        ref = a @ b
        same = []
        for t in (2, 3, 4):
            torch.set_num_threads(t)
            same.append(torch.equal(ref, a @ b))
        print(f"- ({m} x {k}) @ ({k} x {n}): {same}")
    for numel in (32769, 65536, 1_000_000):
        x = torch.randn(numel, generator=g) * 100 + 0.5
        rows = []
        for fn in (torch.sum, invariant_sum):
            torch.set_num_threads(1)
            ref = fn(x)
            same = []
            for t in (2, 3, 4):
                torch.set_num_threads(t)
                same.append(torch.equal(ref, fn(x)))
            rows.append(f"{fn.__name__} {same}")
        print(f"- sum of {numel:,} elements: " + "; ".join(rows))


def hf_engine_sampling() -> None:
    import numpy as np
    import torch

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    engine = HFEngine(build_tiny_model(tok, seed=0), tok)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+34=", "7+5=")]
    params = SamplingParams(max_new_tokens=48, temperature=0.7, seed=11)
    out = {}
    for t in (1, 2):
        torch.set_num_threads(t)
        out[t] = [c for group in engine.generate(prompts, 4, params) for c in group]
    same_tokens = all(list(a.token_ids) == list(b.token_ids) for a, b in zip(out[1], out[2], strict=True))
    diff = max(
        float(np.max(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs))))
        if same_tokens
        else float("nan")
        for a, b in zip(out[1], out[2], strict=True)
    )
    print(
        f"\n## 2. HF engine, 1 vs 2 threads: same tokens {same_tokens}, largest log-prob difference {diff:.3g}"
    )


def vllm_threads() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("\n## 3. vLLM not installed: skipped")
        return
    import torch

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    engine = VLLMEngine(common.long_response_model("gen"))
    prompts = [[5 + i, 6, 7, 8, 9, 10] for i in range(4)]
    params = SamplingParams(max_new_tokens=128, temperature=1.0, seed=3)
    engine.generate(prompts, 8, params)  # warm-up
    seconds: dict[int, list[float]] = {1: [], 2: []}
    outputs = {}
    for t in (1, 2, 1, 2):
        torch._C.set_num_threads(t)
        t0 = time.perf_counter()
        out = engine.generate(prompts, 8, params)
        seconds[t].append(time.perf_counter() - t0)
        outputs.setdefault(t, [(tuple(c.token_ids), tuple(c.logprobs)) for g in out for c in g])
    print(
        f"\n## 3. vLLM-CPU, 32 x 128 tokens: 1 thread {common.median(seconds[1]):.2f} s, 2 threads "
        f"{common.median(seconds[2]):.2f} s per call (median of 2); bit-identical: {outputs[1] == outputs[2]}"
    )


def own_threads_after_work() -> None:
    import torch

    from r3_rllib.core.threads import own_running_threads, runnable_tasks

    print(
        "\n## 4. runnable tasks after 20 products of 1024 x 1024 at 2 threads (median of 5 tries per delay)"
    )
    torch.set_num_threads(2)
    a = torch.randn(1024, 1024)
    rows = []
    for delay_ms in (0, 1, 10, 100):
        seen = []
        for _ in range(5):
            for _ in range(20):
                a @ a
            time.sleep(delay_ms / 1000)
            with open("/proc/loadavg") as f:
                machine = int(f.read().split()[3].split("/")[0])
            seen.append((machine, own_running_threads(), runnable_tasks(samples=1)))
        machine, own, counted = (sorted(v)[2] for v in zip(*seen, strict=True))
        rows.append([delay_ms, machine, own, counted])
    torch.set_num_threads(1)
    print(
        common.markdown_table(["ms after", "/proc/loadavg runnable", "of them ours", "runnable_tasks"], rows)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small shapes, no vLLM (CI)")
    args = ap.parse_args(argv)
    common.setup_process(threads=1)
    common.print_header("bench_thread_invariance", args)
    products_and_sums(args.smoke)
    hf_engine_sampling()
    own_threads_after_work()
    if not args.smoke:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm_threads()
    return 0


if __name__ == "__main__":
    sys.exit(main())
