"""Training throughput of r3-rllib's GRPO against TRL's GRPOTrainer and a plain-PyTorch GRPO loop, in one run.

    python bench/bench_throughput.py                      # both settings, every path (~13 min on 2 CPU cores)
    python bench/bench_throughput.py --setting tiny       # the shipped 0.8 M model only
    python bench/bench_throughput.py --setting gen --paths ours-vllm,ours-vllm-overlap,trl,trl-2t
    python bench/bench_throughput.py --setting tiny --paths ours-hf,floor --iterations 60 --rounds 6
                                                          # the paths take turns, 6 blocks of 10 each
    python bench/bench_throughput.py --setting gen --dtype bfloat16   # every path in bf16 (fp32 weights, autocast)
    python bench/bench_throughput.py --scaling            # also fit and check the cost-per-iteration model
    python bench/bench_throughput.py --smoke              # CI: one tiny iteration per path

Every path runs the same model, task, group size G, queries per iteration Q, response length limit, sampling
(temperature 1, no top-k/top-p) and optimizer (AdamW, constant lr, weight decay 0, grad-norm clip 1, one update per
batch, PPO clip 0.2/0.28, no KL, token-mean loss):

- ``ours-hf`` / ``ours-vllm``: the real algorithm (``R3Config.grpo_preset()``, ``algo.train()``): one remote
  EnvRunner with the HF or vLLM engine, a local learner in the driver, weights synced through the object store;
- ``ours-hf-overlap`` / ``ours-vllm-overlap``: the same with ``overlap_generation=True``: the runner generates batch
  k+1 while the learner trains on batch k (one-step off-policy, IS-corrected). The runner uses one thread; the
  learner starts on the other core and takes the runner's too once the generation ends (``cpu_threads='auto'``);
- ``ours-*`` paths run with the default ``cpu_threads='auto'`` (each phase of the synchronous loop may use both
  cores); ``ours-hf-reserved`` / ``ours-vllm-reserved``: the synchronous path with ``cpu_threads='reserved'``: one
  torch thread per reserved CPU; ``ours-hf-all`` / ``ours-vllm-all``: ``cpu_threads='all'`` (the runner also takes
  both cores while it generates); ``ours-hf-prefetch`` / ``ours-vllm-prefetch``: the synchronous path with
  ``prefetch_rollout=True`` (the runner generates the next rollout while the driver logs this iteration, instead of
  waiting idle);
- ``trl``: ``trl.GRPOTrainer`` (transformers ``generate``, no vLLM on CPU), one optimizer step per generation batch;
- ``floor``: a hand-written loop in one process: ``model.generate`` with the same sampling, grading, group
  advantages, one clipped token-mean update. Nothing else: the lowest cost of a GRPO iteration with these libraries.
- ``trl-2t`` / ``floor-2t``: the same two with two torch threads, i.e. the whole machine, the fair baseline for the
  overlap paths (the single-process loops cannot use a second core otherwise).

Two settings:

- ``tiny``: the shipped ~0.8 M-parameter model on 2-digit addition, answers of up to 8 tokens (they stop at eos);
- ``gen``: a ~19 M-parameter random Qwen2 (char tokenizer) whose eos can never be sampled, so every response is
  exactly ``--gen-tokens`` long. Every group is all wrong; ours turns on the ranking reward from iteration 0 so it
  trains on every sample, as TRL and the floor do.

Groups whose rewards are all equal carry no gradient: ours drops them from the batch, so the floor does too in the
tiny setting (``trained tok`` columns show the work done); TRL trains on all samples.

Time per iteration is wall-clock from the driver, warm-up iterations excluded; the ratios use medians (the machine
may be shared). Paths run one after the other, unless ``--rounds R``: then every path but TRL's is built once and
warmed up, and they take turns, R blocks each, so a machine whose speed drifts slows them alike. Our per-phase split comes from the algorithm's own timers (``result["timers_s"]``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np

PATHS = (
    "ours-hf",
    "ours-vllm",
    "ours-hf-overlap",
    "ours-vllm-overlap",
    "ours-hf-reserved",
    "ours-vllm-reserved",
    "ours-hf-all",
    "ours-vllm-all",
    "ours-hf-prefetch",
    "ours-vllm-prefetch",
    "trl",
    "floor",
    "trl-2t",
    "floor-2t",
)


#: Our paths that may take turns (``--rounds``): each keeps its runner, which holds one of the private Ray
#: instance's CPUs (``common.start_ray``), for the whole run.
MOST_OURS_IN_TURNS = 2


@dataclasses.dataclass
class Setting:
    name: str
    model_path: str
    group_size: int
    queries: int
    max_new_tokens: int
    lr: float
    env_config: dict
    rank_all_wrong: bool  # ours: ranking from iteration 0; floor: train on every group (no degenerate drop)
    paths: tuple[str, ...]
    # Every path's compute dtype: "float32", or "bfloat16" (fp32 master weights, bf16 autocast in the updates;
    # ours and the floor generate in bf16, TRL as its `bf16=True` does).
    dtype: str = "float32"


@dataclasses.dataclass
class PathResult:
    path: str
    iter_s: list[float]
    samples: list[float]
    gen_tokens: list[float]
    trained_tokens: list[float]
    phases: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    note: str = ""
    busy_s: list[float] = dataclasses.field(default_factory=list)  # machine CPU-seconds per timed iteration
    # Ours: each update's torch threads, averaged over its time.
    learner_threads: list[float] = dataclasses.field(default_factory=list)

    def med(self, xs: Sequence[float]) -> float:
        return common.median(xs)

    def summary(self) -> dict[str, float]:
        t = common.median(self.iter_s)
        return {
            "s_per_iter_median": t,
            "s_per_iter_mean": float(np.mean(self.iter_s)),
            "samples_per_s": common.median(self.samples) / t,
            "gen_tokens_per_s": common.median(self.gen_tokens) / t,
            "trained_tokens_per_s": common.median(self.trained_tokens) / t,
            "gen_tokens_per_iter": float(np.mean(self.gen_tokens)),
            "trained_tokens_per_iter": float(np.mean(self.trained_tokens)),
            # Work per iteration in CPU-seconds (every process on the machine) and the cores it kept busy on average.
            "cpu_s_per_iter": common.median(self.busy_s) if self.busy_s else float("nan"),
            "cores_busy": common.median([b / t for b, t in zip(self.busy_s, self.iter_s, strict=True)])
            if self.busy_s
            else float("nan"),
        }


# ------------------------------------------------------------------------------------------------------------------
# Prompts: the arithmetic env's training pool, in the order our EnvRunner sees it
# ------------------------------------------------------------------------------------------------------------------
def problem_stream(s: Setting, seed: int):
    """The queries our (single) EnvRunner draws, in its order, so every path trains on the same prompts."""
    from r3_rllib.algorithms.r3.runner_setup import runner_env_config
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    config = common.grpo_config(s.model_path, env_config=s.env_config, seed=seed)
    env = ArithmeticEnv(**runner_env_config(config, worker_index=1))
    while True:
        obs, info = env.reset()
        yield obs, info["gold"]


# ------------------------------------------------------------------------------------------------------------------
# The floor: one GRPO step in plain PyTorch
# ------------------------------------------------------------------------------------------------------------------
class FloorGRPO:
    """Minimal GRPO: HF generate, grade, group-normalised advantages, one clipped token-mean update."""

    def __init__(
        self,
        model_path: str,
        *,
        group_size: int,
        max_new_tokens: int,
        lr: float,
        drop_degenerate: bool,
        bf16: bool = False,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        grad_clip: float = 1.0,
        eps: float = 1e-6,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from r3_rllib.models.tiny import load_tokenizer

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.tok = load_tokenizer(model_path)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.G, self.L = group_size, max_new_tokens
        self.drop_degenerate = drop_degenerate
        # bf16: the weights and AdamW stay fp32; generation and the update's forward run under bf16 autocast.
        self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        self.clip_low, self.clip_high, self.grad_clip, self.eps = clip_low, clip_high, grad_clip, eps
        self.eos, self.pad = self.tok.eos_token_id, self.tok.pad_token_id

    def step(self, problems: list[tuple[str, str]]) -> dict[str, float]:
        torch = self.torch
        t0 = time.perf_counter()
        enc = self.tok([p for p, _ in problems], add_special_tokens=False, padding=True, return_tensors="pt")
        P = enc["input_ids"].shape[1]
        self.model.eval()
        # Sampling, and the completion masks (microseconds, in the generation phase).
        with self.autocast():
            out, comp, comp_mask, first = common.floor_generate(self.model, self.tok, enc, self.G, self.L)
        t_gen = time.perf_counter()

        lengths = comp_mask.sum(1)
        answers = [a for _, a in problems for _ in range(self.G)]
        texts = [self.tok.decode(comp[i, : int(first[i])].tolist()) for i in range(comp.shape[0])]
        rewards = torch.tensor(
            [float(common.grade_answer(t, a)) for t, a in zip(texts, answers, strict=True)]
        )
        r = rewards.view(-1, self.G)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + self.eps)).view(-1)
        keep = torch.ones(len(adv), dtype=torch.bool)
        if self.drop_degenerate:
            keep = (r.max(1).values > r.min(1).values).repeat_interleave(self.G)
        t_grade = time.perf_counter()

        trained = 0
        if bool(keep.any()):
            attn = torch.cat(
                [enc["attention_mask"].repeat_interleave(self.G, 0)[keep], comp_mask[keep].long()], 1
            )
            with self.autocast():
                trained = common.floor_update(
                    self.model,
                    self.opt,
                    out[keep],
                    attn,
                    comp_mask[keep],
                    adv[keep],
                    P,
                    clip_low=self.clip_low,
                    clip_high=self.clip_high,
                    grad_clip=self.grad_clip,
                )
        t_learn = time.perf_counter()
        return {
            "generate": t_gen - t0,
            "grade": t_grade - t_gen,
            "learner": t_learn - t_grade,
            "gen_tokens": float(lengths.sum()),
            "trained_tokens": float(trained),
            "samples": float(len(answers)),
            "accuracy": float(rewards.mean()),
        }


class FloorSession:
    """The floor's loop, kept alive between blocks of iterations (``--rounds``): its model, optimizer and prompts."""

    def __init__(self, s: Setting, seed: int, threads: int = 1) -> None:
        import torch

        self.s, self.threads = s, threads
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.floor = FloorGRPO(
            s.model_path,
            group_size=s.group_size,
            max_new_tokens=s.max_new_tokens,
            lr=s.lr,
            drop_degenerate=not s.rank_all_wrong,
            bf16=s.dtype == "bfloat16",
        )
        self.stream = problem_stream(s, seed)
        self.res = PathResult("floor", [], [], [], [], {k: [] for k in ("generate", "grade", "learner")})

    def run(self, iterations: int, timed: bool = True) -> None:
        import torch

        torch.set_num_threads(self.threads)  # another path may have run in between
        for _ in range(iterations):
            problems = [next(self.stream) for _ in range(self.s.queries)]
            t0, b0 = time.perf_counter(), common.cpu_busy_s()
            m = self.floor.step(problems)
            dt = time.perf_counter() - t0
            if not timed:
                continue
            self.res.iter_s.append(dt)
            self.res.busy_s.append(common.cpu_busy_s() - b0)
            self.res.samples.append(m["samples"])
            self.res.gen_tokens.append(m["gen_tokens"])
            self.res.trained_tokens.append(m["trained_tokens"])
            for k in self.res.phases:
                self.res.phases[k].append(m[k])

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------------------------
# TRL
# ------------------------------------------------------------------------------------------------------------------
def run_trl(s: Setting, iterations: int, warmup: int, seed: int, threads: int = 1) -> PathResult:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from r3_rllib.models.tiny import load_tokenizer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with wall-clock timers around generation, reward computation and the whole rollout."""

        bench: dict[str, list[float]]

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self.bench["generate"].append(time.perf_counter() - t0)
            self.bench["gen_tokens"].append(float(sum(len(c) for c in out[1])))
            return out

        def _calculate_rewards(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._calculate_rewards(*args, **kwargs)
            self.bench["grade"].append(time.perf_counter() - t0)
            return out

        def _generate_and_score_completions(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(*args, **kwargs)
            self.bench["rollout"].append(time.perf_counter() - t0)
            return out

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.busy: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())
            self.busy.append(common.cpu_busy_s())

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())
            self.busy.append(common.cpu_busy_s())

    torch.manual_seed(seed)
    tok = load_tokenizer(s.model_path)
    model = AutoModelForCausalLM.from_pretrained(s.model_path, dtype=torch.float32)
    stream = problem_stream(s, seed)
    rows = [next(stream) for _ in range(s.queries * (warmup + iterations) + s.queries)]
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})

    def arithmetic_reward(prompts, completions, answer, **kwargs):
        return [float(common.grade_answer(c, a)) for c, a in zip(completions, answer, strict=True)]

    out_dir = tempfile.mkdtemp(prefix="r3-bench-trl-")
    args = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=s.dtype == "bfloat16",  # CPU autocast (fp32 weights), as ours and the floor
        fp16=False,
        gradient_checkpointing=False,  # ours does not recompute activations either
        seed=seed,
        data_seed=seed,
        max_steps=warmup + iterations,
        per_device_train_batch_size=s.queries * s.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=s.group_size,
        num_iterations=1,
        max_completion_length=s.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token-mean over the batch, as ours
        scale_rewards="group",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        log_completions=False,
    )
    clock = StepClock()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[clock],
    )
    trainer.bench = {"generate": [], "grade": [], "rollout": [], "gen_tokens": []}
    torch.set_num_threads(threads)  # accelerate may have reset it
    trainer.train()
    steps = np.diff(clock.marks).tolist()
    busy = np.diff(clock.busy).tolist()
    b = trainer.bench
    res = PathResult(
        "trl", [], [], [], [], {"generate": [], "grade": [], "rollout_other": [], "learner+trainer": []}
    )
    for i in range(warmup, min(len(steps), len(b["generate"]))):
        res.iter_s.append(steps[i])
        res.busy_s.append(busy[i])
        res.samples.append(float(s.queries * s.group_size))
        res.gen_tokens.append(b["gen_tokens"][i])
        res.trained_tokens.append(b["gen_tokens"][i])  # every sample is trained on
        res.phases["generate"].append(b["generate"][i])
        res.phases["grade"].append(b["grade"][i])
        res.phases["rollout_other"].append(b["rollout"][i] - b["generate"][i] - b["grade"][i])
        res.phases["learner+trainer"].append(steps[i] - b["rollout"][i])
    return res


# ------------------------------------------------------------------------------------------------------------------
# Ours
# ------------------------------------------------------------------------------------------------------------------
def ours_config(s: Setting, engine: str, seed: int):
    """Our GRPO config for setting ``s`` (``common.grpo_config``: one remote runner, a local learner)."""
    return common.grpo_config(
        s.model_path,
        engine=engine,
        group_size=s.group_size,
        queries=s.queries,
        max_new_tokens=s.max_new_tokens,
        lr=s.lr,
        env_config=s.env_config,
        seed=seed,
        rank_all_wrong=s.rank_all_wrong,
    ).training(dtype=s.dtype)


class OursSession:
    """Our algorithm, built once and kept between blocks of iterations (``--rounds``)."""

    NAMES = ("generate", "grade", "sample_other", "r3_batch", "learner", "weight_sync", "train_other")

    def __init__(
        self,
        s: Setting,
        engine: str,
        seed: int,
        overlap: bool = False,
        cpu_threads: str = "auto",
        prefetch: bool = False,
    ) -> None:
        config = ours_config(s, engine, seed)
        config.training(overlap_generation=overlap, cpu_threads=cpu_threads, prefetch_rollout=prefetch)
        self.s, self.algo = s, config.build_algo()
        name = f"ours-{engine}" + ("-overlap" if overlap else "")
        name += ("" if cpu_threads == "auto" else f"-{cpu_threads}") + ("-prefetch" if prefetch else "")
        self.res = PathResult(name, [], [], [], [], {k: [] for k in self.NAMES})

    def run(self, iterations: int, timed: bool = True) -> None:
        res, n = self.res, self.s.queries * self.s.group_size
        for _ in range(iterations):
            t0, b0 = time.perf_counter(), common.cpu_busy_s()
            result = self.algo.train()
            dt = time.perf_counter() - t0
            if not timed:
                continue
            res.busy_s.append(common.cpu_busy_s() - b0)
            ph = common.phases_from_result(result, n)
            res.iter_s.append(dt)
            res.samples.append(float(n))
            res.gen_tokens.append(ph["gen_tokens"])
            res.trained_tokens.append(float(result.get("learner", {}).get("trained_tokens", 0.0)))
            for k in self.NAMES[:-1]:
                res.phases[k].append(ph[k])
            res.phases["train_other"].append(dt - ph["iteration"])
            if "torch_threads" in result.get("learner", {}):
                res.learner_threads.append(float(result["learner"]["torch_threads"]))

    def close(self) -> None:
        self.algo.stop()


def run_ours(
    s: Setting,
    engine: str,
    iterations: int,
    warmup: int,
    seed: int,
    overlap: bool = False,
    cpu_threads: str = "auto",
) -> PathResult:
    session = OursSession(s, engine, seed, overlap=overlap, cpu_threads=cpu_threads)
    try:
        session.run(warmup, timed=False)
        session.run(iterations)
    finally:
        session.close()
    return session.res


# ------------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------------
def report(s: Setting, results: dict[str, PathResult]) -> dict[str, Any]:
    print(
        f"\n## setting {s.name}: G={s.group_size}, Q={s.queries}, max_new_tokens={s.max_new_tokens}, lr={s.lr}, "
        f"dtype {s.dtype}, model {s.model_path}"
    )
    rows = []
    sums = {k: r.summary() for k, r in results.items()}
    for k, r in results.items():
        m = sums[k]
        rows.append(
            [
                k,
                m["s_per_iter_median"],
                m["s_per_iter_mean"],
                m["samples_per_s"],
                m["gen_tokens_per_s"],
                m["trained_tokens_per_s"],
                m["gen_tokens_per_iter"],
                m["trained_tokens_per_iter"],
                m["cpu_s_per_iter"],
                m["cores_busy"],
                len(r.iter_s),
            ]
        )
    print(
        common.markdown_table(
            [
                "path",
                "s/iter (median)",
                "s/iter (mean)",
                "samples/s",
                "gen tok/s",
                "trained tok/s",
                "gen tok/iter",
                "trained tok/iter",
                "CPU-s/iter",
                "cores busy",
                "iters timed",
            ],
            rows,
        )
    )
    ratios = {}
    floor, trl = sums.get("floor"), sums.get("trl")
    for k in results:
        if not k.startswith("ours"):
            continue
        for base in ("floor", "floor-2t"):
            if base in sums:
                ratios[f"{k}/{base} step time"] = (
                    sums[k]["s_per_iter_median"] / sums[base]["s_per_iter_median"]
                )
        for base in ("trl", "trl-2t"):
            if base in sums:
                ratios[f"{k}/{base} step time"] = (
                    sums[k]["s_per_iter_median"] / sums[base]["s_per_iter_median"]
                )
                ratios[f"{k}/{base} samples/s"] = sums[k]["samples_per_s"] / sums[base]["samples_per_s"]
                # The ceiling of that ratio while ours does this much work: ours at its least time on these cores
                # (its CPU-seconds spread over every core, no core ever idle), the baseline as measured.
                least = sums[k]["cpu_s_per_iter"] / (os.cpu_count() or 1)
                ratios[f"{k}/{base} samples/s, ours at its least time"] = (
                    sums[k]["samples_per_s"]
                    * sums[k]["s_per_iter_median"]
                    / least
                    / sums[base]["samples_per_s"]
                )
    if trl and floor:
        ratios["trl/floor step time"] = trl["s_per_iter_median"] / floor["s_per_iter_median"]
    if ratios:
        print()
        print(common.markdown_table(["ratio (same run)", "value"], [[k, v] for k, v in ratios.items()]))
    cores = os.cpu_count() or 1
    print(f"\nthe least time any schedule of a path's work can take on {cores} cores (CPU-s/iter / {cores}):")
    for k, m in sums.items():
        bound = m["cpu_s_per_iter"] / cores
        print(
            f"- {k}: {bound:.3f} s (measured {m['s_per_iter_median']:.3f} s: at most {m['s_per_iter_median'] / bound:.2f}x to gain)"
        )
    print("\nper-phase seconds per iteration (median):")
    for k, r in results.items():
        parts = ", ".join(f"{name} {common.median(v):.3f}" for name, v in r.phases.items() if v)
        threads = f" (learner threads per update: {sorted(r.learner_threads)})" if r.learner_threads else ""
        print(f"- {k}: {parts}; total {common.median(r.iter_s):.3f}{threads}")
    print(f"({common.load_note()} at the end of this setting)", flush=True)
    return {
        "setting": dataclasses.asdict(s),
        "summary": sums,
        "ratios": ratios,
        "phases": {k: {n: common.median(v) for n, v in r.phases.items() if v} for k, r in results.items()},
    }


# ------------------------------------------------------------------------------------------------------------------
# Scaling model: cost per iteration from per-phase costs
# ------------------------------------------------------------------------------------------------------------------
def scaling(args, model_path: str) -> dict[str, Any]:
    """Fit  t_iter = L * (a + b*B) + (d + c * B * (P + L)) + (e + f*B)  on two measured points, check on two more.

    B = Q * G sequences, L response tokens (exact: the model never samples eos), P prompt tokens. ``a + b*B`` is a
    decode step of B rows (per-step overhead a, per-row cost b); ``d + c * tokens`` the learner (c per token of
    prompt + response); ``e + f*B`` the rest (sampling overhead, R^3 batch, weight sync, RLlib bookkeeping). The two
    fit points differ in B only; the check points change L, Q and G.
    """
    P = 6  # "12+34=" with the char tokenizer
    fit_points = [(8, 4, 32), (8, 16, 32)]  # (Q, G, L)
    check_points = [(16, 8, 64), (4, 8, 96)]
    measured: dict[tuple, dict[str, float]] = {}
    for q, g, length in fit_points + check_points:
        s = Setting(
            f"scale-Q{q}-G{g}-L{length}", model_path, g, q, length, 1e-4, {"digits": 2}, True, ("ours-hf",)
        )
        r = run_ours(s, "hf", args.scaling_iterations, 1, args.seed)
        measured[(q, g, length)] = {
            "iter": common.median(r.iter_s),
            "generate": common.median(r.phases["generate"]),
            "learner": common.median(r.phases["learner"]),
        }
        print(f"  measured Q={q} G={g} L={length}: {measured[(q, g, length)]}", flush=True)
    (q1, g1, l1), (q2, g2, l2) = fit_points
    m1, m2 = measured[fit_points[0]], measured[fit_points[1]]
    b1, b2 = q1 * g1, q2 * g2
    # generation: t = L * (a + b*B): two points at equal L give b and a
    b = (m2["generate"] / l2 - m1["generate"] / l1) / (b2 - b1)
    a = m1["generate"] / l1 - b * b1
    # learner: t = c * B * (P + L)  (+ d: fit the intercept from the two points)
    x1, x2 = b1 * (P + l1), b2 * (P + l2)
    c = (m2["learner"] - m1["learner"]) / (x2 - x1)
    d = m1["learner"] - c * x1
    # everything else (sampling overhead, R^3 batch, weight sync, RLlib): e + f * B
    o1, o2 = (m["iter"] - m["generate"] - m["learner"] for m in (m1, m2))
    f = (o2 - o1) / (b2 - b1)
    e = o1 - f * b1
    rows = []
    for q, g, length in fit_points + check_points:
        bb = q * g
        pred_gen = length * (a + b * bb)
        pred_learn = d + c * bb * (P + length)
        pred = e + f * bb + pred_gen + pred_learn
        m = measured[(q, g, length)]
        kind = "fit" if (q, g, length) in fit_points else "check"
        rows.append(
            [
                f"Q={q} G={g} L={length} ({kind})",
                pred_gen,
                m["generate"],
                pred_learn,
                m["learner"],
                pred,
                m["iter"],
                m["iter"] / pred - 1.0,
            ]
        )
    print(f"\n## scaling model (ours-hf, tiny random model {model_path})")
    print(
        f"decode step: {a * 1e3:.2f} ms + {b * 1e3:.3f} ms per row; learner: {d:.3f} s + {c * 1e6:.2f} us per "
        f"token (prompt + response); rest: {e:.3f} s + {f * 1e3:.3f} ms per sequence"
    )
    print(
        common.markdown_table(
            [
                "point",
                "gen pred (s)",
                "gen meas",
                "learner pred",
                "learner meas",
                "iter pred",
                "iter meas",
                "error",
            ],
            rows,
        )
    )
    return {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f, "rows": rows}


# ------------------------------------------------------------------------------------------------------------------
def build_settings(args) -> list[Setting]:
    settings = []
    chosen = set(args.paths.split(",")) if args.paths else None
    if args.setting in ("tiny", "all"):
        default = ("ours-hf", "ours-hf-overlap", "floor", "trl", "floor-2t", "trl-2t")
        # Every path on request; by default not the vLLM ones (3x slower than HF on 8-token answers, BENCHMARKS.md
        # section 2) nor the reserved-threads ones.
        paths = tuple(p for p in PATHS if p in chosen) if chosen else default
        settings.append(
            Setting(
                "tiny",
                args.model or common.tiny_model_path(),
                args.group_size,
                args.queries,
                args.tiny_tokens,
                args.lr,
                {"digits": 2},
                False,
                paths,
                args.dtype,
            )
        )
    if args.setting in ("gen", "all"):
        # Every path by default but the ones with a prefetched rollout (on request).
        paths = tuple(p for p in PATHS if (p in chosen if chosen else not p.endswith("-prefetch")))
        model = args.gen_model or common.long_response_model("tiny" if args.smoke else "gen")
        settings.append(
            Setting(
                "gen",
                model,
                args.gen_group_size,
                args.gen_queries,
                args.gen_tokens,
                args.lr,
                {"digits": 2},
                True,
                paths,
                args.dtype,
            )
        )
    return settings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=("tiny", "gen", "all"), default="all")
    ap.add_argument("--paths", default=None, help=f"comma-separated subset of {PATHS}")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL (e.g. when it is not installed)")
    ap.add_argument("--iterations", type=int, default=10, help="timed iterations per path (tiny setting)")
    ap.add_argument("--gen-iterations", type=int, default=3, help="timed iterations per path (gen setting)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="split each path's timed iterations into this many blocks, the paths (TRL's aside) taking turns; "
        f"at most {MOST_OURS_IN_TURNS} of ours (each holds a runner's CPU while it waits)",
    )
    ap.add_argument("--model", default=None, help="tiny setting model (default: the shipped tiny model)")
    ap.add_argument(
        "--gen-model", default=None, help="gen setting model (default: built in code, ~19 M params)"
    )
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--tiny-tokens", type=int, default=8)
    ap.add_argument("--gen-group-size", type=int, default=8)
    ap.add_argument("--gen-queries", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="every path's compute dtype: bfloat16 keeps fp32 weights and autocasts (fast where the CPU has "
        "avx512_bf16 or AMX)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scaling", action="store_true", help="also fit and check the cost-per-iteration model")
    ap.add_argument("--scaling-iterations", type=int, default=3)
    ap.add_argument("--json", default=None, help="write all numbers to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="CI: one tiny iteration per path, no warm-up")
    args = ap.parse_args(argv)
    if args.smoke:
        args.setting = "tiny" if args.setting == "all" else args.setting
        args.iterations = args.gen_iterations = 1
        args.warmup = 0
        args.queries, args.group_size, args.gen_queries, args.gen_group_size, args.gen_tokens = 2, 2, 2, 2, 8
        args.scaling_iterations = 1
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.no_trl:
        keep = [p for p in (args.paths.split(",") if args.paths else PATHS) if not p.startswith("trl")]
        args.paths = ",".join(keep)
    return args


def session_for(s: Setting, path: str, seed: int) -> OursSession | FloorSession:
    """A path other than TRL's, built and ready to run iterations."""
    threads = 2 if path.endswith("-2t") else 1
    if not path.startswith("ours"):
        return FloorSession(s, seed, threads)
    engine = path.split("-")[1]
    cpu_threads = next((t for t in ("reserved", "all") if path.endswith(f"-{t}")), "auto")
    prefetch = path.endswith("-prefetch")
    return OursSession(s, engine, seed, path.endswith("-overlap"), cpu_threads, prefetch)


def run_path(s: Setting, path: str, iterations: int, args: argparse.Namespace) -> PathResult:
    """One path from start to end: built, ``args.warmup`` untimed iterations, ``iterations`` timed ones."""
    import torch

    print(f"[{s.name}] running {path} ({args.warmup} warm-up + {iterations} timed) ...", flush=True)
    t0, threads_before = time.perf_counter(), torch.get_num_threads()
    if path.startswith("trl"):
        res = run_trl(s, iterations, args.warmup, args.seed, threads=2 if path.endswith("-2t") else 1)
    else:
        session = session_for(s, path, args.seed)
        try:
            session.run(args.warmup, timed=False)
            session.run(iterations)
        finally:
            session.close()
        res = session.res
    torch.set_num_threads(threads_before)
    print(f"[{s.name}] {path} done in {time.perf_counter() - t0:.0f}s ({common.load_note()})", flush=True)
    return res


def run_in_turns(
    s: Setting, paths: list[str], iterations: int, args: argparse.Namespace
) -> dict[str, PathResult]:
    """With ``--rounds R`` > 1: ``paths`` built once each and warmed up, then taking turns for R blocks of
    ``iterations // R`` timed iterations, the order reversed every other round, so that a machine whose speed drifts
    during the run slows every path alike (in sequence, a path that ran in a slower minute reads slower). Empty
    otherwise."""
    import torch

    if args.rounds <= 1 or not paths:
        return {}
    ours = [p for p in paths if p.startswith("ours")]
    if len(ours) > MOST_OURS_IN_TURNS:
        raise SystemExit(
            f"--rounds {args.rounds} keeps every path of setting {s.name!r} alive at once: at most "
            f"{MOST_OURS_IN_TURNS} of ours (each holds one of the private Ray instance's CPUs), got {ours}: "
            "name fewer with --paths"
        )
    threads_before, sessions = torch.get_num_threads(), {}
    try:
        for path in paths:
            print(f"[{s.name}] building {path} and its {args.warmup} warm-up iterations ...", flush=True)
            sessions[path] = session_for(s, path, args.seed)
            sessions[path].run(args.warmup, timed=False)
        block = max(1, iterations // args.rounds)
        for r in range(args.rounds):
            for path in paths if r % 2 == 0 else paths[::-1]:
                sessions[path].run(block)
            print(f"[{s.name}] round {r + 1}/{args.rounds} done ({common.load_note()})", flush=True)
    finally:
        for session in sessions.values():
            session.close()
        torch.set_num_threads(threads_before)
    return {path: session.res for path, session in sessions.items()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common)
    common.print_header("bench_throughput", args)
    settings = build_settings(args)
    started = common.start_ray()
    out: dict[str, Any] = {"machine": common.machine(), "versions": common.versions(), "settings": []}
    try:
        for s in settings:
            iters = args.iterations if s.name == "tiny" else args.gen_iterations
            results = run_in_turns(s, [p for p in s.paths if not p.startswith("trl")], iters, args)
            for path in s.paths:
                if path not in results:
                    results[path] = run_path(s, path, iters, args)
            results = {path: results[path] for path in s.paths}
            out["settings"].append(report(s, results))
        if args.scaling:
            out["scaling"] = scaling(args, common.long_response_model("tiny"))
    finally:
        common.stop_ray(started)
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
