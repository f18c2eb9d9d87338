"""The grader and MathEnv on the real shared data (../shared/data, skipped when absent).

For every file in ``math/``: each row's own gold written as a model would write it must be judged correct, and a
different row's different answer must be judged wrong (>= 99 % each; the exceptions are printed). Every row goes
through the full grader (fast path included) in the correct direction; a per-file sample goes through math-verify
alone in both directions (``R3_SHARED_MATH_SAMPLE=0``: every row, a few minutes).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from r3_rllib.envs import MathEnv, MathProblem, load_math_problems_with_report
from r3_rllib.rewards import MathGrader
from r3_rllib.rewards.math_grader import normalize_answer

SAMPLE_PER_FILE = int(os.environ.get("R3_SHARED_MATH_SAMPLE", "150"))
MIN_RATE = 0.99


def as_model_output(answer: str) -> str:
    return f"<think>\nreasoning\n</think>\nThe answer is \\boxed{{{answer}}}."


@pytest.fixture(scope="module")
def math_files(shared_data) -> dict[str, list[MathProblem]]:
    files = sorted((shared_data / "math").glob("*.jsonl"))
    if not files:
        pytest.skip(f"no math/*.jsonl in {shared_data}")
    out = {}
    for path in files:
        problems, report = load_math_problems_with_report(path, on_bad_row="skip")
        print(
            f"{path.name}: {report.loaded} problems, {report.skipped} bad rows skipped {list(report.skip_reasons)}"
        )
        out[path.name] = problems
    return out


def partners(problems: list[MathProblem]) -> list[tuple[MathProblem, str]]:
    """Each problem with the first answer of the next problem whose answer differs after normalisation."""
    out = []
    for i, p in enumerate(problems):
        own = {normalize_answer(a) for a in p.answers}
        for k in range(1, len(problems)):
            other = problems[(i + k) % len(problems)].answer
            if normalize_answer(other) not in own:
                out.append((p, other))
                break
    return out


def check(label: str, problems, responses, grader: MathGrader, *, expect_correct: bool) -> None:
    results = grader.grade_many([(r, p.answers) for p, r in zip(problems, responses, strict=True)])
    good = sum(r.correct == expect_correct for r in results)
    exceptions = [
        f"{p.id}: gold {p.answers!r} response {r[len('<think>') :][-80:]!r} -> {res.reason}"
        for p, r, res in zip(problems, responses, results, strict=True)
        if res.correct != expect_correct
    ]
    print(f"{label}: {good}/{len(results)} judged {'correct' if expect_correct else 'wrong'}")
    for line in exceptions:
        print("   ", line)
    assert good >= MIN_RATE * len(results), f"{label}: {good}/{len(results)}; exceptions: {exceptions[:20]}"


def test_every_row_own_gold_is_correct(math_files):
    grader = MathGrader(timeout_s=10.0)
    try:
        for name, problems in math_files.items():
            check(
                f"{name} own gold (full grader)",
                problems,
                [as_model_output(p.answer) for p in problems],
                grader,
                expect_correct=True,
            )
        print("grader stats:", grader.stats())
    finally:
        grader.close()


@pytest.mark.slow
def test_math_verify_alone_on_a_sample(math_files):
    grader = MathGrader(timeout_s=10.0, fast_path=False)
    try:
        for name, problems in math_files.items():
            sample = problems
            if SAMPLE_PER_FILE and len(problems) > SAMPLE_PER_FILE:
                sample = random.Random(name).sample(problems, SAMPLE_PER_FILE)
            check(
                f"{name} own gold (math-verify)",
                sample,
                [as_model_output(p.answer) for p in sample],
                grader,
                expect_correct=True,
            )
            pairs = partners(sample)
            check(
                f"{name} other row's answer (math-verify)",
                [p for p, _ in pairs],
                [as_model_output(a) for _, a in pairs],
                grader,
                expect_correct=False,
            )
        print("grader stats:", grader.stats())
    finally:
        grader.close()


def test_r1_distill_tokenizer_renders_the_math_prompt(shared_data):
    path = shared_data / "tokenizers" / "r1_distill_qwen_1.5b"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    problems = [MathProblem("q1", "What is $\\frac{1}{2} + \\frac{1}{4}$?", ("\\frac{3}{4}",))]
    env = MathEnv(data=problems, tokenizer=str(path), max_prompt_tokens=200, length_bonus_max_tokens=1000)
    prompt, info = env.reset()
    user = "What is $\\frac{1}{2} + \\frac{1}{4}$? Let's think step by step and output the final answer within \\boxed{}."
    assert info["query_text"] == user
    assert prompt == "<｜begin▁of▁sentence｜><｜User｜>" + user + "<｜Assistant｜><think>\n"
    ids = env.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151646 and ids[-2] == 151648  # BOS and <think> are single special tokens
    # The template opened <think>: the response must close it before its answer counts.
    _, reward, _, _, step_info = env.step("1/2 + 1/4 = 3/4 so \\boxed{0.75}")
    assert reward == 0.0 and step_info["grade_reason"] == "unclosed_think"
    env.reset(options={"query_id": "q1"})
    response = "1/2 + 1/4 = 3/4</think>\n\nThe answer is $\\boxed{0.75}$."
    _, reward, _, _, step_info = env.step(response)
    n_tokens = len(env.tokenizer(response, add_special_tokens=False)["input_ids"])
    assert step_info["correct"] and reward == pytest.approx(2.0 - n_tokens / 1000)


def test_math_env_loads_every_shared_file(shared_data):
    files = sorted((shared_data / "math").glob("*.jsonl"))
    if not files:
        pytest.skip(f"no math/*.jsonl in {shared_data}")
    env = MathEnv(data=[Path(f) for f in files], on_bad_row="skip")
    # train_math.jsonl has 2 rows with empty answers; every other row loads, with unique ids.
    assert env.data_report["skipped_bad_rows"] == 2
    assert len(set(env.query_ids)) == len(env) == env.data_report["loaded"]
