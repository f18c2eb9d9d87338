"""ArithmeticEnv and MathEnv: the reset/step contract, query ids, reset options, epochs, state, length bonus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3_rllib.envs import DataError, MathEnv, MathProblem, TextEnv
from r3_rllib.envs.arithmetic import (
    ArithmeticEnv,
    ArithmeticProblem,
    count_arithmetic_problems,
    generate_arithmetic_problems,
)
from r3_rllib.envs.data import QueryOrder

# ================================================================================================================
# generate_arithmetic_problems
# ================================================================================================================


def test_generator_is_deterministic_distinct_and_correct():
    problems = generate_arithmetic_problems(300, digits=2, num_operands=3, operators="+-*", seed=7)
    assert problems == generate_arithmetic_problems(300, digits=2, num_operands=3, operators="+-*", seed=7)
    assert problems != generate_arithmetic_problems(300, digits=2, num_operands=3, operators="+-*", seed=8)
    assert len({p.expression for p in problems}) == 300
    for p in problems:
        assert p.answer == str(eval(p.expression))  # noqa: S307 - an independent oracle over digits and + - *
        operands = p.expression.replace("-", "+").replace("*", "+").split("+")
        assert len(operands) == 3 and all(10 <= int(x) <= 99 for x in operands)
    assert {op for p in problems for op in p.expression if not op.isdigit()} == {"+", "-", "*"}


def test_generator_examples():
    assert ArithmeticProblem("12+34", "46").query_id == "arith:12+34"
    assert ArithmeticProblem("12+34", "46").prompt == "12+34="
    # 1-digit operands include 0; every one of the 10 * 10 sums appears exactly once.
    every = generate_arithmetic_problems(100, digits=1, seed=0)
    assert sorted(p.expression for p in every) == sorted(f"{a}+{b}" for a in range(10) for b in range(10))
    ranged = generate_arithmetic_problems(200, digits=(1, 3), seed=0)
    values = [int(x) for p in ranged for x in p.expression.split("+")]
    assert 0 <= min(values) and max(values) <= 999 and any(v >= 100 for v in values)


def test_problem_counts_and_too_many():
    assert count_arithmetic_problems(digits=1) == 100
    assert count_arithmetic_problems(digits=2, operators="+-") == 90 * 90 * 2
    assert count_arithmetic_problems(digits=(1, 2), num_operands=3, operators="+-*") == 100**3 * 3**2
    with pytest.raises(ValueError, match=r"asked for 101 distinct problems .* allow only 100"):
        generate_arithmetic_problems(101, digits=1)
    with pytest.raises(ValueError, match=r"allow only 100 \(10 excluded\)"):
        generate_arithmetic_problems(91, digits=1, exclude={f"0+{b}" for b in range(10)})


def test_exclude():
    excluded = {f"{a}+{b}" for a in range(10) for b in range(5)}
    rest = generate_arithmetic_problems(50, digits=1, exclude=excluded)
    assert {p.expression for p in rest} == {f"{a}+{b}" for a in range(10) for b in range(5, 10)}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(operators="/"), "division is not supported"),
        (dict(operators="+/"), "division is not supported"),
        (dict(operators="^"), "operators must be"),
        (dict(operators=""), "operators must be"),
        (dict(digits=0), "digits must be"),
        (dict(digits=(3, 2)), "digits must be"),
        (dict(num_operands=1), "num_operands must be >= 2"),
    ],
)
def test_generator_rejects_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_arithmetic_problems(1, **kwargs)


def test_precedence():
    # ``*`` binds tighter than ``-``: every 1-digit 3-operand expression over "-*" (10^3 * 2^2 = 4000 of them).
    problems = {
        p.expression: p.answer
        for p in generate_arithmetic_problems(4000, digits=1, num_operands=3, operators="-*")
    }
    assert problems["2-3*4"] == "-10" and problems["2*3-4"] == "2" and problems["9-8-7"] == "-6"
    assert all(answer == str(eval(expr)) for expr, answer in problems.items())  # noqa: S307


# ================================================================================================================
# ArithmeticEnv
# ================================================================================================================


def test_arithmetic_reset_step_contract():
    env = ArithmeticEnv(num_queries=10, seed=0)
    assert isinstance(env, TextEnv) and len(env) == 10
    prompt, info = env.reset()
    problem = env.problem(info["query_id"])
    assert prompt == problem.expression + "=" == info["query_text"]
    assert info["query_id"] == f"arith:{problem.expression}" and info["gold"] == problem.answer
    assert env.observation_space.contains(prompt)
    obs, reward, terminated, truncated, step_info = env.step(problem.answer + "<eos>")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert step_info["correct"] is True and step_info["gold"] == problem.answer
    assert step_info["reward_components"] == {"correctness": 1.0, "length_bonus": 0.0}
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(problem.answer)  # the episode is over


@pytest.mark.parametrize(
    "response, correct",
    [
        ("46", True),
        (" 46\n", True),
        ("46<eos>", True),
        ("046", True),  # the same integer
        ("+46", True),
        ("47", False),
        ("4 6", False),
        ("46.0", False),
        ("forty-six", False),
        ("", False),
        ("4" * 5000, False),
    ],
)
def test_arithmetic_reward(response, correct):
    env = ArithmeticEnv(num_queries=1, digits=2)
    env.problems[0] = ArithmeticProblem("12+34", "46")  # pin the query
    env.reset()
    _, reward, _, _, info = env.step(response)
    assert info["correct"] is correct and reward == (1.0 if correct else 0.0)


def test_arithmetic_eos_text_from_the_tokenizer():
    class Tok:
        eos_token = "</end>"

    env = ArithmeticEnv(num_queries=1, tokenizer=Tok())
    _, info = env.reset()
    assert env.step(info["gold"] + "</end>")[1] == 1.0
    env.reset()
    assert env.step(info["gold"] + "<eos>")[1] == 0.0  # only the tokenizer's eos is removed now


def test_arithmetic_length_bonus_numbers():
    env = ArithmeticEnv(num_queries=1, length_bonus_max_tokens=10)
    env.problems[0] = ArithmeticProblem("12+34", "46")
    for response, expected in [
        ("46", 1.8),
        ("46<eos>", 1.8),
        (" 46", 1.7),
        ("46" + " " * 8, 1.0),
        ("47", 0.0),
    ]:
        env.reset()
        _, reward, _, _, info = env.step(response)
        assert reward == pytest.approx(expected), response
        assert info["reward_components"]["length_bonus"] == pytest.approx(max(0.0, expected - 1.0))
    env.reset()
    assert env.step(" " * 20 + "46")[1] == 1.0  # max(0, 1 - 22/10) = 0


def test_arithmetic_epochs_reshuffle_and_state_round_trip():
    env = ArithmeticEnv(num_queries=20, seed=3)
    first = [env.reset()[1]["query_id"] for _ in range(20)]
    assert sorted(first) == sorted(env.query_ids) and env.epoch == 1
    second = [env.reset()[1]["query_id"] for _ in range(20)]
    assert sorted(second) == sorted(first) and second != first  # reshuffled with seed + epoch
    assert env.epoch == 2

    env2 = ArithmeticEnv(num_queries=20, seed=3)
    for _ in range(27):
        env2.reset()
    state = env2.state()
    assert (state["epoch"], state["cursor"]) == (1, 7)
    restored = ArithmeticEnv(num_queries=20, seed=3)
    restored.set_state(json.loads(json.dumps(state)))  # checkpoints are JSON-able
    assert restored.epoch == 1
    assert [restored.reset()[0] for _ in range(30)] == [env2.reset()[0] for _ in range(30)]
    with pytest.raises(ValueError, match="pool of 20 queries, this environment has 5"):
        ArithmeticEnv(num_queries=5).set_state(state)


def test_arithmetic_default_pools_are_pinned():
    # The draw order defines the pools, and with them the held-out split the shipped warm-start checkpoint was
    # measured on: a change here must be deliberate (and retrain that checkpoint).
    assert [p.expression for p in ArithmeticEnv().problems[:3]] == ["27+82", "42+25", "67+70"]
    assert [p.expression for p in ArithmeticEnv(split="test").problems[:3]] == ["17+21", "56+31", "42+87"]


def test_arithmetic_without_shuffle_serves_generation_order():
    env = ArithmeticEnv(num_queries=5, shuffle=False)
    assert [env.reset()[0] for _ in range(10)] == [p.prompt for p in env.problems] * 2


def test_arithmetic_query_ids_are_stable_and_the_pool_ignores_seed():
    a = ArithmeticEnv(num_queries=50, seed=0)
    b = ArithmeticEnv(num_queries=50, seed=1000)  # another rollout worker: same pool, other order
    assert sorted(a.query_ids) == sorted(b.query_ids)
    assert [a.reset()[0] for _ in range(5)] != [b.reset()[0] for _ in range(5)]
    c = ArithmeticEnv(num_queries=50, pool_seed=2)
    assert set(c.query_ids) != set(a.query_ids)


def test_arithmetic_reset_seed_restarts_the_iteration():
    env = ArithmeticEnv(num_queries=10, seed=0)
    for _ in range(13):
        env.reset()
    fresh = ArithmeticEnv(num_queries=10, seed=5)
    assert env.reset(seed=5)[0] == fresh.reset()[0]
    assert env.epoch == 0 and env.state()["cursor"] == 1


def test_arithmetic_reset_options():
    env = ArithmeticEnv(num_queries=10, seed=0)
    env.reset()
    cursor = env.state()["cursor"]
    target = env.problems[4]
    prompt, info = env.reset(options={"query_id": target.query_id})
    assert prompt == target.prompt and info["query_id"] == target.query_id
    assert env.state()["cursor"] == cursor  # re-serving does not move the cursor
    reflection = "12+34=? You said 45 last time. Try again: " + target.prompt
    prompt, info = env.reset(options={"query_id": target.query_id, "user_content": reflection})
    assert prompt == reflection and info["query_text"] == target.prompt and info["gold"] == target.answer
    assert env.step(target.answer)[1] == 1.0  # graded against the query's own gold
    with pytest.raises(
        ValueError, match=r"unknown query_id 'arith:1\+1': not in this environment's train pool"
    ):
        env.reset(options={"query_id": "arith:1+1"})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"qid": target.query_id})
    with pytest.raises(ValueError, match="'user_content' needs 'query_id'"):
        env.reset(options={"user_content": "hi"})


def test_arithmetic_test_split_is_disjoint_and_deterministic():
    train = ArithmeticEnv(num_queries=200, split="train")
    test = ArithmeticEnv(num_queries=200, split="test", seed=9)
    assert len(test) == 200 and not set(train.query_ids) & set(test.query_ids)
    assert test.query_ids == ArithmeticEnv(num_queries=200, split="test").query_ids
    # 1-digit sums: 100 problems, so two disjoint pools of 50 fit and 51 do not.
    assert len(ArithmeticEnv(digits=1, num_queries=50, split="test")) == 50
    with pytest.raises(ValueError, match="needs 102 distinct problems; this configuration has 100"):
        ArithmeticEnv(digits=1, num_queries=51, split="test")
    with pytest.raises(ValueError, match="split must be"):
        ArithmeticEnv(split="val")  # type: ignore[arg-type]


def test_arithmetic_step_before_reset():
    with pytest.raises(RuntimeError, match="call reset"):
        ArithmeticEnv(num_queries=2).step("1")


def test_query_order():
    order = QueryOrder(4, seed=1, shuffle=True)
    seen = [order.next() for _ in range(8)]
    assert sorted(seen[:4]) == sorted(seen[4:]) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="invalid state"):
        order.set_state({"cursor": 4, "epoch": 0, "size": 4})
    with pytest.raises(ValueError, match="at least one query"):
        QueryOrder(0)


# ================================================================================================================
# MathEnv
# ================================================================================================================
ROWS = [
    {"id": "half", "problem": "What is one half as a decimal?", "answer": "0.5"},
    {"id": "two", "problem": "What is 1+1?", "answer": 2, "answers": ["two"]},
    {"id": "sq", "problem": "Expand $(x+1)^2$.", "answer": "x^2+2x+1"},
]
SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."


class ChatCharTokenizer:
    """A stand-in tokenizer: one token per character and a chat template ending in an open think block."""

    chat_template = "<chat template>"
    eos_token = "<eos>"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return text + ("<|assistant|><think>\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):
            return {"input_ids": [list(range(len(t))) for t in text]}
        return {"input_ids": list(range(len(text)))}


@pytest.fixture
def math_file(tmp_path) -> Path:
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_math_default_prompt_is_deepscaler_plain_text(math_file):
    env = MathEnv(data=math_file, shuffle=False)
    assert isinstance(env, TextEnv) and len(env) == 3
    prompt, info = env.reset()
    assert prompt == "What is one half as a decimal?" + SUFFIX == info["query_text"]
    assert prompt.endswith("within \\boxed{}.")  # the text holds one backslash: \boxed{}.
    assert info["query_id"] == "half" and info["gold"] == ("0.5",)


def test_math_step_grades_the_last_box(math_file):
    env = MathEnv(data=math_file, shuffle=False)
    env.reset()
    obs, reward, terminated, truncated, info = env.step("1/2 is \\boxed{\\frac{1}{2}}")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["correct"] and info["grade_reason"] == "correct" and info["query_id"] == "half"
    assert info["reward_components"] == {"correctness": 1.0, "length_bonus": 0.0}
    env.reset()
    assert env.step("\\boxed{two}")[1] == 1.0  # a form from the answers column
    env.reset()
    _, reward, _, _, info = env.step("<think>\\boxed{x^2+2x+1}</think> so \\boxed{x^2+1}")
    assert reward == 0.0 and info["grade_reason"] == "wrong"
    env.reset()
    assert env.step("no box")[4]["grade_reason"] == "no_boxed"


def test_math_chat_template_system_prompt_and_think_detection(math_file):
    tok = ChatCharTokenizer()
    env = MathEnv(data=math_file, tokenizer=tok, shuffle=False, system_prompt="Be brief.")
    prompt, info = env.reset()
    assert (
        prompt
        == "<|system|>Be brief.\n<|user|>What is one half as a decimal?" + SUFFIX + "\n<|assistant|><think>\n"
    )
    assert info["query_text"] == "What is one half as a decimal?" + SUFFIX
    # The prompt opened <think>: a response that never closes it is wrong even with a correct box.
    assert env.step("\\boxed{0.5}")[4]["grade_reason"] == "unclosed_think"
    env.reset(options={"query_id": "half"})
    assert env.step("hmm</think>\\boxed{0.5}")[1] == 1.0
    plain = MathEnv(
        data=math_file, tokenizer=tok, shuffle=False, apply_chat_template=False, system_prompt="S"
    )
    assert plain.reset()[0] == "S\n\nWhat is one half as a decimal?" + SUFFIX
    assert plain.step("\\boxed{0.5}")[1] == 1.0  # no think block opened by the prompt


def test_math_length_bonus_in_tokens(math_file):
    env = MathEnv(
        data=math_file, tokenizer=ChatCharTokenizer(), length_bonus_max_tokens=100, think_in_prompt=False
    )
    env.reset(options={"query_id": "two"})
    response = "\\boxed{2}"  # 9 characters = 9 tokens of the character tokenizer
    _, reward, _, _, info = env.step(response)
    assert reward == pytest.approx(1.91) and info["reward_components"]["length_bonus"] == pytest.approx(0.91)
    env.reset(options={"query_id": "two"})
    assert env.step("\\boxed{3}")[1] == 0.0
    with pytest.raises(ValueError, match="pass a tokenizer"):
        MathEnv(data=math_file, length_bonus_max_tokens=10)


def test_math_max_prompt_tokens(math_file):
    tok = ChatCharTokenizer()
    lengths = {
        r["id"]: len(
            tok.apply_chat_template(
                [{"role": "user", "content": r["problem"] + SUFFIX}], add_generation_prompt=True
            )
        )
        for r in ROWS
    }
    longest = max(lengths.values())
    assert list(lengths.values()).count(longest) == 1
    qid = max(lengths, key=lengths.get)
    assert len(MathEnv(data=math_file, tokenizer=tok, max_prompt_tokens=longest)) == 3
    with pytest.raises(
        DataError, match=rf"query '{qid}': prompt has {longest} tokens > max_prompt_tokens={longest - 1}"
    ):
        MathEnv(data=math_file, tokenizer=tok, max_prompt_tokens=longest - 1)
    env = MathEnv(data=math_file, tokenizer=tok, max_prompt_tokens=longest - 1, on_bad_row="skip")
    assert len(env) == 2 and env.data_report == {"loaded": 2, "skipped_bad_rows": 0, "skipped_too_long": 1}


def test_math_bad_rows_skip_and_report(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"problem": "no answer"}) + "\n")
    with pytest.raises(DataError, match=r"mixed\.jsonl: row 1 \(line 2\): field 'answer': missing"):
        MathEnv(data=path)
    env = MathEnv(data=path, on_bad_row="skip")
    assert len(env) == 1 and env.data_report["skipped_bad_rows"] == 1
    assert env.load_reports[0].skipped == 1


def test_math_epochs_state_and_reset_options(math_file):
    env = MathEnv(data=math_file, seed=4)
    first = [env.reset()[1]["query_id"] for _ in range(3)]
    assert sorted(first) == ["half", "sq", "two"] and env.epoch == 1
    env.reset()
    state = env.state()
    restored = MathEnv(data=math_file, seed=4)
    restored.set_state(state)
    assert [restored.reset()[0] for _ in range(7)] == [env.reset()[0] for _ in range(7)]
    cursor = env.state()["cursor"]
    prompt, info = env.reset(options={"query_id": "sq", "user_content": "Try again: expand $(x+1)^2$."})
    assert prompt == "Try again: expand $(x+1)^2$." and info["gold"] == ("x^2+2x+1",)
    assert env.state()["cursor"] == cursor
    assert env.step("\\boxed{(x+1)^2}")[1] == 1.0  # graded by math-verify against the query's gold
    with pytest.raises(ValueError, match="unknown query_id 'nope'"):
        env.reset(options={"query_id": "nope"})


def test_math_ids_sources_and_splits(tmp_path, math_file):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "half", "problem": "Another half?", "answer": "1/2"}) + "\n")
    env = MathEnv(data=[math_file, other], shuffle=False)
    # Only the colliding id is qualified with its source stem.
    assert env.query_ids == ["toy/half", "two", "sq", "other/half"]
    no_ids = tmp_path / "noids.jsonl"
    no_ids.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    assert MathEnv(data=no_ids).query_ids == ["noids:0"]
    # A single local file has no test split; a mapping picks one.
    with pytest.raises(DataError, match="split 'test' requested but .* local file without splits"):
        MathEnv(data=math_file, split="test")
    split_env = MathEnv(data={"train": math_file, "test": other}, split="test")
    assert split_env.query_ids == ["half"] and split_env.problems[0].problem == "Another half?"
    with pytest.raises(DataError, match=r"data has no split 'val'; splits: \['test', 'train'\]"):
        MathEnv(data={"train": math_file, "test": other}, split="val")


def test_math_from_problem_objects():
    problems = [MathProblem("p1", "1+1?", ("2",)), MathProblem("p2", "2+2?", ("4",))]
    env = MathEnv(data=problems, shuffle=False)
    assert env.reset()[1]["query_id"] == "p1"
    with pytest.raises(DataError, match="duplicate problem id 'p1'"):
        MathEnv(data=problems + problems[:1])
    with pytest.raises(ValueError, match="must contain '\\{problem\\}'"):
        MathEnv(data=problems, prompt_template="no placeholder")


def test_math_template_is_not_str_format():
    env = MathEnv(
        data=[MathProblem("p", "Find {x} in $\\{1,2\\}$", ("1",))],
        prompt_template="Q: {problem} A: \\boxed{}",
    )
    assert env.reset()[0] == "Q: Find {x} in $\\{1,2\\}$ A: \\boxed{}"


def test_math_tokenizer_folder_uses_the_character_loader(tiny_random_model, tmp_path):
    # A Qwen2 config.json next to a character tokenizer: AutoTokenizer would drop spaces; the env's loader must not.
    path = tmp_path / "sp.jsonl"
    path.write_text(json.dumps({"problem": "a b", "answer": "1"}) + "\n")
    env = MathEnv(data=path, tokenizer=tiny_random_model, max_prompt_tokens=500, length_bonus_max_tokens=100)
    prompt, _ = env.reset()
    assert prompt == "a b" + SUFFIX  # the character tokenizer has no chat template
    assert env.count_tokens(prompt) == len(prompt)


class _PlainEnv(TextEnv):
    """A TextEnv with no data order of its own (like examples/custom_text_env.py): the default epoch applies."""

    queries = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def reset(self, *, seed=None, options=None):
        qid = (options or {}).get("query_id") or self.queries[self._next % len(self.queries)]
        if not (options or {}).get("query_id"):
            self._next += 1
        return qid, {"query_id": qid, "query_text": qid}

    def step(self, action):
        return "", 0.0, True, False, {"correct": False, "reward_components": {}}

    def __len__(self) -> int:
        return len(self.queries)


class _PlainEnvChild(_PlainEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("cls", [_PlainEnv, _PlainEnvChild])
def test_default_epoch_counts_passes_over_the_queries(cls):
    """An env without an epoch of its own still reports completed passes (fresh resets / len), so R^3's
    start epochs switch on; group resets (query_id) and a subclass's super().reset() are not counted."""
    env = cls()
    assert env.epoch == 0
    for i in range(7):
        env.reset()
        env.reset(options={"query_id": "a"})  # a group's other samples
        assert env.epoch == (i + 1) // 3


def test_default_epoch_is_zero_without_a_length():
    class Endless(_PlainEnv):
        def __len__(self) -> int:
            raise TypeError("no finite length")

    env = Endless()
    env.reset()
    assert env.epoch == 0


def test_an_env_that_assigns_its_own_epoch_keeps_it():
    """Envs written before `epoch` was part of TextEnv assign their own count (`self.epoch = ...`): the assignment
    works and wins over the default count of fresh resets."""
    from r3_rllib.envs.base import TextEnv

    class Counting(TextEnv):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def __len__(self):
            return 1

        def reset(self, *, seed=None, options=None):
            self.epoch = 7
            return "q", {"query_id": "q"}

        def step(self, action):
            return "", 0.0, True, False, {"correct": False}

    env = Counting()
    assert env.epoch == 0
    env.reset()
    env.reset()
    assert env.epoch == 7
