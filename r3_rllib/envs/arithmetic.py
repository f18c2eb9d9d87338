"""Synthetic arithmetic: a task family whose difficulty is dialled by digits, operands and operators.

The prompt is ``"12+34="``; the policy (the tiny character-level model) answers with digits and stops. The pool of
queries is finite so queries recur every dataset epoch, as in real math datasets (R^3's replay needs history).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from r3_rllib.envs.base import TextEnv

OPERATORS = "+-*"


@dataclass(frozen=True)
class ArithmeticProblem:
    expression: str
    answer: str

    @property
    def prompt(self) -> str:
        return self.expression + "="


def _digit_range(digits: int | tuple[int, int]) -> tuple[int, int]:
    lo, hi = (digits, digits) if isinstance(digits, int) else tuple(digits)
    if not 1 <= lo <= hi:
        raise ValueError(f"digits must be >= 1 (or a (min, max) pair), got {digits!r}")
    return (0 if lo == 1 else 10 ** (lo - 1)), 10**hi - 1


def _space_size(digits, num_operands: int, operators: str) -> int:
    lo, hi = _digit_range(digits)
    return (hi - lo + 1) ** num_operands * len(operators) ** (num_operands - 1)


def generate_arithmetic_problems(
    n: int,
    *,
    digits: int | tuple[int, int] = 2,
    num_operands: int = 2,
    operators: str = "+",
    seed: int = 0,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[ArithmeticProblem]:
    """`n` distinct problems, deterministic for `seed`; expressions in `exclude` are never produced."""
    if num_operands < 2:
        raise ValueError(f"num_operands must be >= 2, got {num_operands}")
    bad = set(operators) - set(OPERATORS)
    if not operators or bad:
        raise ValueError(f"operators must be a non-empty subset of {OPERATORS!r}, got {operators!r}")
    available = _space_size(digits, num_operands, operators) - len(exclude)
    if n > available:
        raise ValueError(f"asked for {n} distinct problems but only {available} exist for this configuration")
    lo, hi = _digit_range(digits)
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[ArithmeticProblem] = []
    while len(out) < n:
        terms = [str(rng.randint(lo, hi)) for _ in range(num_operands)]
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        expr = terms[0] + "".join(o + t for o, t in zip(ops, terms[1:], strict=True))
        if expr in seen or expr in exclude:
            continue
        seen.add(expr)
        out.append(ArithmeticProblem(expr, str(eval(expr))))  # noqa: S307 - digits and + - * only
    return out


class ArithmeticEnv(TextEnv):
    """Single-step arithmetic task (see module docstring). Reward 1 for the exact integer, else 0, plus an optional
    length bonus ``max(0, 1 - len/L_max)`` for correct answers (len in characters = tokens of the tiny model)."""

    def __init__(
        self,
        *,
        digits: int | tuple[int, int] = 2,
        num_operands: int = 2,
        operators: str = "+",
        num_queries: int = 1000,
        seed: int = 0,
        shuffle: bool = True,
        split: str = "train",
        length_bonus_max_tokens: int | None = None,
        eos_text: str = "<eos>",
    ) -> None:
        super().__init__()
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        # The train pool always comes from the base seed (the env seed only changes the order), so every runner and
        # every run with the same task config trains on the same queries and tests on disjoint ones.
        train = generate_arithmetic_problems(
            num_queries, digits=digits, num_operands=num_operands, operators=operators, seed=1
        )
        if split == "train":
            self.problems = train
        else:
            self.problems = generate_arithmetic_problems(
                num_queries,
                digits=digits,
                num_operands=num_operands,
                operators=operators,
                seed=2,
                exclude={p.expression for p in train},
            )
        self._by_id = {self.query_id(p): p for p in self.problems}
        self.seed = seed
        self.shuffle = shuffle
        self.length_bonus_max_tokens = length_bonus_max_tokens
        self.eos_text = eos_text
        self.epoch = 0
        self._cursor = 0
        self._order = self._make_order()
        self._current: ArithmeticProblem | None = None

    @staticmethod
    def query_id(p: ArithmeticProblem) -> str:
        return f"arith:{p.expression}"

    def _make_order(self) -> list[int]:
        order = list(range(len(self.problems)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self.problems)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        options = options or {}
        if "query_id" in options:
            qid = options["query_id"]
            if qid not in self._by_id:
                raise KeyError(f"unknown query_id {qid!r}")
            problem = self._by_id[qid]
        else:
            if self._cursor >= len(self._order):
                self.epoch += 1
                self._cursor = 0
                self._order = self._make_order()
            problem = self.problems[self._order[self._cursor]]
            self._cursor += 1
        self._current = problem
        prompt = options.get("user_content") or problem.prompt
        return prompt, {
            "query_id": self.query_id(problem),
            "query_text": problem.prompt,
            "gold": problem.answer,
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._current is None:
            raise RuntimeError("step() called before reset()")
        text = action.replace(self.eos_text, "").strip()
        correct = text.lstrip("-").isdigit() and int(text) == int(self._current.answer)
        bonus = 0.0
        if correct and self.length_bonus_max_tokens:
            bonus = max(0.0, 1.0 - len(text) / self.length_bonus_max_tokens)
        info = {
            "correct": correct,
            "reward_components": {"correctness": float(correct), "length_bonus": bonus},
            "gold": self._current.answer,
        }
        return "", float(correct) + bonus, True, False, info

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self._cursor}

    def set_state(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._order = self._make_order()
