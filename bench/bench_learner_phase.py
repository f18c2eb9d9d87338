"""The learner phase alone: our learner's update against the plain-PyTorch floor's on one fixed batch, one run.

    python bench/bench_learner_phase.py                         # tiny and gen settings, 1 thread
    python bench/bench_learner_phase.py --setting tiny --reps 30 --threads 1,2
    python bench/bench_learner_phase.py --setting gen --threads 2 --gen-tokens 512 --gen-reps 4
    python bench/bench_learner_phase.py --smoke                 # CI: tiny shapes, one rep

``bench_throughput`` times the learner phase inside whole iterations, one path after the other, so machine load
that changes between paths shows up in the ratio. Here both updates run in one process on the same batch,
interleaved (ours, floor, floor, ours, ...: each rep swaps which goes first), at the same torch thread count:

- the batch: the settings of ``bench_throughput`` (``tiny``: the shipped model, G=8, Q=16, 8-token answers, groups
  with equal rewards dropped as both algorithms do; ``gen``: the ~19 M-parameter model, G=8, Q=4, 128-token
  responses, every sample trained on, random rewards standing in for the ranking reward), generated once with
  ``model.generate`` (the floor's sampling), graded, with group-normalised advantages and the behaviour log-probs
  of the generating policy;
- ``ours``: ``R3Learner.update_from_samples`` of a learner built in this process (``config.build_learner``, the
  config ``bench_throughput`` runs, ``common.grpo_config``) on the batch as a ``TrainingBatch``;
- ``floor``: ``common.floor_update`` (the learner step of ``bench_throughput``'s floor) on the same rows.

Both keep training on the batch rep after rep (weights and optimizer state carry over, on both sides alike); the
work per rep does not depend on the weights. Medians over the timed reps; then a per-part profile of ours (manual
timers around the learner's methods, separate reps so they do not slow the A/B).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import bench_throughput
import common
import numpy as np


@dataclasses.dataclass
class Rollouts:
    """One fixed batch in both layouts: the floor's (left-padded prompts + responses) and ours (columnar)."""

    input_ids: Any  # [B, P + L] int64
    attention_mask: Any  # [B, P + L] int64
    response_mask: Any  # [B, L] bool
    advantages: Any  # [B] float32
    prompt_width: int
    batch: Any  # r3_rllib.types.TrainingBatch of the same rows
    trained_tokens: int


def generate_rollouts(s: bench_throughput.Setting, seed: int, random_rewards: bool) -> Rollouts:
    """Sample, grade and keep one batch of setting `s` (the floor's generation and advantage code)."""
    import torch

    from r3_rllib.models.tiny import load_tiny

    torch.manual_seed(seed)
    model, tok = load_tiny(s.model_path)
    model.eval()
    stream = bench_throughput.problem_stream(s, seed)
    rng = np.random.default_rng(seed)
    tries = 20  # the first batch with an informative group (tiny: all-equal groups are dropped)
    for attempt in range(tries):
        problems = [next(stream) for _ in range(s.queries)]
        enc = tok([p for p, _ in problems], add_special_tokens=False, padding=True, return_tensors="pt")
        P = enc["input_ids"].shape[1]
        out, comp, comp_mask, first = common.floor_generate(model, tok, enc, s.group_size, s.max_new_tokens)
        answers = [a for _, a in problems for _ in range(s.group_size)]
        if random_rewards or attempt == tries - 1:  # a model that never answers right: random rewards
            rewards = torch.from_numpy(rng.random(len(answers)).astype(np.float32))
        else:
            texts = [tok.decode(comp[i, : int(first[i])].tolist()) for i in range(len(answers))]
            rewards = torch.tensor(
                [float(common.grade_answer(t, a)) for t, a in zip(texts, answers, strict=True)]
            )
        r = rewards.view(-1, s.group_size)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        keep = (r.max(1).values > r.min(1).values).repeat_interleave(s.group_size)
        if bool(keep.any()):
            break
    attn = torch.cat([enc["attention_mask"].repeat_interleave(s.group_size, 0), comp_mask.long()], 1)
    return _rollouts(model, out[keep], attn[keep], comp_mask[keep], adv[keep].float(), P)


def _rollouts(model, ids, attn, comp_mask, adv, P: int) -> Rollouts:
    """Both layouts of the kept rows; behaviour log-probs scored by the generating model."""
    import torch

    from r3_rllib.types import TrainingBatch

    with torch.no_grad():
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    prompts, responses, behaviour = [], [], []
    for i in range(ids.shape[0]):
        n = int(comp_mask[i].sum())
        prompts.append(ids[i, :P][attn[i, :P].bool()].numpy().astype(np.int32))
        responses.append(ids[i, P : P + n].numpy().astype(np.int32))
        behaviour.append(logp[i, :n].numpy().astype(np.float32))

    def offsets(parts):
        return np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)

    batch = TrainingBatch(
        prompt_ids=np.concatenate(prompts),
        prompt_offsets=offsets(prompts),
        response_ids=np.concatenate(responses),
        response_offsets=offsets(responses),
        behavior_logprobs=np.concatenate(behaviour),
        advantages=adv.numpy().astype(np.float32),
        policy_versions=np.zeros(len(adv), dtype=np.int64),
    )
    return Rollouts(ids, attn, comp_mask, adv, P, batch, int(comp_mask.sum()))


def build_ours(s: bench_throughput.Setting, seed: int):
    """Our learner in this process, configured as ``bench_throughput`` runs it."""
    import gymnasium as gym

    config = bench_throughput.ours_config(s, "hf", seed)
    space = gym.spaces.Text(8)
    return config.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )


def build_floor(s: bench_throughput.Setting):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(s.model_path, dtype=torch.float32)
    return model, torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)


def ab_times(
    learner, floor, ro: Rollouts, threads: Sequence[int], reps: int, warmup: int, bf16: bool = False
) -> dict:
    """Seconds per update of each side at each thread count, interleaved, the first side alternating. ``bf16``:
    the floor's update under bf16 autocast (ours autocasts itself with ``dtype='bfloat16'``)."""
    import torch

    model, opt = floor

    def floor_update(k: int) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            common.floor_update(
                model, opt, ro.input_ids, ro.attention_mask, ro.response_mask, ro.advantages, ro.prompt_width
            )

    sides = {"ours": lambda k: learner.update_from_samples(ro.batch, seed=k), "floor": floor_update}
    times: dict[tuple[str, int], list[float]] = {(n, t): [] for n in sides for t in threads}
    for k in range(warmup + reps):
        for t in threads:
            torch.set_num_threads(t)
            pin_threads(learner, t)
            for name in list(sides) if k % 2 == 0 else list(sides)[::-1]:
                t0 = time.perf_counter()
                sides[name](k)
                dt = time.perf_counter() - t0
                if k >= warmup:
                    times[(name, t)].append(dt)
    return times


def pin_threads(learner, threads: int) -> None:
    """Make our learner update on `threads` threads: it otherwise picks its own count at each update
    (``cpu_threads``, core/threads.py), fewer where the machine looks busy, which would compare unequal threads."""
    from r3_rllib.algorithms.r3.learner_threads import UpdateThreads

    learner._threads = UpdateThreads(threads, threads, threads)


class PartTimers:
    """Wall-clock totals of wrapped callables (an instance attribute or a module global shadows the original)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.undo: list[tuple[Any, str, Any, bool]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        if not hasattr(owner, attr):
            return
        had_own = attr in vars(owner)
        original = getattr(owner, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.total[label] = self.total.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)
        self.undo.append((owner, attr, original, had_own))

    def restore(self) -> None:
        for owner, attr, original, had_own in reversed(self.undo):
            if had_own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        self.undo.clear()


def profile_ours(learner, ro: Rollouts, threads: int, reps: int) -> dict[str, float]:
    """Seconds per update of each part of ours (mean over `reps`), the parts that contain others net of them."""
    import torch

    from r3_rllib.algorithms.r3 import learner as learner_module

    torch.set_num_threads(threads)
    pin_threads(learner, threads)
    timers = PartTimers()
    for attr, label in (("pack_batch", "packing"), ("rl_objective", "loss")):
        timers.wrap(learner_module, attr, label)
    for attr, label in (
        ("update_from_samples", "update"),
        ("_minibatch_step", "step"),
        ("_micro_batch_backward", "pass"),
        ("_score", "scoring forward"),
        ("_pass_metrics", "pass metrics"),
        ("_apply_gradients", "apply"),
        ("_finish_update", "finish (metrics, memory probe)"),
    ):
        timers.wrap(learner, attr, label)
    timers.wrap(learner._optimizer, "step", "optimizer step")
    timers.wrap(learner._peak_memory, "reset", "memory probe reset")
    try:
        for k in range(reps):
            learner.update_from_samples(ro.batch, seed=k)
    finally:
        timers.restore()
    t = {k: v / reps for k, v in timers.total.items()}
    g = t.get
    parts = {
        "packing": g("packing", 0.0),
        "scoring forward": g("scoring forward", 0.0),
        "loss": g("loss", 0.0),
        "backward": g("pass", 0.0)
        - sum(g(k, 0.0) for k in ("packing", "scoring forward", "loss", "pass metrics")),
        "pass metrics": g("pass metrics", 0.0),
        "clip (+ grad averaging)": g("apply", 0.0) - g("optimizer step", 0.0),
        "optimizer step": g("optimizer step", 0.0),
        "step rest (metric syncs, zero_grad, planning)": g("step", 0.0) - g("pass", 0.0) - g("apply", 0.0),
        "memory probe reset": g("memory probe reset", 0.0),
        "finish (metrics, memory probe)": g("finish (metrics, memory probe)", 0.0),
    }
    parts["update rest"] = (
        g("update", 0.0)
        - g("step", 0.0)
        - g("memory probe reset", 0.0)
        - g("finish (metrics, memory probe)", 0.0)
    )
    parts["total"] = g("update", 0.0)
    return parts


def run_setting(s: bench_throughput.Setting, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    ro = generate_rollouts(s, args.seed, random_rewards=s.rank_all_wrong)
    learner = build_ours(s, args.seed)
    floor = build_floor(s)
    threads = [int(t) for t in args.threads.split(",")]
    reps = args.reps if s.name == "tiny" else args.gen_reps
    load_start = os.getloadavg()[0]
    times = ab_times(learner, floor, ro, threads, reps, args.warmup, bf16=s.dtype == "bfloat16")
    load_end = os.getloadavg()[0]
    profile = profile_ours(learner, ro, threads[0], args.profile_reps)
    torch.set_num_threads(1)
    rows, ratios = [], {}
    for t in threads:
        ours, fl = common.median(times[("ours", t)]), common.median(times[("floor", t)])
        ratios[t] = ours / fl
        rows.append([f"{t} thread" + "s" * (t > 1), ours, fl, ours / fl, len(times[("ours", t)])])
    rows_b = len(ro.batch)
    print(
        f"\n## setting {s.name}: {rows_b} rows trained, {ro.trained_tokens} response tokens, "
        f"{int(ro.batch.lengths.sum())} tokens (prompt + response), dtype {s.dtype}, model {s.model_path}"
    )
    print(
        common.markdown_table(["threads", "ours s (median)", "floor s (median)", "ours/floor", "reps"], rows)
    )
    print(
        f"\nour learner's parts at {threads[0]} thread(s), s per update (mean of {args.profile_reps} reps):"
    )
    print(
        common.markdown_table(
            ["part", "s", "share"], [[k, v, v / profile["total"]] for k, v in profile.items()]
        )
    )
    print(f"(load average {load_start:.2f} at the start of the A/B, {load_end:.2f} at its end)", flush=True)
    return {
        "setting": dataclasses.asdict(s),
        "rows": rows_b,
        "trained_tokens": ro.trained_tokens,
        "times_s": {f"{n}@{t}": v for (n, t), v in times.items()},
        "median_s": {f"{n}@{t}": common.median(v) for (n, t), v in times.items()},
        "ratio_ours_over_floor": {str(t): r for t, r in ratios.items()},
        "profile_s": profile,
        "loadavg": [load_start, load_end],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=("tiny", "gen", "all"), default="all")
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts, e.g. 1,2")
    ap.add_argument("--reps", type=int, default=30, help="timed reps per side (tiny setting)")
    ap.add_argument("--gen-reps", type=int, default=8, help="timed reps per side (gen setting)")
    ap.add_argument(
        "--gen-tokens", type=int, default=128, help="gen setting: response length (bench_throughput's)"
    )
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="both updates' compute dtype (bfloat16: fp32 weights, bf16 autocast; bench_throughput's --dtype)",
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed reps per side first")
    ap.add_argument("--profile-reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="tiny setting model (default: the shipped tiny model)")
    ap.add_argument("--json", default=None, help="write all numbers to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="CI: tiny shapes, one rep")
    args = ap.parse_args(argv)
    if args.smoke:
        args.reps = args.gen_reps = args.profile_reps = 1
        args.warmup = 0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.print_header("bench_learner_phase", args)
    tp_argv = ["--setting", args.setting, "--paths", "floor"] + (["--smoke"] if args.smoke else [])
    tp_argv += ["--model", args.model] if args.model else []
    tp_argv += ["--gen-tokens", str(args.gen_tokens), "--dtype", args.dtype]
    settings = bench_throughput.build_settings(bench_throughput.parse_args(tp_argv))
    out: dict[str, Any] = {"machine": common.machine(), "versions": common.versions(), "settings": []}
    for s in settings:
        out["settings"].append(run_setting(s, args))
    ratios = [
        [f"ours/floor learner phase, {r['setting']['name']}, {t} thread(s)", v]
        for r in out["settings"]
        for t, v in r["ratio_ours_over_floor"].items()
    ]
    print()
    print(common.markdown_table(["ratio (same run)", "value"], ratios))
    print(f"({common.load_note()} at the end)")
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
