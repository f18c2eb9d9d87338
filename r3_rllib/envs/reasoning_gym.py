"""reasoning-gym tasks as single-step text environments (optional extra: ``pip install r3-rllib[envs]``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates procedural reasoning problems (100+
tasks: arithmetic, logic puzzles, graphs, ciphers, ...) offline, each with its own verifier. This env serves the
problems of one task, or of a weighted mix of several (reasoning-gym's composite dataset), and rewards an answer with
the task's own ``score_answer`` (a number in [0, 1]; 1 is correct).

- **Answer format**: the model is asked (reasoning-gym's default system prompt) to put its final answer in
  ``<answer>...</answer>``; the last such block is extracted and scored. No block: reward 0, reason ``no_answer``.
- **Few-shot examples** (``few_shot: k``): k solved problems of the same task(s), shown as earlier user/assistant
  turns whose answers are written in the asked format, before the problem. A small model that ignores a format
  stated in words follows one it has seen (SmolLM2-135M-Instruct writes no ``<answer>`` block zero-shot and does
  with three examples: BENCHMARKS.md section 22). The examples come from a third seed range; one whose question is a
  test problem is skipped (a held-out answer is never in a prompt), and training problems are avoided where the
  task has enough distinct problems (a small task, e.g. sums of two digits, may show a training problem).
- **Splits**: ``train`` and ``test`` are generated from different seeds, and every training problem whose question
  also appears among the ``test_size`` test problems is dropped (counted in ``data_report``), so the held-out
  problems are never trained on.
- **Run seeds give different problems**: reasoning-gym seeds problem ``i`` with ``seed + i``, so generator seeds 0,
  1 and 2 would share all but one problem of each split. The env's ``seed`` is therefore spread
  (:func:`generator_seed`: ``seed * SEED_STRIDE``, plus the split's offset); seed 0 keeps reasoning-gym's own seed-0
  problems.
- **Data order**: the same global, per-epoch order and runner sharding as the other envs (``seed``, ``shuffle``,
  ``shard``; checkpointed through ``state()``).
- **Failures**: a task that cannot be built raises a ``ValueError`` naming it; a verifier that raises on an answer
  gives reward 0 with reason ``verifier_error`` (the exception type and message in ``info["grade_detail"]``), never
  a crash of the runner. ``info["grade_reason"]`` is one of ``correct``, ``partial``, ``wrong``, ``no_answer``,
  ``verifier_error``. A verifier that does not return within ``reward_timeout_s`` (default 30 s) gives reward 0
  with reason ``timeout`` (:func:`r3_rllib.rewards.bounded_call`), instead of hanging the runner.
- **Chat template** (``apply_chat_template``): ``"auto"``, ``"required"`` or ``"none"``, as for every text env
  (:mod:`r3_rllib.envs.chat`). **Context**: a prompt whose tokens + ``max_new_tokens`` exceed
  ``model_max_positions`` (both filled in by the EnvRunner) is refused when the env is built, naming the query
  (:mod:`r3_rllib.envs.context`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal

from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.chat import use_chat_template
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import QueryOrder, Shard, parse_reset_options
from r3_rllib.envs.math_env import load_tokenizer
from r3_rllib.rewards.bounded import DEFAULT_REWARD_TIMEOUT_S, bounded_call

#: Seed offset of the test split within a run seed's range (train uses offset 0).
TEST_SEED_OFFSET = 1_000_003
#: Seed offset of the few-shot examples' problems (neither a training nor a test seed).
FEW_SHOT_SEED_OFFSET = 2_000_029
#: Distance between the generator seeds of consecutive run seeds. A run seed's splits draw from seed ranges
#: [0, size), [TEST_SEED_OFFSET, + test_size) and [FEW_SHOT_SEED_OFFSET, + a few hundred) above its base, disjoint
#: for up to MAX_SPLIT_SIZE problems per split (larger sizes are refused), and all below SEED_STRIDE: the problems
#: of different run seeds come from disjoint seed ranges.
SEED_STRIDE = 10_000_019
#: The largest ``size`` / ``test_size``: the train split's seed range must end before the test split's starts.
MAX_SPLIT_SIZE = TEST_SEED_OFFSET
GRADE_REASONS = ("correct", "partial", "wrong", "no_answer", "verifier_error", "timeout")

TaskSpec = str | Mapping[str, float] | Mapping[str, Mapping[str, Any]]


def _import_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as e:  # the optional extra is not installed
        raise ImportError(
            "the reasoning_gym env needs the reasoning-gym package: pip install 'r3-rllib[envs]'"
        ) from e
    return reasoning_gym


def task_specs(tasks: TaskSpec) -> list[tuple[str, float, dict[str, Any]]]:
    """``(name, weight, config)`` per task from a name, ``{name: weight}`` or ``{name: {"weight": w, "config":
    {...}}}``; unknown task names raise a ValueError listing the closest known ones."""
    if isinstance(tasks, str):
        specs = [(tasks, 1.0, {})]
    elif isinstance(tasks, Mapping) and tasks:
        specs = []
        for name, spec in tasks.items():
            if isinstance(spec, Mapping):
                specs.append((name, float(spec.get("weight", 1.0)), dict(spec.get("config", {}))))
            else:
                specs.append((name, float(spec), {}))
    else:
        raise ValueError(f"tasks must be a task name or a non-empty {{name: weight}} mapping, got {tasks!r}")
    known = set(_import_reasoning_gym().factory.DATASETS)
    for name, weight, _ in specs:
        if name not in known:
            hint = difflib.get_close_matches(name, sorted(known), n=3)
            raise ValueError(
                f"unknown reasoning-gym task {name!r}" + (f"; did you mean {hint}?" if hint else "")
            )
        if not weight > 0:
            raise ValueError(f"reasoning-gym task {name!r}: weight must be > 0, got {weight}")
    return specs


def generator_seed(seed: int, offset: int = 0) -> int:
    """reasoning-gym's dataset seed for run seed ``seed`` and a split's ``offset`` (see the module: its problem ``i``
    is drawn with ``seed + i``, so run seeds must map to ranges ``SEED_STRIDE`` apart)."""
    return seed * SEED_STRIDE + offset


def build_dataset(specs: list[tuple[str, float, dict[str, Any]]], *, size: int, seed: int):
    """The reasoning-gym dataset of `specs` (one task directly, several through the composite dataset); a task that
    cannot be built (bad config, generator failure) raises a ValueError naming it."""
    rg = _import_reasoning_gym()
    try:
        if len(specs) == 1:
            name, _, config = specs[0]
            return rg.create_dataset(name, size=size, seed=seed, **config)
        from reasoning_gym.composite import DatasetSpec

        datasets = [DatasetSpec(name, weight, config) for name, weight, config in specs]
        return rg.create_dataset("composite", size=size, seed=seed, datasets=datasets)
    except Exception as e:  # reasoning-gym raises TypeError/AssertionError/ValueError for bad task configs
        names = ", ".join(name for name, _, _ in specs)
        raise ValueError(f"reasoning-gym task(s) {names} could not be built: {type(e).__name__}: {e}") from e


class ReasoningGymEnv(PooledTextEnv):
    """One reasoning-gym task or a weighted mix, single-step, scored by the task's verifier (see the module).

    Config:
        tasks: a task name (``"basic_arithmetic"``), ``{name: weight}`` or ``{name: {"weight": w, "config": {...}}}``
            (``config``: the task's own options, e.g. ``{"min_terms": 2, "max_terms": 3}``).
        split: ``"train"`` or ``"test"``.
        size: number of training problems generated (before dropping those that repeat a test problem).
        test_size: number of test problems.
        seed: the run seed (>= 0): the data order's seed, and the generators' through :func:`generator_seed`.
        shuffle, shard: the per-epoch order and this env's shard of it, as in the other envs.
        tokenizer: a tokenizer object or folder; renders the prompt (see ``apply_chat_template``) and counts tokens.
        apply_chat_template: ``"auto"`` (default), ``"required"`` or ``"none"`` (see :mod:`r3_rllib.envs.chat`).
        system_prompt: the system turn (default: reasoning-gym's, which asks for ``<answer>`` tags); None: none.
        answer_tag: the tag the answer is extracted from.
        few_shot: number of solved examples shown before each problem (0: none; see the module).
        reward: ``"score"`` (the verifier's score in [0, 1]) or ``"binary"`` (1 if the score is 1, else 0).
        reward_timeout_s: seconds the task's verifier may take per answer (default 30); past it the answer scores
            0 with reason ``timeout``.
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills
            them in); a prompt too long for them raises ``DataError`` naming the query. None: no check.
    """

    def __init__(
        self,
        *,
        tasks: TaskSpec = "basic_arithmetic",
        split: Literal["train", "test"] = "train",
        size: int = 1000,
        test_size: int = 200,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        tokenizer: Any = None,
        system_prompt: str | None = "default",
        answer_tag: str = "answer",
        reward: Literal["score", "binary"] = "score",
        few_shot: int = 0,
        apply_chat_template: bool | str = "auto",
        reward_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
    ) -> None:
        super().__init__()
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if reward not in ("score", "binary"):
            raise ValueError(f"reward must be 'score' or 'binary', got {reward!r}")
        if not (1 <= size <= MAX_SPLIT_SIZE and 1 <= test_size <= MAX_SPLIT_SIZE):
            raise ValueError(
                f"size and test_size must be in [1, {MAX_SPLIT_SIZE:,}] (the splits' generator-seed ranges must "
                f"not overlap), got {size} and {test_size}"
            )
        if few_shot < 0:
            raise ValueError(f"few_shot must be >= 0, got {few_shot}")
        if seed < 0:  # Python's Random takes |seed|: a negative seed's problems would repeat a positive one's
            raise ValueError(f"seed must be >= 0, got {seed}")
        if not reward_timeout_s > 0:
            raise ValueError(f"reward_timeout_s must be > 0, got {reward_timeout_s!r}")
        self.reward_timeout_s = float(reward_timeout_s)
        self.specs = task_specs(tasks)
        self.split, self.answer_tag, self.reward_mode = split, answer_tag, reward
        self.tokenizer = load_tokenizer(tokenizer)
        self.use_chat_template = use_chat_template(self.tokenizer, apply_chat_template)
        self.system_prompt = _system_prompt(system_prompt)
        self.dataset, self.entries, dropped = self._split_entries(size, test_size, seed)
        self.data_report = {"loaded": len(self.entries), "dropped_in_test_split": dropped}
        self.examples = self._few_shot_examples(few_shot, seed)
        self.query_ids = [f"{split}/{i}" for i in range(len(self.entries))]
        self._index = {qid: i for i, qid in enumerate(self.query_ids)}
        self._order = QueryOrder(len(self.entries), seed=seed, shuffle=shuffle, shard=shard)
        self._current: int | None = None
        check_prompts_fit(
            (
                (qid, self.render_prompt(e["question"]))
                for qid, e in zip(self.query_ids, self.entries, strict=True)
            ),
            self.tokenizer,
            model_max_positions,
            max_new_tokens,
            env_name="reasoning_gym",
        )

    def _split_entries(self, size: int, test_size: int, seed: int) -> tuple[Any, list[dict[str, Any]], int]:
        test = build_dataset(self.specs, size=test_size, seed=generator_seed(seed, TEST_SEED_OFFSET))
        self._test_questions = {entry["question"] for entry in test}
        if self.split == "test":
            return test, list(test), 0
        train = build_dataset(self.specs, size=size, seed=generator_seed(seed))
        entries = [entry for entry in train if entry["question"] not in self._test_questions]
        if not entries:
            raise ValueError(f"every generated training problem of {self.specs} is also a test problem")
        return train, entries, size - len(entries)

    def _few_shot_examples(self, k: int, seed: int) -> list[dict[str, Any]]:
        # Drawn from their own seed: never a test problem; training problems only when too few others exist.
        if k == 0:
            return []
        training = {entry["question"] for entry in self.entries} if self.split == "train" else set()
        drawn = build_dataset(self.specs, size=8 * k + 16, seed=generator_seed(seed, FEW_SHOT_SEED_OFFSET))
        unique = {e["question"]: e for e in drawn if e["question"] not in self._test_questions}
        examples = sorted(unique.values(), key=lambda e: e["question"] in training)[
            :k
        ]  # stable: unseen first
        if len(examples) < k:
            raise ValueError(
                f"fewer than {k} few-shot examples of {self.specs} differ from the test problems"
            )
        return examples

    # -- prompts ---------------------------------------------------------------------------------------------
    def render_prompt(self, user_text: str) -> str:
        """The chat template with the generation prompt (``apply_chat_template``), else plain text; the few-shot
        examples come first, as earlier turns."""
        tag = self.answer_tag
        shots = [(e["question"], f"<{tag}>{e['answer']}</{tag}>") for e in self.examples]
        if self.use_chat_template:
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            for question, answer in shots:
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            messages.append({"role": "user", "content": user_text})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        turns = [f"{question}\n{answer}" for question, answer in shots] + [user_text]
        text = "\n\n".join(turns)
        return f"{self.system_prompt}\n\n{text}\n" if self.system_prompt else text

    # -- TextEnv ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Next problem of the order; options ``query_id`` (re-serve it) and ``user_content`` (render that text as
        the user turn, graded against the problem's answer), as for the other envs."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        index = self._order.next() if query_id is None else self._lookup(query_id)
        entry = self.entries[index]
        self._current = index
        prompt = self.render_prompt(entry["question"] if user_content is None else user_content)
        info = {"query_id": self.query_ids[index], "query_text": entry["question"], "gold": entry["answer"]}
        return prompt, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._current is None:
            raise RuntimeError("call reset() before step(); an episode is one response")
        index, self._current = self._current, None
        entry = self.entries[index]
        score, reason, detail = self.grade(action, entry)
        reward = score if self.reward_mode == "score" else float(score >= 1.0)
        info = {
            "query_id": self.query_ids[index],
            "correct": score >= 1.0,
            "reward_components": {"score": score},
            "grade_reason": reason,
            "grade_detail": detail,
            "gold": entry["answer"],
            "task": entry.get("metadata", {}).get("source_dataset", self.specs[0][0]),
        }
        return "", reward, True, False, info

    def grade(self, response: str, entry: Mapping[str, Any]) -> tuple[float, str, str]:
        """``(score, reason, detail)`` of `response` for `entry`: its extracted answer scored by the task's
        verifier; a verifier exception scores 0 with reason ``verifier_error``, a verifier that does not return
        within ``reward_timeout_s`` scores 0 with reason ``timeout``."""
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(response, tag_name=self.answer_tag)
        if answer is None:
            return 0.0, "no_answer", f"no <{self.answer_tag}> block"
        try:
            scored = bounded_call(
                self.dataset.score_answer, answer=answer, entry=entry, timeout_s=self.reward_timeout_s
            )
            if not scored.ok:  # a verifier stuck on this answer (a huge expression, a regex blow-up)
                return 0.0, "timeout", f"score_answer did not return within {self.reward_timeout_s:g} s"
            score = float(scored.value)
        except (
            Exception
        ) as e:  # a verifier bug or an answer it cannot parse: this sample scores 0, the run goes on
            return 0.0, "verifier_error", f"{type(e).__name__}: {e}"[:500]
        score = min(max(score, 0.0), 1.0)
        reason = "correct" if score >= 1.0 else "partial" if score > 0.0 else "wrong"
        return score, reason, ""

    def _lookup(self, query_id: str) -> int:
        try:
            return self._index[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not among this environment's {len(self)} problems"
            ) from None


def _system_prompt(system_prompt: str | None) -> str | None:
    # A key of reasoning-gym's SYSTEM_PROMPTS ("default", "simple", ...) names that prompt; other text is used as is.
    if system_prompt is None:
        return None
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS.get(system_prompt, system_prompt)
