"""Warm-start fine-tuning of the tiny model on gridworld expert moves, and its held-out success rate.

RL on the gridworld needs a policy that sometimes reaches the goal: a random model never does, and groups whose
trajectories all fail give no signal. A short SFT run on ``(prompt, expert move)`` pairs from the ``sft`` split's
layouts (disjoint from ``train`` and ``test``, see :mod:`r3_rllib.envs.gridworld`) gives a partial policy; the target
is a held-out success rate well inside (0, 1), which leaves RL room to improve.

    python -m r3_rllib.models.gridworld_sft --out runs/tiny_gridworld --steps 600
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.envs.gridworld import GridWorldEnv, expert_sft_pairs
from r3_rllib.models.sft import encode_prompt_answer_pairs, sft_loss


def encode_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and a ``loss_mask`` on the move tokens and the eos (position
    ``t`` predicts token ``t + 1``), the layout :func:`r3_rllib.models.sft.sft_loss` takes."""
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
) -> dict[str, float]:
    """Success rate and steps to goal of the model on every layout of ``env`` (lockstep rollouts)."""
    from r3_rllib.algorithms.r3.multistep import episode_stats, rollout_multistep
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine

    was_training = model.training
    engine = HFEngine(model, tokenizer, max_batch_size=512)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else 1.0, seed=seed)
    records = rollout_multistep(engine, tokenizer, env.episode, env.query_ids, group_size, params)
    model.train(was_training)
    return episode_stats(records)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="save the fine-tuned model here (a Hugging Face folder)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--episodes", type=int, default=2000, help="expert episodes on the sft split")
    ap.add_argument("--noise", type=float, default=0.3, help="random-move probability of the data rollouts")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="{}", help="GridWorldEnv config as JSON (memory, size, max_steps, ...)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env_config = json.loads(args.env)
    sft_env = GridWorldEnv(split="sft", num_queries=min(args.episodes, 5000), **env_config)
    test_env = GridWorldEnv(split="test", num_queries=args.eval_queries, **env_config)
    pairs = expert_sft_pairs(sft_env, episodes=args.episodes, noise=args.noise, seed=args.seed)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=args.seed)
    start = time.perf_counter()
    before = evaluate_gridworld(model, tokenizer, test_env)
    losses = train_on_pairs(model, tokenizer, pairs, steps=args.steps, lr=args.lr, seed=args.seed)
    after = evaluate_gridworld(model, tokenizer, test_env)
    sampled = evaluate_gridworld(model, tokenizer, test_env, greedy=False, group_size=4, seed=args.seed)
    report = {
        "pairs": len(pairs),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "test_greedy_before": before,
        "test_greedy_after": after,
        "test_sampled_after": sampled,
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        save_tiny(model, tokenizer, args.out)
    return report


if __name__ == "__main__":
    main()
