"""Warm-start fine-tuning of the tiny model on gridworld expert moves, and its held-out success rate.

RL on the gridworld needs a policy that sometimes reaches the goal: a random model never does, and groups whose
trajectories all fail give no signal. A short SFT run on ``(prompt, expert move)`` pairs from the ``sft`` split's
layouts (disjoint from ``train`` and ``test``, see :mod:`r3_rllib.envs.gridworld`) gives a partial policy; the target
is a held-out success rate well inside (0, 1), which leaves RL room to improve.

The default warm start (:func:`build_warm_start`) is deliberately short: 100 AdamW steps of 32 pairs on the
``"hgpo"`` preset (6x6 mazes, wall probability 0.3, shortest paths of 5..10 moves, a 20-step horizon, memory 2),
2,000 expert episodes whose rollouts take a random move 30 % of the time (labels are always the expert's move; no
label noise). Measured on a 2-core CPU, single-threaded, with::

    python -m r3_rllib.warmstart.gridworld --seed 0      # and --seed 1

==== ===== ============== ================================== =============================
seed  SFT   greedy,        sampled (temperature 1), 100       successful episodes' length
      time  200 held-out   held-out layouts x 8 trajectories  (greedy / sampled)
==== ===== ============== ================================== =============================
0    27 s  0.240          0.455                              6.1 / 12.9 steps
1    29 s  0.220          0.478                              5.7 / 12.1 steps
==== ===== ============== ================================== =============================

(18,379 pairs; final loss ~0.22; SFT time doubles when another job shares the two cores.) Greedy failures run
out the whole horizon (mean greedy length 16.7 steps = 0.76 x 20 + 0.24 x 6): a deterministic policy that takes a
wrong turn tends to repeat it. Sampling succeeds more often, through long detours (the optimal paths average 6.6
moves), so the G trajectories of a layout reach the same cells with different memory windows: the context
inconsistency HGPO's step groups handle. On 24 held-out layouts x 8 sampled trajectories (seed 0, as
``tests/e2e/test_gridworld_warm_start.py`` runs them), all 24 layouts have a cell that two trajectories reach with
different prompts, and 17 groups mix successes and failures.

For comparison, 600 steps of 64 pairs on the plain 5x5 defaults (3..8-move paths) reach ~0.95 greedy
(``--preset none --steps 600 --batch-size 64``): nothing left for RL.

    python -m r3_rllib.warmstart.gridworld --out runs/tiny_gridworld         # train, evaluate, save
    python -c "from r3_rllib.warmstart.gridworld import build_warm_start; build_warm_start('runs/gw', seed=0)"
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.envs.gridworld import DEFAULTS, GridWorldEnv, expert_sft_pairs
from r3_rllib.warmstart.arithmetic import encode_prompt_answer_pairs, sft_loss
from r3_rllib.warmstart.cached import build_cached, save_checkpoint

#: The env preset the warm start is made for (see :data:`r3_rllib.envs.gridworld.PRESETS`).
WARM_START_PRESET = "hgpo"
#: Optimizer steps and batch size of the warm start: few enough that the policy is partial (and the run short).
WARM_START_STEPS = 100
WARM_START_BATCH = 32
#: Expert episodes on the ``sft`` split, and the random-move probability of their rollouts (the labels stay the
#: expert's moves; the detours only put off-path histories into the prompts, as a sampling policy produces them).
WARM_START_EPISODES = 2000
WARM_START_NOISE = 0.3
WARM_START_LR = 1e-3
#: Written into a warm-start folder; a folder whose ``config_hash`` matches is reused instead of retrained.
WARM_START_METADATA = "gridworld_warm_start.json"
_WARM_START_FORMAT = 1


def encode_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and a ``loss_mask`` on the move tokens and the eos (position
    ``t`` predicts token ``t + 1``), the layout :func:`r3_rllib.warmstart.arithmetic.sft_loss` takes."""
    if not pairs:
        raise ValueError("encode_pairs needs at least one (prompt, move) pair")
    return encode_prompt_answer_pairs(pairs, tokenizer)


def train_on_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 30,
    seed: int = 0,
) -> list[float]:
    """AdamW with linear warm-up then cosine decay to 10 % of ``lr``; batches drawn by a seeded shuffle of the
    pairs every epoch. Returns the loss of every step."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return lr * (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        while len(order) < batch_size:
            epoch = list(range(len(pairs)))
            rng.shuffle(epoch)
            order += epoch
        batch = [pairs[i] for i in order[:batch_size]]
        order = order[batch_size:]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = sft_loss(model, *encode_pairs(batch, tokenizer))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def evaluate_gridworld(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env: GridWorldEnv,
    *,
    greedy: bool = True,
    group_size: int = 1,
    seed: int = 0,
    max_new_tokens: int = 8,
    max_batch_size: int = 512,
) -> dict[str, float]:
    """Success rate and steps to goal of the model on every query of ``env`` (a gridworld's layouts, or any
    multi-step env with ``episode``/``query_ids``), lockstep rollouts on the HF engine."""
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.rollout.kinds.multi_step import episode_stats, rollout_multistep

    was_training = model.training
    engine = HFEngine(model, tokenizer, max_batch_size=max_batch_size)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else 1.0, seed=seed)
    records = rollout_multistep(engine, tokenizer, env.episode, env.query_ids, group_size, params)
    model.train(was_training)
    return episode_stats(records)


def _warmup_for(steps: int) -> int:
    # A fixed 30-step warm-up would take a third of a 100-step run; a fifth keeps most steps at full rate.
    return max(1, min(30, steps // 5))


def warm_start_config(
    *,
    seed: int = 0,
    steps: int = WARM_START_STEPS,
    batch_size: int = WARM_START_BATCH,
    episodes: int = WARM_START_EPISODES,
    noise: float = WARM_START_NOISE,
    lr: float = WARM_START_LR,
    preset: str | None = WARM_START_PRESET,
    env_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that determines a warm start (JSON-able; its hash identifies the checkpoint).

    ``env_config`` may hold maze settings (the keys of :data:`r3_rllib.envs.gridworld.DEFAULTS`), ``instruction``
    and ``pool_seed``: what changes the prompts the model sees.
    """
    allowed = {*DEFAULTS, "instruction", "pool_seed"}
    bad = sorted(set(env_config or {}) - allowed)
    if bad:
        raise ValueError(f"env_config keys {bad} do not shape the prompts; allowed: {sorted(allowed)}")
    env = GridWorldEnv(split="sft", num_queries=1, preset=preset, **(env_config or {}))
    return {
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "warmup_steps": _warmup_for(steps),
        "episodes": episodes,
        "noise": noise,
        "lr": lr,
        "preset": preset,
        "env": {**env.settings, "instruction": env.instruction, "pool_seed": env.pool_seed},
        "format": _WARM_START_FORMAT,
    }


def train_warm_start(
    config: dict[str, Any],
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Fine-tune a fresh tiny model as ``config`` (from :func:`warm_start_config`) says; returns the model, its
    tokenizer and training metrics. Single-threaded, so the result does not depend on the machine's core count."""
    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer

    env_settings = dict(config["env"])
    sft_env = GridWorldEnv(
        split="sft", num_queries=min(config["episodes"], 5000), preset=config["preset"], **env_settings
    )
    pairs = expert_sft_pairs(sft_env, episodes=config["episodes"], noise=config["noise"], seed=config["seed"])
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=config["seed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        losses = train_on_pairs(
            model,
            tokenizer,
            pairs,
            steps=config["steps"],
            batch_size=config["batch_size"],
            lr=config["lr"],
            warmup_steps=config["warmup_steps"],
            seed=config["seed"],
        )
    finally:
        torch.set_num_threads(threads)
    tail = losses[-10:]
    return (
        model,
        tokenizer,
        {
            "pairs": len(pairs),
            "final_loss": sum(tail) / len(tail),
            "train_seconds": time.perf_counter() - start,
        },
    )


def build_warm_start(
    path: str | Path,
    *,
    seed: int = 0,
    steps: int = WARM_START_STEPS,
    batch_size: int = WARM_START_BATCH,
    episodes: int = WARM_START_EPISODES,
    noise: float = WARM_START_NOISE,
    lr: float = WARM_START_LR,
    preset: str | None = WARM_START_PRESET,
    env_config: dict[str, Any] | None = None,
    log: Callable[[str], Any] = print,
) -> Path:
    """Return ``path`` holding the gridworld warm start (a Hugging Face folder for ``load_tiny``/the engines),
    training it only when ``path`` does not already hold one of the same config.

    Defaults give the measured setting of the module docstring: the ``"hgpo"`` preset, 100 steps of 32 pairs.
    ``env_config`` overrides maze settings (``size``, ``max_steps``, ...) on top of ``preset``; the RL env must use
    the same settings (``GridWorldEnv(preset=preset, **env_config)``). The folder is written next to ``path`` and
    moved into place, so an interrupted build never leaves a half-written checkpoint.
    """
    config = warm_start_config(
        seed=seed,
        steps=steps,
        batch_size=batch_size,
        episodes=episodes,
        noise=noise,
        lr=lr,
        preset=preset,
        env_config=env_config,
    )
    return build_cached(
        path, config, train_warm_start, name="gridworld", metadata_file=WARM_START_METADATA, log=log
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train a warm start as :func:`build_warm_start` would, then measure greedy and sampled held-out success."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="save the fine-tuned model here (a Hugging Face folder)")
    ap.add_argument("--steps", type=int, default=WARM_START_STEPS)
    ap.add_argument("--batch-size", type=int, default=WARM_START_BATCH)
    ap.add_argument(
        "--episodes", type=int, default=WARM_START_EPISODES, help="expert episodes on the sft split"
    )
    ap.add_argument(
        "--noise", type=float, default=WARM_START_NOISE, help="random-move probability of the data rollouts"
    )
    ap.add_argument("--lr", type=float, default=WARM_START_LR)
    ap.add_argument(
        "--preset", default=WARM_START_PRESET, help="GridWorldEnv preset ('none' for the plain defaults)"
    )
    ap.add_argument("--eval-queries", type=int, default=200, help="held-out layouts of the greedy evaluation")
    ap.add_argument(
        "--sampled-queries", type=int, default=100, help="held-out layouts of the sampled evaluation"
    )
    ap.add_argument("--group-size", type=int, default=8, help="temperature-1 trajectories per sampled layout")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--env", default="{}", help="GridWorldEnv overrides as JSON (memory, size, max_steps, ...)"
    )
    args = ap.parse_args(argv)
    config = warm_start_config(
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        episodes=args.episodes,
        noise=args.noise,
        lr=args.lr,
        preset=None if args.preset == "none" else args.preset,
        env_config=json.loads(args.env),
    )
    model, tokenizer, metrics = train_warm_start(config)
    torch.set_num_threads(1)
    start = time.perf_counter()
    greedy_env = GridWorldEnv(split="test", num_queries=args.eval_queries, **config["env"])
    sampled_env = GridWorldEnv(split="test", num_queries=args.sampled_queries, **config["env"])
    greedy = evaluate_gridworld(model, tokenizer, greedy_env)
    sampled = evaluate_gridworld(
        model, tokenizer, sampled_env, greedy=False, group_size=args.group_size, seed=args.seed
    )
    report = {
        **metrics,
        "config": config,
        "test_greedy": greedy,
        "test_sampled": sampled,
        "eval_seconds": time.perf_counter() - start,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        save_checkpoint(model, tokenizer, Path(args.out), config, metrics, metadata_file=WARM_START_METADATA)
    return report


if __name__ == "__main__":
    main()
