"""The `reward_fn` env (a dataset and a reward function) on a hand-written 6-row JSONL, and "module:Class" env paths.

The rows are sums of small numbers; the reward functions are in reward_fns.py beside this file, named by
"reward_fns:<function>" paths as a run file names them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from gymnasium.wrappers.common import PassiveEnvChecker

from r3_rllib.envs import make_text_env, registry
from r3_rllib.envs.data import DataError, runner_shards
from r3_rllib.envs.registry import ObjectPathError, get_text_env_factory, register_text_env
from r3_rllib.envs.reward_fn import RewardFnEnv

HERE = Path(__file__).resolve().parent
ROWS = [
    {"question": "12+7=", "answer": "19"},
    {"question": "3+4=", "answer": "7"},
    {"question": "10+10=", "answer": "20"},
    {"question": "5+6=", "answer": "11"},
    {"question": "8+1=", "answer": "9"},
    {"question": "2+2=", "answer": "4"},
]
ANSWERS = {r["question"]: r["answer"] for r in ROWS}


@pytest.fixture(autouse=True)
def reward_module(monkeypatch):
    """reward_fns.py importable by its module name, its call log empty."""
    monkeypatch.syspath_prepend(str(HERE))
    import reward_fns

    reward_fns.CALLS.clear()
    return reward_fns


@pytest.fixture
def data(tmp_path) -> str:
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def make(data, **config) -> RewardFnEnv:
    base = {
        "data": data,
        "prompt": "{question}",
        "reward": "reward_fns:exact_match",
        "apply_chat_template": "none",
    }
    return make_text_env("reward_fn", **(base | config))


def answer(env: RewardFnEnv, response_for) -> tuple[float, dict]:
    """Reset to the next row, respond with `response_for(query_text)`, return (reward, info)."""
    _, info = env.reset()
    _, reward, terminated, truncated, step_info = env.step(response_for(info["query_text"]))
    assert terminated and not truncated
    return reward, step_info


# -- rows, prompts, split ---------------------------------------------------------------------------------------
def test_exact_match_on_formatted_prompts(data):
    env = make(data, test_size=0)
    assert len(env) == 6 and env.query_ids == [f"sums:{i}" for i in range(6)]  # the file stem and the row
    for _ in range(6):
        prompt, info = env.reset()
        assert prompt == info["query_text"] and prompt in ANSWERS  # the template filled in: "12+7="
        # The eos text is removed before the reward function sees the completion (the tiny tokenizer's "<eos>").
        _, reward, _, _, step = env.step(ANSWERS[prompt] + "<eos>")
        assert reward == 1.0 and step["correct"] and step["grade_reason"] == "correct"
        assert step["reward_components"] == {"reward": 1.0}
        env.reset(options={"query_id": info["query_id"]})
        _, reward, _, _, step = env.step("0")
        assert reward == 0.0 and not step["correct"] and step["grade_reason"] == "wrong"


def test_reward_function_gets_prompt_completion_and_the_row(data, reward_module):
    rows = [{"prompt": "1+1=", "answer": "2", "level": 1, "id": "a"}]
    env = make(rows, prompt="prompt", reward="reward_fns:recording", test_size=0, eos_text="</s>")
    env.reset()
    assert env.step("2</s>")[1] == 1.0  # the length of "2"
    # The prompt column is the positional prompt, not passed again (as TRL does); the other columns are keywords.
    assert reward_module.CALLS == [
        {"prompt": "1+1=", "completion": "2", "answer": "2", "level": 1, "id": "a"}
    ]


def test_prompt_column_template_chat_template_and_system_prompt(data):
    class ChatTokenizer:
        chat_template, eos_token = "<template>", "<|end|>"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"

    env = make(
        data,
        prompt="Q: {question} A:",
        tokenizer=ChatTokenizer(),
        apply_chat_template="auto",
        system_prompt="Add.",
        test_size=0,
    )
    prompt, info = env.reset(options={"query_id": "sums:0"})
    assert prompt == "<|system|>Add.<|user|>Q: 12+7= A:<|assistant|>" and info["query_text"] == "Q: 12+7= A:"
    assert env.step("19<|end|>")[1] == 1.0
    prompt, _ = env.reset(options={"query_id": "sums:0", "user_content": "again: 12+7="})
    assert prompt == "<|system|>Add.<|user|>again: 12+7=<|assistant|>"
    plain = make(data, prompt="question", system_prompt="Add.", test_size=0)
    assert plain.reset(options={"query_id": "sums:1"})[0] == "Add.\n\n3+4="
    # A conversational prompt column (TRL's format): its messages go through the chat template as they are.
    rows = [{"messages": [{"role": "user", "content": "2+2="}], "answer": "4"}]
    chat = make(
        rows, prompt="messages", tokenizer=ChatTokenizer(), apply_chat_template="required", test_size=0
    )
    assert chat.reset()[0] == "<|user|>2+2=<|assistant|>"


def test_prompt_errors_name_the_row_and_column(data):
    with pytest.raises(
        DataError, match=r"sums.jsonl: row 0 \(line 1\): prompt template '\{q\}' names column 'q'"
    ):
        make(data, prompt="{q}")
    with pytest.raises(DataError, match=r"prompt 'problem' is neither a column .*'answer', 'question'"):
        make(data, prompt="problem")
    with pytest.raises(DataError, match="duplicate id 'x'"):
        make([{"id": "x", "q": "a"}, {"id": "x", "q": "b"}], prompt="q")
    with pytest.raises(DataError, match="expected a mapping of columns, got str"):
        make(["1+1="], prompt="q")


def test_train_and_held_out_split_sizes(data):
    def ids(**config):
        return (make(data, **config).query_ids, make(data, split="test", **config).query_ids)

    train, test = ids(test_size=2)
    assert (len(train), len(test)) == (4, 2) and set(train) | set(test) == {f"sums:{i}" for i in range(6)}
    assert not set(train) & set(test)
    assert ids(test_size=2) == (train, test)  # the same draw every time (and in every runner)
    assert ids(test_size=2, seed=5) == (train, test)  # the run's seed does not move the split
    assert ids(test_size=2, split_seed=1) != (train, test)
    assert [len(x) for x in ids(test_size=0.5)] == [3, 3]
    assert [len(x) for x in ids()] == [5, 1]  # default 0.1 of 6 rows, rounded up
    with pytest.raises(DataError, match="test_size=0 holds none"):
        make(data, test_size=0, split="test")
    with pytest.raises(ValueError, match="at least one must stay for training"):
        make(data, test_size=6)
    # Held-out rows of their own: from `heldout`, or the "test" entry of a {"train", "test"} mapping.
    held = [{"question": "1+1=", "answer": "2"}]
    assert make(data, heldout=held, split="test").query_ids == ["heldout:0"]
    assert len(make(data, heldout=held)) == 6
    assert make({"train": data, "test": held}, split="test").query_ids == ["heldout:0"]
    with pytest.raises(ValueError, match="test_size must not be given as well"):
        make(data, heldout=held, test_size=1)
    with pytest.raises(ValueError, match=r"got \['train', 'validation'\]"):
        make({"train": data, "validation": held})


def test_sharding_over_two_runners_is_disjoint_and_epochs_count(data):
    shards = runner_shards(
        4, 2
    )  # 4 queries per iteration over 2 runners; 5 training rows: one left out per epoch
    envs = [make(data, shard=s.as_dict(), seed=3) for s in shards]
    for epoch in range(3):
        served = [[env.reset()[1]["query_id"] for _ in range(2)] for env in envs]
        assert not set(served[0]) & set(served[1]) and len(set(served[0] + served[1])) == 4
        assert [env.epoch for env in envs] == [epoch + 1] * 2
    single = make(data)
    assert single.epoch == 0
    seen = [single.reset()[1]["query_id"] for _ in range(len(single))]
    assert sorted(seen) == sorted(single.query_ids) and single.epoch == 1
    state = single.state()
    upcoming = [single.reset()[1]["query_id"] for _ in range(3)]
    single.set_state(state)
    assert [single.reset()[1]["query_id"] for _ in range(3)] == upcoming


# -- reward values ------------------------------------------------------------------------------------------------
def test_reward_dict_parts_are_summed_or_total_given(data):
    env = make(data, reward="reward_fns:parts", test_size=0)
    reward, info = answer(env, lambda q: ANSWERS[q])
    assert reward == 1.25 and info["reward_components"] == {"correct_part": 1.0, "format": 0.25}
    assert info["correct"]  # 1.25 >= correct_threshold 1.0
    reward, info = answer(env, lambda q: "x")
    assert reward == 0.0 and info["reward_components"] == {"correct_part": 0.0, "format": 0.0}
    assert not info["correct"] and info["grade_reason"] == "wrong"

    env = make(data, reward="reward_fns:with_total", test_size=0)
    reward, info = answer(env, lambda q: ANSWERS[q])
    assert reward == 2.0 and info["correct"] and info["grade_reason"] == "judged"
    assert info["reward_components"] == {"length": float(len(ANSWERS[info_q(env, info)]))}
    reward, info = answer(env, lambda q: "wrong")
    assert reward == -1.0 and not info["correct"] and info["reward_components"] == {"length": 5.0}


def info_q(env: RewardFnEnv, info: dict) -> str:
    return env.prompts[env.query_ids.index(info["query_id"])]


def test_trl_style_reward_function_unchanged(data):
    env = make(data, reward="reward_fns:trl_style", reward_style="trl", test_size=0)
    assert answer(env, lambda q: ANSWERS[q])[0] == 1.0
    assert answer(env, lambda q: "0")[0] == 0.0


def test_a_callable_reward_and_a_threshold(data):
    env = make(data, reward=lambda prompt, completion, **row: 0.5, correct_threshold=0.5, test_size=0)
    reward, info = answer(env, lambda q: "1")
    assert reward == 0.5 and info["correct"]
    with pytest.raises(ValueError, match="env_config 'reward' must be a function"):
        make(data, reward=3)


# -- failures: reward 0, a reason and a count ---------------------------------------------------------------------
def test_reward_that_raises_scores_zero_with_reason_and_count(data, caplog):
    env = make(data, reward="reward_fns:raises", test_size=0)
    with caplog.at_level(logging.WARNING, logger="r3_rllib.envs.reward_fn"):
        for _ in range(12):
            reward, info = answer(env, lambda q: "1")
            assert reward == 0.0 and not info["correct"] and info["grade_reason"] == "reward_error"
    assert "ZeroDivisionError: the reward function divided by zero" in info["grade_detail"]
    assert env.reward_failures == {"reward_error": 12}
    logged = [r.getMessage() for r in caplog.records]
    assert (
        len(logged) == 2 and "(1 such failure" in logged[0] and "(10 such failure" in logged[1]
    )  # 1st, 10th
    assert "reward_fns.raises on query 'sums:" in logged[0]

    bad = make(data, reward="reward_fns:returns_text", test_size=0)
    reward, info = answer(bad, lambda q: "1")
    assert reward == 0.0 and info["grade_reason"] == "reward_error" and "returned str" in info["grade_detail"]

    strict = make(data, reward="reward_fns:raises", on_reward_error="raise", test_size=0)
    with pytest.raises(RuntimeError, match="reward_error: raised ZeroDivisionError") as err:
        answer(strict, lambda q: "1")
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def _failure(env: RewardFnEnv) -> tuple[float, dict]:
    """One sample graded by ``env``'s reward function, which must not raise here: (reward, info)."""
    reward, info = answer(env, lambda q: "1")
    assert reward == 0.0 and not info["correct"] and info["grade_reason"] == "reward_error"
    return reward, info


class _LenRaises:
    """A result that looks like a list of one but whose ``len`` raises: no check foresees every such object."""

    def __len__(self) -> int:
        raise RuntimeError("len of a broken result")

    def __getitem__(self, index: int) -> float:
        return 1.0


@pytest.mark.parametrize(
    ("style", "result", "detail"),
    [
        (
            "sample",
            {"reward": 0.0, "correct": np.array([0, 0])},
            "'correct' must be a bool (or a number 0 or 1)",
        ),
        ("sample", {"reward": 0.0, "correct": "False"}, "got str 'False'"),  # bool("False") is True
        ("sample", {"reward": 0.0, "correct": "no"}, "got str 'no'"),
        ("sample", {"reward": 1.0, "correct": 0.5}, "got float 0.5"),
        ("sample", {"reward": 1.0, "correct": None}, "got NoneType"),
        ("trl", {1.0}, "expected a list of one reward, got {1.0}"),  # a set: a length, no indexing
        ("trl", np.array(0.5), "expected a list of one reward"),  # 0-d: __len__ that raises
        ("trl", _LenRaises(), "returned an unusable _LenRaises: RuntimeError: len of a broken result"),
    ],
)
def test_results_of_any_shape_or_type_are_reward_errors_not_exceptions(data, style, result, detail):
    env = make(data, reward=lambda *a, **k: result, reward_style=style, test_size=0)
    _, info = _failure(env)
    assert detail in info["grade_detail"]
    assert env.reward_failures == {"reward_error": 1}


@pytest.mark.parametrize(
    ("flag", "correct"),
    [(True, True), (False, False), (np.bool_(True), True), (np.bool_(False), False), (1, True), (0.0, False)],
)
def test_correct_flag_takes_bools_and_0_or_1_and_overrides_the_threshold(data, flag, correct):
    env = make(data, reward=lambda *a, **k: {"reward": 0.5, "correct": flag}, test_size=0)
    reward, info = answer(env, lambda q: "1")
    assert reward == 0.5 and info["correct"] is correct
    assert info["grade_reason"] == ("correct" if correct else "wrong")


def _exits(*args, **kwargs) -> float:
    sys.exit(3)


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # called in this thread, and in bounded_call's thread
def test_sys_exit_in_a_reward_is_a_reward_error_not_the_end_of_the_runner(data, timeout_s):
    env = make(data, reward=_exits, reward_timeout_s=timeout_s, test_size=0)
    _, info = _failure(env)
    assert info["grade_detail"] == "raised SystemExit: 3"


def _interrupted(*args, **kwargs) -> float:
    raise KeyboardInterrupt


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_keyboard_interrupt_in_a_reward_still_stops_the_run(data, timeout_s):
    env = make(data, reward=_interrupted, reward_timeout_s=timeout_s, test_size=0)
    with pytest.raises(KeyboardInterrupt):
        answer(env, lambda q: "1")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "1.0", True])
def test_correct_threshold_must_be_a_finite_number(data, bad):
    # NaN or inf would grade every sample wrong, silently
    with pytest.raises(ValueError, match="env_config 'correct_threshold' must be a finite number"):
        make(data, correct_threshold=bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "5", 0, -1.0])
def test_reward_timeout_must_be_a_finite_positive_number_or_none(data, bad):
    # inf reached Thread.join, whose OverflowError made every sample a reward_error
    with pytest.raises(ValueError, match="env_config 'reward_timeout_s' must be > 0 or None"):
        make(data, reward_timeout_s=bad)


def test_reward_that_hangs_scores_zero_with_reason_timeout(data, reward_module):
    env = make(data, reward="reward_fns:sleeps", reward_timeout_s=0.1, test_size=0)
    reward_module.RELEASE.clear()
    start = time.perf_counter()
    try:
        reward, info = answer(env, lambda q: "1")
    finally:
        reward_module.RELEASE.set()  # the abandoned call returns now
    # Did not wait for the call, which hangs 30 s unless released: 10 s is 100x the 0.1 s limit (a loaded machine
    # may stall the test for a while) and a third of what an ignored limit would take.
    assert time.perf_counter() - start < 10.0
    assert reward == 0.0 and info["grade_reason"] == "timeout" and "within 0.1 s" in info["grade_detail"]
    assert env.reward_failures == {"timeout": 1}
    with pytest.raises(ValueError, match="reward_timeout_s' must be > 0 or None"):
        make(data, reward_timeout_s=0)


def test_passes_the_passive_env_checker(data):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = PassiveEnvChecker(make(data))
        obs, info = env.reset(seed=0)
        assert isinstance(obs, str) and "query_id" in info
        _, reward, *_ = env.step("19")
        assert isinstance(reward, float)


# -- "module:Class" env paths -------------------------------------------------------------------------------------
def test_module_class_path_names_an_env(monkeypatch, reward_module):
    monkeypatch.setattr(registry, "_REGISTRY", registry.new_text_env_registry())
    env = make_text_env("reward_fns:SmallArithmetic", seed=1)
    assert isinstance(env, reward_module.SmallArithmetic) and len(env) == 3
    assert get_text_env_factory("reward_fns:SmallArithmetic") is reward_module.SmallArithmetic


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "no_such_module_xyz:Env",
            r"text env 'no_such_module_xyz:Env': cannot import module 'no_such_module_xyz'",
        ),
        (
            "reward_fns:SmallArithmetik",
            r"module 'reward_fns' has no attribute 'SmallArithmetik'; did you mean "
            r"'SmallArithmetic'\?",
        ),
        ("reward_fns:NotATextEnv", r"NotATextEnv is a class but not a TextEnv"),
        ("reward_fns:NOT_AN_ENV", r"is a int, not a TextEnv class or factory"),
        ("reward_fns:", r"expected 'module:attribute'"),
    ],
)
def test_module_class_path_errors_name_the_module_or_attribute(path, message):
    with pytest.raises(ObjectPathError, match=message):
        make_text_env(path)


def test_module_import_error_inside_the_module_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_tasks.py").write_text("import not_installed_pkg_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ObjectPathError,
        match=r"importing module 'broken_tasks' failed: ModuleNotFoundError: .*"
        r"not_installed_pkg_xyz",
    ):
        make_text_env("broken_tasks:Env")


def test_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    """`r3` run as a console script has no current directory on sys.path; Ray's workers do: look there too."""
    (tmp_path / "cwd_rewards_xyz.py").write_text("def one(prompt, completion, **row):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    env = make([{"q": "a"}], prompt="q", reward="cwd_rewards_xyz:one", test_size=0)
    assert answer(env, lambda q: "x")[0] == 1.0


def test_names_with_a_colon_are_paths_not_registrations():
    with pytest.raises(ValueError, match="holds ':'"):
        register_text_env("a:b", RewardFnEnv)


def test_config_and_run_file_take_a_module_class_env(tmp_path):
    from r3_rllib import R3Config
    from r3_rllib.train_config import ConfigError, load_run_file

    config = R3Config().environment("reward_fns:SmallArithmetic")
    assert config.env == "reward_fns:SmallArithmetic"
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        R3Config().environment("no_such_module_xyz:Env")
    run = tmp_path / "run.yaml"
    run.write_text("environment: {env: 'reward_fns:SmallArithmetik'}\n")
    with pytest.raises(ConfigError, match="section 'environment': .*did you mean 'SmallArithmetic'"):
        load_run_file(run)
    run.write_text("environment: {env: 'reward_fns:SmallArithmetic'}\ntraining: {max_new_tokens: 4}\n")
    assert load_run_file(run).config.env == "reward_fns:SmallArithmetic"


def test_unknown_and_bad_options_name_the_key(data):
    with pytest.raises(TypeError, match="'promt'"):
        make(data, promt="{question}")
    with pytest.raises(ValueError, match="env_config 'reward_style' must be one of"):
        make(data, reward_style="batched")
    with pytest.raises(ValueError, match="test_size must be a number of rows or a fraction"):
        make(data, test_size="10%")
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        make(data, split="validation")
