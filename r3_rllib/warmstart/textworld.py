"""Warm-start fine-tuning of SmolLM2-135M-Instruct on TextWorld walkthroughs, and its held-out success rate.

Without a warm start SmolLM2-135M-Instruct wins no coin-collector game (it does not answer with an admissible
command inside ``<action>...</action>``), so every group of an RL run is all-zero. A short SFT run on the games'
walkthroughs gives a partial policy whose sampled trajectories win some games and lose others: mixed groups, the
signal HGPO, GiGPO-style and episode-level GRPO compare on.

The pairs are made by playing **training-split** games along TextWorld's walkthrough *through the env itself*
(:class:`r3_rllib.envs.textworld_env.TextWorldEnv`), so each prompt is exactly what the env renders at that step
(chat template, memory window, inventory, admissible commands) and each response is exactly what the env parses
(``<action>command</action>``, then the tokenizer's eos, which ends the chat turn). Before a walkthrough command the
player may take a detour (``look`` or ``inventory``: commands that never change the world, so the walkthrough still
wins) with probability ``detour``; the detour is not a label, it only puts later-step prompts with a memory window
into the data, as a sampling policy produces them.

The named model ``smollm2-135m-textworld-sft`` (:func:`build_warm_start`'s defaults) is made for the TextWorld
bench's env: ``tw-coin_collector`` level 3 (a walkthrough of three commands: two moves, then ``take coin``), 6
commands per episode, memory 2 (``bench/bench_textworld.py``). Level 1 (one room, ``take coin``) teaches only the
answer format, and a policy that has it wins every greedy game; at level 3 the player must find the coin's room,
so trajectories of one game part at the moves, the step-level groups HGPO and GiGPO-style differ on.

Measured (2-core CPU shared with other jobs; 16 training games, 8 held-out games, sampled: temperature 1, 4 per
game): level 1, 4 commands, 2 AdamW steps of 4 pairs at lr 3e-5: loss 2.03 -> 0.92, greedy 8/8, sampled 5/32;
level 1, 3 steps at lr 5e-5: loss 2.03 -> 0.16, greedy 4/4, sampled 15/16 (4 held-out games): too strong for RL.
The defaults, level 3, 6 commands, 3 steps of 4 pairs (of 48) at lr 5e-5: loss 1.93 -> 0.24, greedy 4/8, sampled
13/32 (2 min of SFT, 17 min of HF-engine evaluation): mixed outcomes.

    python -m r3_rllib.warmstart.textworld                  # train, evaluate held-out (greedy and sampled)
    python -m r3_rllib.warmstart.textworld --steps 0        # the base model's held-out success
    python -c "from r3_rllib.warmstart.textworld import build_warm_start; build_warm_start('runs/tw_sft')"
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.warmstart.cached import build_cached, save_checkpoint
from r3_rllib.warmstart.gridworld import evaluate_gridworld, train_on_pairs

#: The model the warm start fine-tunes (a named model or a folder).
WARM_START_BASE = "smollm2-135m"
#: The env the warm start is made for: the TextWorld bench's defaults. Keys are TextWorldEnv arguments.
WARM_START_ENV: dict[str, Any] = {
    "challenge": "tw-coin_collector",
    "level": 3,
    "settings": {},
    "max_steps": 6,
    "memory": 2,
    "pool_seed": 0,
}
#: Training games whose walkthroughs make the pairs, detour probability, and the SFT run (full fine-tune, fp32).
WARM_START_GAMES = 16
WARM_START_DETOUR = 0.5
WARM_START_STEPS = 3
WARM_START_BATCH = 4
WARM_START_LR = 5e-5
#: Written into a warm-start folder; a folder whose ``config_hash`` matches is reused instead of retrained.
WARM_START_METADATA = "textworld_warm_start.json"
_WARM_START_FORMAT = 1
#: Commands that never change a TextWorld game's state: detours that keep the walkthrough a winning sequence.
_DETOURS = ("look", "inventory")


def action_text(command: str) -> str:
    """The response that makes the env send ``command`` (see :func:`r3_rllib.envs.textworld_env.parse_command`)."""
    return f"<action>{command}</action>"


def walkthrough_pairs(
    env: Any, *, detour: float = 0.0, seed: int = 0, query_ids: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """``(prompt, response)`` for every walkthrough command of every game of ``env`` (a TextWorldEnv), played
    through fresh episodes of the env; detours (see the module docstring) with probability ``detour`` each, while
    the horizon leaves room for the rest of the walkthrough. Raises if a replay does not win its game."""
    if not 0.0 <= detour < 1.0:
        raise ValueError(f"detour must be in [0, 1), got {detour}")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    for qid in env.query_ids if query_ids is None else query_ids:
        episode = env.episode(qid)
        walkthrough = list(episode.game.walkthrough)
        if not walkthrough:
            raise ValueError(f"game {qid} has no walkthrough")
        info: dict[str, Any] = {}
        for i, command in enumerate(walkthrough):
            room = episode.max_steps - episode.steps - (len(walkthrough) - i)
            while room > 0 and rng.random() < detour:
                options = [c for c in _DETOURS if c in episode.admissible]
                if not options:
                    break
                episode.step(action_text(rng.choice(options)))
                room -= 1
            response = action_text(command)
            pairs.append((episode.prompt, response))
            _, _, _, _, info = episode.step(response)
        if not (episode.done and info.get("correct")):
            raise RuntimeError(f"the walkthrough of {qid} did not win it in {episode.max_steps} steps")
    return pairs


def warm_start_config(
    *,
    base: str = WARM_START_BASE,
    games: int = WARM_START_GAMES,
    detour: float = WARM_START_DETOUR,
    steps: int = WARM_START_STEPS,
    batch_size: int = WARM_START_BATCH,
    lr: float = WARM_START_LR,
    seed: int = 0,
    env_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that determines a warm start (JSON-able; its hash identifies the checkpoint). ``env_config``
    overrides keys of :data:`WARM_START_ENV` (what shapes the prompts and the games)."""
    bad = sorted(set(env_config or {}) - set(WARM_START_ENV))
    if bad:
        raise ValueError(
            f"env_config keys {bad} are not warm-start env settings; allowed: {sorted(WARM_START_ENV)}"
        )
    if games < 1 or steps < 0 or batch_size < 1:
        raise ValueError(f"need games >= 1, steps >= 0, batch_size >= 1; got {games}, {steps}, {batch_size}")
    return {
        "base": str(base),
        "env": {**WARM_START_ENV, **(env_config or {})},
        "games": games,
        "detour": detour,
        "steps": steps,
        "batch_size": batch_size,
        "warmup_steps": max(1, steps // 5),
        "lr": lr,
        "seed": seed,
        "format": _WARM_START_FORMAT,
    }


def make_env(config: dict[str, Any], tokenizer: Any, *, split: str = "train", num_games: int | None = None):
    """The TextWorldEnv of ``config``'s settings on ``split`` (its games are built and cached on first use)."""
    from r3_rllib.envs.textworld_env import TextWorldEnv

    env = dict(config["env"])
    games = config["games"] if num_games is None else num_games
    return TextWorldEnv(**env, num_games=games, split=split, shuffle=False, tokenizer=tokenizer)


def load_base(base: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model in fp32 (built first when it is a named model) and its tokenizer."""
    from transformers import AutoModelForCausalLM

    from r3_rllib.models.tiny import load_tokenizer
    from r3_rllib.warmstart.named import build_model_path

    path = build_model_path(base)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, load_tokenizer(path)


def train_warm_start(
    config: dict[str, Any],
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Fine-tune the base model as ``config`` (from :func:`warm_start_config`) says on walkthrough pairs of the
    training split; returns the model, its tokenizer and training metrics (``steps = 0``: the base model)."""
    model, tokenizer = load_base(config["base"])
    pairs = walkthrough_pairs(make_env(config, tokenizer), detour=config["detour"], seed=config["seed"])
    start = time.perf_counter()
    losses = [float("nan")]
    if config["steps"] > 0:
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
    return (
        model,
        tokenizer,
        {
            "pairs": len(pairs),
            "first_loss": losses[0],
            "final_loss": losses[-1],
            "train_seconds": time.perf_counter() - start,
        },
    )


def build_warm_start(
    path: str | Path,
    *,
    base: str = WARM_START_BASE,
    games: int = WARM_START_GAMES,
    detour: float = WARM_START_DETOUR,
    steps: int = WARM_START_STEPS,
    batch_size: int = WARM_START_BATCH,
    lr: float = WARM_START_LR,
    seed: int = 0,
    env_config: dict[str, Any] | None = None,
    log: Callable[[str], Any] = print,
) -> Path:
    """Return ``path`` holding the TextWorld warm start (a Hugging Face folder), training it only when ``path``
    does not already hold one of the same config. The RL env must use the same env settings (``env_config`` on
    top of :data:`WARM_START_ENV`). The folder is written next to ``path`` and moved into place."""
    config = warm_start_config(
        base=base,
        games=games,
        detour=detour,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        env_config=env_config,
    )
    return build_cached(
        path, config, train_warm_start, name="textworld", metadata_file=WARM_START_METADATA, log=log
    )


def evaluate_textworld(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env: Any,
    *,
    greedy: bool = True,
    group_size: int = 1,
    seed: int = 0,
    max_new_tokens: int = 24,
) -> dict[str, float]:
    """Success rate and steps to a win of the model on every game of ``env`` (lockstep rollouts, HF engine)."""
    return evaluate_gridworld(
        model,
        tokenizer,
        env,
        greedy=greedy,
        group_size=group_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        max_batch_size=64,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train a warm start as :func:`build_warm_start` would, then measure greedy and sampled held-out success."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="save the fine-tuned model here (a Hugging Face folder)")
    ap.add_argument("--base", default=WARM_START_BASE)
    ap.add_argument("--games", type=int, default=WARM_START_GAMES, help="training games (walkthroughs)")
    ap.add_argument("--detour", type=float, default=WARM_START_DETOUR)
    ap.add_argument("--steps", type=int, default=WARM_START_STEPS, help="0: evaluate the base model")
    ap.add_argument("--batch-size", type=int, default=WARM_START_BATCH)
    ap.add_argument("--lr", type=float, default=WARM_START_LR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-games", type=int, default=16, help="held-out (test split) games")
    ap.add_argument("--group-size", type=int, default=4, help="temperature-1 trajectories per held-out game")
    ap.add_argument("--env", default="{}", help="overrides of the warm-start env settings as JSON")
    args = ap.parse_args(argv)
    config = warm_start_config(
        base=args.base,
        games=args.games,
        detour=args.detour,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        env_config=json.loads(args.env),
    )
    model, tokenizer, metrics = train_warm_start(config)
    start = time.perf_counter()
    test_env = make_env(config, tokenizer, split="test", num_games=args.eval_games)
    greedy = evaluate_textworld(model, tokenizer, test_env)
    sampled = evaluate_textworld(
        model, tokenizer, test_env, greedy=False, group_size=args.group_size, seed=args.seed
    )
    report = {**metrics, "config": config, "test_greedy": greedy, "test_sampled": sampled}
    report["eval_seconds"] = time.perf_counter() - start
    print(json.dumps(report, indent=1))
    if args.out:
        save_checkpoint(model, tokenizer, Path(args.out), config, metrics, metadata_file=WARM_START_METADATA)
    return report


if __name__ == "__main__":
    main()
