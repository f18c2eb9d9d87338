"""How close the gen setting's fp32 update runs to this CPU's matrix-product speed, and what torch.compile and a
second thread change: the arithmetic side of ``bench_throughput``'s fp32 ratio against TRL.

    python bench/bench_fp32_ceiling.py                 # gen model, 32 rows x 134 tokens (~2 min on 2 cores)
    python bench/bench_fp32_ceiling.py --compile       # also the update of a torch.compile'd model (+~1 min)
    python bench/bench_fp32_ceiling.py --smoke         # CI: tiny shapes, one rep

Three measurements, in one process, fp32:

- the peak: one thread's ``torch.mm`` GFLOP/s at the update's own shapes (rows x hidden x intermediate, both ways,
  and a square 2048 product), the fastest this CPU multiplies fp32 matrices with PyTorch's kernels;
- the update: forward + backward of ``bench_throughput``'s gen model (``common.long_response_model``) on
  ``--rows`` x ``--tokens`` tokens (4 queries x 8 samples of a 6-token prompt and 128 response tokens), at one
  thread and at two: wall seconds, CPU-seconds, and the matrix products' GFLOP/s counted as 6 x (matrix
  parameters) x tokens over the whole pass's time (attention and element-wise work in that time too, so this is a
  lower bound on the products' own speed);
- ``--compile``: the same update of a ``torch.compile``'d copy (inductor's C++ kernels fuse the element-wise work),
  compile time reported apart.

A ratio of update GFLOP/s to peak near 1 leaves an fp32 update nothing to gain from other kernels at equal
arithmetic; CPU-seconds at two threads over one say what a second thread costs in work.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import common


def gemm_gflops(shapes: Sequence[tuple[int, int, int]], reps: int) -> dict[str, float]:
    """One thread's GFLOP/s of ``torch.mm`` for each (n, k, m) in ``shapes`` (median of ``reps`` after one warm-up;
    at least 10: one product's speed moves with the core's clock)."""
    import torch

    torch.set_num_threads(1)
    out = {}
    for n, k, m in shapes:
        a, b = torch.randn(n, k), torch.randn(k, m)
        a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        out[f"{n}x{k}x{m}"] = 2 * n * k * m / common.median(times) / 1e9
    return out


def matrix_params(model: Any) -> int:
    """Parameters that enter matrix products (every 2-d weight but the input embedding, a lookup)."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embed)


def update_times(model: Any, ids: Any, threads: int, reps: int) -> dict[str, float]:
    """Median wall and CPU seconds of one forward + backward (token log-likelihood) of ``model`` on ``ids``."""
    import torch

    torch.set_num_threads(threads)

    def step() -> None:
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).mean().backward()

    step()  # warm-up (and, compiled, the compile)
    walls, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": common.median(walls), "cpu_s": common.median(cpus)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=134, help="prompt + response tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time a torch.compile'd model")
    ap.add_argument("--smoke", action="store_true", help="CI: tiny shapes, one rep")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.tokens, args.reps = 2, 8, 1
    common.setup_process(1)
    common.print_header("fp32 update vs this CPU's matrix-product speed", args)
    import torch
    from transformers import AutoModelForCausalLM

    path = common.long_response_model("tiny" if args.smoke else "gen")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    hidden, inter = model.config.hidden_size, model.config.intermediate_size
    rows_x_tokens = args.rows * args.tokens
    shapes = [(rows_x_tokens, hidden, inter), (rows_x_tokens, inter, hidden), (2048, 2048, 2048)]
    peak = gemm_gflops(shapes if not args.smoke else shapes[:2], max(args.reps, 10))
    flops = 6 * matrix_params(model) * rows_x_tokens
    ids = torch.randint(
        3, model.config.vocab_size, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    arms = {f"{t} thread{'s' * (t > 1)}": update_times(model, ids, t, args.reps) for t in (1, 2)}
    if args.compile:
        compiled = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        compiled.compile(dynamic=True)
        arms["1 thread, compiled"] = update_times(compiled, ids, 1, args.reps)
        arms["1 thread, compiled"]["compile_and_first_s"] = time.perf_counter() - t0
    best_peak = max(peak.values())
    print(common.markdown_table(["torch.mm, 1 thread", "GFLOP/s"], [[k, v] for k, v in peak.items()]))
    rows = []
    for name, m in arms.items():
        per_core = flops / m["cpu_s"] / 1e9
        rows.append([name, m["wall_s"], m["cpu_s"], per_core, per_core / best_peak])
    print()
    print(
        common.markdown_table(
            ["update (fwd + bwd)", "wall s", "CPU-s", "matrix GFLOP/s per core", "of the 1-thread peak"], rows
        )
    )
    one = arms["1 thread"]
    print(
        f"\n{6 * matrix_params(model) / 1e6:.1f} MFLOP per token x {rows_x_tokens} tokens = {flops / 1e9:.1f} GFLOP"
    )
    print(
        f"two threads / one: wall {arms['2 threads']['wall_s'] / one['wall_s']:.3f}x, CPU-s {arms['2 threads']['cpu_s'] / one['cpu_s']:.3f}x"
    )
    if args.compile:
        c = arms["1 thread, compiled"]
        print(
            f"compiled / eager at 1 thread: {c['wall_s'] / one['wall_s']:.3f}x (compile + first pass {c['compile_and_first_s']:.0f} s)"
        )
    print(f"({common.load_note()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
