"""Integer arithmetic with a verifiable answer: the smallest task a tiny character-level model can learn on a CPU.

The prompt is exactly ``"12+34="`` (no chat template) and the model answers with digits then its eos token. The
pool of queries is finite (``num_queries``) so queries recur every dataset epoch, which experience replay needs.
The ``"test"`` split is drawn from the same configuration with a different seed stream and never contains a train
expression.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import QueryOrder, Shard, check_count, parse_reset_options

ALLOWED_OPERATORS = "+-*"
# Removed from responses when neither ``eos_text`` nor a tokenizer is given (the engines decode special tokens).
DEFAULT_EOS_TEXTS = ("<eos>", "</s>", "<|endoftext|>", "<|im_end|>", "<｜end▁of▁sentence｜>")
_INTEGER = re.compile(r"[+-]?\d{1,4000}")


@dataclass(frozen=True)
class ArithmeticProblem:
    expression: str  # "12+34"
    answer: str  # "46"

    @property
    def prompt(self) -> str:
        return self.expression + "="

    @property
    def query_id(self) -> str:
        return f"arith:{self.expression}"


def _digit_bounds(digits: int | Sequence[int]) -> tuple[int, int]:
    lo, hi = (digits, digits) if isinstance(digits, int) else tuple(digits)
    if isinstance(lo, bool) or not isinstance(lo, int) or not isinstance(hi, int) or not 1 <= lo <= hi:
        raise ValueError(
            f"digits must be an int >= 1 or a (min, max) pair with 1 <= min <= max, got {digits!r}"
        )
    return lo, hi


def _operators(operators: str | Sequence[str]) -> str:
    ops = "".join(dict.fromkeys("".join(operators)))  # dedupe, keep order
    if "/" in ops:
        raise ValueError("division is not supported (answers must be integers); use operators from '+-*'")
    bad = [op for op in ops if op not in ALLOWED_OPERATORS]
    if not ops or bad:
        raise ValueError(f"operators must be a non-empty string of {ALLOWED_OPERATORS!r}, got {operators!r}")
    return ops


def _evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """Left-to-right with ``*`` binding tighter than ``+``/``-`` (the usual reading of the prompt)."""
    total, sign, term = 0, 1, operands[0]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            term *= x
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), x
    return total + sign * term


def count_arithmetic_problems(
    *, digits: int | Sequence[int] = 2, num_operands: int = 2, operators: str = "+"
) -> int:
    """Number of distinct expressions for a configuration."""
    lo, hi = _digit_bounds(digits)
    if num_operands < 2:
        raise ValueError(f"num_operands must be >= 2, got {num_operands}")
    low_value = 0 if lo == 1 else 10 ** (lo - 1)
    values = 10**hi - low_value
    return values**num_operands * len(_operators(operators)) ** (num_operands - 1)


def generate_arithmetic_problems(
    n: int,
    *,
    digits: int | Sequence[int] = 2,
    num_operands: int = 2,
    operators: str = "+",
    seed: int = 0,
    exclude: Collection[str] = (),
) -> list[ArithmeticProblem]:
    """``n`` distinct problems, deterministic for ``seed``.

    Operands are uniform over the integers with ``digits`` digits (an int, or an inclusive ``(min, max)`` range;
    1-digit operands include 0), operators uniform over ``operators`` (from ``"+-*"``). Expressions in ``exclude``
    are never returned. Raises ``ValueError`` when fewer than ``n`` distinct problems exist.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    total = count_arithmetic_problems(digits=digits, num_operands=num_operands, operators=operators)
    lo, hi = _digit_bounds(digits)
    ops = _operators(operators)
    low_value, high_value = (0 if lo == 1 else 10 ** (lo - 1)), 10**hi - 1
    excluded = set(exclude)
    # A lower bound on what is left (exact when exclude holds expressions of this configuration), so the rejection
    # loop below always terminates.
    available = total - len(excluded)
    if n > available:
        raise ValueError(
            f"asked for {n} distinct problems but digits={digits!r}, num_operands={num_operands}, "
            f"operators={ops!r} allow only {total}" + (f" ({len(excluded)} excluded)" if excluded else "")
        )
    # Draw expressions and reject repeats. This draw order is part of the contract: the pools (and so the
    # held-out split of the shipped warm-start checkpoint) are defined by it.
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[ArithmeticProblem] = []
    while len(problems) < n:
        operands = [rng.randint(low_value, high_value) for _ in range(num_operands)]
        chosen = [rng.choice(ops) for _ in range(num_operands - 1)]
        expression = str(operands[0]) + "".join(
            op + str(x) for op, x in zip(chosen, operands[1:], strict=True)
        )
        if expression in seen or expression in excluded:
            continue
        seen.add(expression)
        problems.append(ArithmeticProblem(expression, str(_evaluate(operands, chosen))))
    return problems


def length_bonus(length: int, max_length: int | None) -> float:
    """``max(0, 1 - length / max_length)``; 0 when the bonus is off (``max_length=None``)."""
    if max_length is None:
        return 0.0
    return max(0.0, 1.0 - length / max_length)


class ArithmeticEnv(PooledTextEnv):
    """Single-step arithmetic: prompt ``"12+34="``, reward 1 when the response is the integer answer.

    Config:
        digits, num_operands, operators: the problem space (see :func:`generate_arithmetic_problems`).
        num_queries: size of the finite pool (per split).
        pool_seed: which problems form the pool (train: drawn with ``pool_seed``; test: with ``pool_seed + 1``,
            train expressions excluded). Separate from ``seed`` so that runners with different ``seed`` (each
            rollout worker gets its own) train on the same queries and test on the same disjoint ones.
        seed: the per-epoch shuffle (see ``QueryOrder``).
        shuffle: reshuffle the pool every epoch (else serve it in generation order).
        shard: serve only this part of each epoch's order (a :class:`~r3_rllib.envs.data.Shard` or a mapping
            ``{batch_size, start, count}``); the EnvRunners set it so that together they walk one global order
            per epoch. None: the whole pool.
        length_bonus_max_tokens: ``L``; correct answers get ``max(0, 1 - len / L)`` more reward, ``len`` the
            response's characters without the eos text, whitespace included (the tiny tokenizer is character
            level: characters are tokens). ``None``: no bonus.
        split: ``"train"`` or ``"test"`` (a disjoint pool of the same size and configuration).
        eos_text: text(s) removed from responses before grading; default the tokenizer's eos token when a
            tokenizer is given, else :data:`DEFAULT_EOS_TEXTS`.
        tokenizer: optional; its ``eos_token``, and it counts the prompts' tokens for the context check.
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills
            them in); a prompt too long for them raises ``DataError`` naming the query
            (:mod:`r3_rllib.envs.context`). None: no check.
    """

    def __init__(
        self,
        *,
        digits: int | Sequence[int] = 2,
        num_operands: int = 2,
        operators: str = "+",
        num_queries: int = 1000,
        pool_seed: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        length_bonus_max_tokens: int | None = None,
        split: Literal["train", "test"] = "train",
        eos_text: str | Sequence[str] | None = None,
        tokenizer: Any = None,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
    ) -> None:
        super().__init__()
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        check_count("length_bonus_max_tokens", length_bonus_max_tokens, minimum=1)
        check_count("num_queries", num_queries, minimum=1, optional=False)
        space = dict(digits=digits, num_operands=num_operands, operators=operators)
        train = generate_arithmetic_problems(num_queries, seed=pool_seed, **space)
        if split == "train":
            self.problems = train
        else:
            total = count_arithmetic_problems(**space)
            if total < 2 * num_queries:
                raise ValueError(
                    f"a test split of {num_queries} queries disjoint from {num_queries} train queries needs "
                    f"{2 * num_queries} distinct problems; this configuration has {total}"
                )
            # Another seed stream, and every train expression excluded: disjoint by construction.
            self.problems = generate_arithmetic_problems(
                num_queries, seed=pool_seed + 1, exclude={p.expression for p in train}, **space
            )
        self.split = split
        self.length_bonus_max_tokens = length_bonus_max_tokens
        if eos_text is None:
            eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
            eos_text = (eos,) if eos else DEFAULT_EOS_TEXTS
        self.eos_texts = (eos_text,) if isinstance(eos_text, str) else tuple(eos_text)
        self._by_id = {p.query_id: p for p in self.problems}
        self._order = QueryOrder(len(self.problems), seed=seed, shuffle=shuffle, shard=shard)
        self._current: ArithmeticProblem | None = None
        prompts = ((p.query_id, p.prompt) for p in self.problems)
        check_prompts_fit(prompts, tokenizer, model_max_positions, max_new_tokens, env_name="arithmetic")

    # -- TextEnv ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.problems)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Next query of the shuffled pool; ``seed`` restarts the iteration (pass 0, cursor 0) with that shuffle
        seed (the pool itself is fixed by the config). Options: ``query_id`` re-serves that query without moving
        the cursor; ``user_content`` (with ``query_id``) is served as the prompt instead of the expression."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        if query_id is None:
            problem = self.problems[self._order.next()]
        else:
            problem = self.problem(query_id)
        self._current = problem
        query_text = problem.prompt
        prompt = query_text if user_content is None else user_content
        # query_text is the query's own content even when user_content replaces the prompt (stable per query_id).
        return prompt, {"query_id": problem.query_id, "query_text": query_text, "gold": problem.answer}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._current is None:
            raise RuntimeError("call reset() before step(); an episode is one response")
        problem, self._current = self._current, None
        response = action
        for eos in self.eos_texts:
            response = response.replace(eos, "")
        answer = response.strip()
        correct = bool(_INTEGER.fullmatch(answer)) and int(answer) == int(problem.answer)
        bonus = length_bonus(len(response), self.length_bonus_max_tokens) if correct else 0.0
        correctness = 1.0 if correct else 0.0
        info = {
            "query_id": problem.query_id,
            "correct": correct,
            "reward_components": {"correctness": correctness, "length_bonus": bonus},
            "gold": problem.answer,
        }
        return "", correctness + bonus, True, False, info

    # -- helpers ---------------------------------------------------------------------------------------------
    def problem(self, query_id: str) -> ArithmeticProblem:
        try:
            return self._by_id[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not in this environment's {self.split} pool of "
                f"{len(self.problems)} queries"
            ) from None

    @property
    def query_ids(self) -> list[str]:
        return [p.query_id for p in self.problems]
