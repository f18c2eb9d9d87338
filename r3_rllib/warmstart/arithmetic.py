"""Warm-start supervised fine-tuning of the tiny model on arithmetic, so RL starts from a policy with some skill.

A randomly initialised policy almost never emits a correct answer, and GRPO learns nothing from groups whose rewards
are all zero. A short SFT run on ``"12+34=" -> "46<eos>"`` pairs brings the tiny model to a partial accuracy that
leaves RL room to improve.

Training is deterministic for a seed (fixed data order, ``torch.manual_seed``, one torch thread) and checkpoints are
cached under a hash of their configuration. Accuracy is greedy exact match on the arithmetic env's ``test`` split;
SFT trains on problems outside both the env's ``train`` and ``test`` splits (pool size ``num_eval``), so the RL task's
queries are new to the warm-started model.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

# Bump when the training procedure changes, so cached checkpoints from older code are not reused.
SFT_FORMAT_VERSION = 1
METADATA_FILE = "r3_sft.json"


@dataclass(frozen=True)
class SFTConfig:
    """Everything that determines a warm-start checkpoint (its hash names the cache entry)."""

    digits: int = 2
    num_operands: int = 2
    operators: str = "+"
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decay from lr to lr * min_lr_ratio over `steps`
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    train_pool: int = 6000  # distinct training problems (capped by steps * batch_size)
    num_eval: int = 1000
    eval_every: int = 100
    target_accuracy: float | None = None

    def __post_init__(self) -> None:
        for name in ("digits", "num_operands", "steps", "batch_size", "train_pool", "num_eval", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"SFTConfig.lr must be > 0, got {self.lr}")
        if self.target_accuracy is not None and not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"SFTConfig.target_accuracy must be in (0, 1], got {self.target_accuracy}")

    def config_hash(self) -> str:
        payload = json.dumps({"format": SFT_FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("R3_CACHE_DIR") or Path.home() / ".cache" / "r3_rllib")


def _env_split(cfg: SFTConfig, split: str) -> list[Any]:
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    env = ArithmeticEnv(
        digits=cfg.digits,
        num_operands=cfg.num_operands,
        operators=cfg.operators,
        num_queries=cfg.num_eval,
        split=split,
    )
    return list(env.problems)


def heldout_problems(cfg: SFTConfig) -> list[Any]:
    """The evaluation problems: the arithmetic env's ``test`` split with ``num_queries = cfg.num_eval``."""
    return _env_split(cfg, "test")


def training_pool(cfg: SFTConfig) -> list[Any]:
    """Distinct training problems, disjoint from the env's ``train`` and ``test`` splits of size ``num_eval``.

    Keeping the RL queries out of SFT means RL gains on them are not recall of SFT data.
    """
    from r3_rllib.envs.arithmetic import generate_arithmetic_problems

    exclude = {p.expression for split in ("train", "test") for p in _env_split(cfg, split)}
    size = min(cfg.train_pool, cfg.steps * cfg.batch_size)
    try:
        return generate_arithmetic_problems(
            size,
            digits=cfg.digits,
            num_operands=cfg.num_operands,
            operators=cfg.operators,
            seed=cfg.seed + 17,
            exclude=exclude,
        )
    except ValueError as err:
        raise ValueError(
            f"SFT training pool (train_pool={cfg.train_pool}, num_eval={cfg.num_eval}): {err}"
        ) from err


def _training_stream(cfg: SFTConfig, pool: list[Any]) -> Iterator[list[Any]]:
    """Batches in a fixed order: the pool reshuffled every epoch with a seed-derived generator."""
    rng = random.Random(cfg.seed)
    order: list[int] = []
    while True:
        while len(order) < cfg.batch_size:
            epoch = list(range(len(pool)))
            rng.shuffle(epoch)
            order.extend(epoch)
        yield [pool[i] for i in order[: cfg.batch_size]]
        order = order[cfg.batch_size :]


def encode_sft_batch(
    problems: Sequence[Any], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`encode_prompt_answer_pairs` of ``expression=`` -> answer for each arithmetic problem."""
    return encode_prompt_answer_pairs([(p.expression + "=", str(p.answer)) for p in problems], tokenizer)


def encode_prompt_answer_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and a ``loss_mask`` that is 1 on answer tokens and the eos.

    ``loss_mask[b, t]`` marks targets: position ``t`` predicts ``input_ids[b, t + 1]``.
    """
    if not pairs:
        raise ValueError("need at least one (prompt, answer) pair")
    seqs, starts = [], []
    for prompt_text, answer_text in pairs:
        prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
        answer = tokenizer.encode(answer_text, add_special_tokens=False)
        seqs.append(prompt + answer + [tokenizer.eos_token_id])
        starts.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), width - 1), dtype=torch.float32)
    for b, (s, start) in enumerate(zip(seqs, starts, strict=True)):
        ids[b, : len(s)] = torch.tensor(s)
        attn[b, : len(s)] = 1
        loss_mask[b, start - 1 : len(s) - 1] = 1.0
    return ids, attn, loss_mask


def sft_loss(
    model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Mean token cross-entropy over the answer tokens and eos."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * loss_mask).sum() / loss_mask.sum()


def evaluate_exact_match(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Any],
    greedy: bool = True,
    *,
    seed: int = 0,
    max_batch_size: int = 512,
) -> float:
    """Fraction of problems whose completion of ``expression + "="`` is exactly the answer followed by eos."""
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine

    if not problems:
        raise ValueError("evaluate_exact_match needs at least one problem")
    was_training = model.training
    engine = HFEngine(model, tokenizer, max_batch_size=max_batch_size)
    prompts = [tokenizer.encode(p.expression + "=", add_special_tokens=False) for p in problems]
    max_new = max(len(str(p.answer)) for p in problems) + 2
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0 if greedy else 1.0, seed=seed)
    results = engine.generate(prompts, 1, params)
    model.train(was_training)
    hits = sum(
        r[0].finish_reason == "stop" and r[0].text == str(p.answer)
        for r, p in zip(results, problems, strict=True)
    )
    return hits / len(problems)


def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio``; ``step`` counts finished optimizer steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_sft(
    cfg: SFTConfig, *, log: Any = print
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Train a fresh tiny model; return ``(model, tokenizer, metrics)``. Deterministic for ``cfg``."""
    tokenizer = build_tiny_tokenizer()
    heldout = heldout_problems(cfg)
    pool = training_pool(cfg)
    history: list[dict[str, float]] = []
    with _single_thread():
        torch.manual_seed(cfg.seed)
        model = build_tiny_model(
            tokenizer,
            hidden=cfg.hidden,
            layers=cfg.layers,
            heads=cfg.heads,
            kv_heads=cfg.kv_heads,
            seed=cfg.seed,
        )
        model.train()
        optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(s, cfg))
        start = time.perf_counter()
        stream = _training_stream(cfg, pool)
        step, accuracy, losses = 0, None, []
        for step in range(1, cfg.steps + 1):
            ids, attn, loss_mask = encode_sft_batch(next(stream), tokenizer)
            loss = sft_loss(model, ids, attn, loss_mask)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optim.step()
            sched.step()
            losses.append(loss.item())
            if step % cfg.eval_every == 0 or step == cfg.steps:
                accuracy = evaluate_exact_match(model, tokenizer, heldout)
                mean_loss = sum(losses) / len(losses)
                losses = []
                elapsed = time.perf_counter() - start
                history.append({"step": step, "loss": mean_loss, "accuracy": accuracy, "seconds": elapsed})
                log(
                    f"step {step:5d}  loss {mean_loss:.4f}  held-out exact match {accuracy:.3f}  {elapsed:6.1f}s"
                )
                if cfg.target_accuracy is not None and accuracy >= cfg.target_accuracy:
                    break
        model.eval()
    metrics = {
        "steps_trained": step,
        "heldout_accuracy": accuracy,
        "num_heldout": len(heldout),
        "train_seconds": time.perf_counter() - start,
        "history": history,
    }
    return model, tokenizer, metrics


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    file = Path(path) / METADATA_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def _make_readable(folder: Path) -> None:
    # mkdtemp creates a private folder; a checkpoint should get the usual permissions (shared caches, packaging).
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        file.chmod(0o666 & ~umask)


def warm_start_tiny(
    out_dir: str | Path | None = None,
    *,
    digits: int = 2,
    num_operands: int = 2,
    operators: str = "+",
    steps: int = SFTConfig.steps,
    seed: int = 0,
    target_accuracy: float | None = None,
    batch_size: int = SFTConfig.batch_size,
    lr: float = SFTConfig.lr,
    train_pool: int = SFTConfig.train_pool,
    eval_every: int = SFTConfig.eval_every,
    num_eval: int = SFTConfig.num_eval,
    cache_dir: str | Path | None = None,
    log: Any = print,
) -> Path:
    """Return a folder with a warm-started tiny model, training it only if no checkpoint of this config exists.

    Without ``out_dir`` the checkpoint lives in ``cache_dir`` (default ``$R3_CACHE_DIR`` or ``~/.cache/r3_rllib``)
    under a name derived from the config hash. A folder whose metadata has the same hash is returned untouched.
    ``target_accuracy`` stops training at the first evaluation (every ``eval_every`` steps) that reaches it.
    """
    cfg = SFTConfig(
        digits=digits,
        num_operands=num_operands,
        operators=operators,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        train_pool=train_pool,
        num_eval=num_eval,
        eval_every=eval_every,
        target_accuracy=target_accuracy,
    )
    key = cfg.config_hash()
    if out_dir is None:
        out_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        out_dir = out_dir / f"tiny-sft-{key}"
    out_dir = Path(out_dir)
    meta = read_metadata(out_dir)
    if meta is not None and meta.get("config_hash") == key:
        log(f"warm start: reusing {out_dir} (config {key})")
        return out_dir

    model, tokenizer, metrics = train_sft(cfg, log=log)
    # Write next to the destination, then move into place, so a crash never leaves a half-written cache entry.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    save_tiny(model, tokenizer, tmp)
    meta = {"config_hash": key, "config": dataclasses.asdict(cfg), "format": SFT_FORMAT_VERSION, **metrics}
    (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    _make_readable(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    log(f"warm start: saved {out_dir}  held-out exact match {metrics['heldout_accuracy']:.3f}")
    return out_dir


def add_sft_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``r3 sft`` options (for wiring into another CLI: ``add_sft_args(sub); sub.set_defaults(func=run_sft)``)."""
    parser.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: the cache)")
    parser.add_argument("--steps", type=int, default=SFTConfig.steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--num-operands", type=int, default=2)
    parser.add_argument("--operators", default="+")
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size)
    parser.add_argument("--lr", type=float, default=SFTConfig.lr)
    parser.add_argument("--train-pool", type=int, default=SFTConfig.train_pool)
    parser.add_argument("--eval-every", type=int, default=SFTConfig.eval_every)
    parser.add_argument("--num-eval", type=int, default=SFTConfig.num_eval)
    parser.add_argument(
        "--target-accuracy", type=float, default=None, help="stop once held-out accuracy reaches it"
    )
    parser.add_argument("--cache-dir", type=Path, default=None)
    return parser


def run_sft(args: argparse.Namespace) -> int:
    """Train (or reuse) the checkpoint that ``args`` (from :func:`add_sft_args`) describe; print its accuracy."""
    try:
        path = warm_start_tiny(
            args.out,
            digits=args.digits,
            num_operands=args.num_operands,
            operators=args.operators,
            steps=args.steps,
            seed=args.seed,
            target_accuracy=args.target_accuracy,
            batch_size=args.batch_size,
            lr=args.lr,
            train_pool=args.train_pool,
            eval_every=args.eval_every,
            num_eval=args.num_eval,
            cache_dir=args.cache_dir,
        )
    except ValueError as err:
        print(f"r3 sft: {err}", file=sys.stderr)
        return 2
    meta = read_metadata(path) or {}
    print(f"checkpoint: {path}")
    print(
        f"held-out greedy exact match: {meta.get('heldout_accuracy')} on {meta.get('num_heldout')} problems"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``r3 sft``: train (or reuse) a warm-start checkpoint and print its held-out accuracy."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # tolerate a separator left over by a parent parser
        argv = argv[1:]
    parser = add_sft_args(argparse.ArgumentParser(prog="r3 sft", description=__doc__.splitlines()[0]))
    return run_sft(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
