"""MathEnv refuses prompts that cannot fit the model's context, and says when a tokenizer has no chat template."""

from __future__ import annotations

import json
import logging

import pytest
from char_tokenizer import CharTokenizer

from r3_rllib.envs.data import DataError
from r3_rllib.envs.math_env import MathEnv, use_chat_template

ROWS = [
    {"id": "short", "problem": "1+1?", "answer": "2"},
    {"id": "long", "problem": "x" * 200, "answer": "3"},
]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _env(data, **kw):
    return MathEnv(data=data, tokenizer=CharTokenizer(), apply_chat_template="none", shuffle=False, **kw)


def test_a_prompt_past_the_models_context_is_refused_naming_query_length_and_limit(data):
    long_prompt = len(_env(data).reset(options={"query_id": "long"})[0])
    with pytest.raises(DataError) as error:
        _env(data, model_max_positions=long_prompt + 15, max_new_tokens=16)
    assert str(error.value).startswith(
        f"query 'long': prompt has {long_prompt} tokens + max_new_tokens=16 > the model's "
        f"max_position_embeddings={long_prompt + 15}"
    )
    assert len(_env(data, model_max_positions=long_prompt + 16, max_new_tokens=16)) == 2


def test_too_long_prompts_are_skipped_with_a_warning_when_asked(data, caplog):
    with caplog.at_level(logging.WARNING):
        env = _env(data, model_max_positions=120, max_new_tokens=16, on_bad_row="skip")
    assert env.query_ids == ["short"] and env.data_report["skipped_too_long"] == 1
    assert "query 'long': prompt has" in caplog.text


def test_a_response_budget_that_fills_the_context_is_refused(data):
    with pytest.raises(ValueError, match="max_new_tokens=64 leaves no room for a prompt"):
        _env(data, model_max_positions=64, max_new_tokens=64)


def test_no_chat_template_warns_once_naming_the_tokenizer(data, caplog):
    import r3_rllib.envs.chat as chat

    chat._WARNED_NO_TEMPLATE.discard("/models/char-tok")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            env = MathEnv(data=data, tokenizer=CharTokenizer())
    assert not env.use_chat_template
    assert caplog.text.count("tokenizer '/models/char-tok' has no chat template: prompts are plain text") == 1


def test_required_chat_template_refuses_a_tokenizer_without_one(data):
    with pytest.raises(ValueError, match="tokenizer '/models/char-tok' has no chat template"):
        MathEnv(data=data, tokenizer=CharTokenizer(), apply_chat_template="required")


@pytest.mark.parametrize(
    ("mode", "expected"), [(True, True), ("auto", True), (False, False), ("none", False)]
)
def test_chat_template_modes_and_their_bool_spellings(mode, expected):
    tok = CharTokenizer()
    tok.chat_template = "{{ messages }}"
    assert use_chat_template(tok, mode) is expected
    with pytest.raises(ValueError, match="apply_chat_template must be one of"):
        use_chat_template(tok, "always")


def test_the_runner_hands_math_envs_the_models_context(tiny_random_model):
    from r3_rllib.algorithms.r3.config import R3Config
    from r3_rllib.algorithms.r3.runner_setup import model_context_config, runner_env_config

    config = (
        R3Config().environment("math", env_config={"data": "x.jsonl"}).training(model_path=tiny_random_model)
    )
    context = model_context_config(config)
    assert context["max_new_tokens"] == 16 and context["model_max_positions"] >= 64
    assert runner_env_config(config, 1)["model_max_positions"] == context["model_max_positions"]
    # Every shipped env checks its prompts (envs/context.py); a factory that names no such parameter gets none.
    arithmetic = R3Config().training(model_path=tiny_random_model)
    assert model_context_config(arithmetic) == context

    def plain_env(*, seed: int = 0):
        raise AssertionError("not built here")

    assert (
        model_context_config(R3Config().environment(plain_env).training(model_path=tiny_random_model)) == {}
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, "5", None])
def test_a_grading_timeout_that_is_not_a_finite_number_is_refused_when_built(data, bad):
    # NaN passed the old `<= 0` check and raised inside selectors at the first step; "5" raised a bare TypeError
    with pytest.raises(ValueError, match="^grading_timeout_s must be a finite number > 0 and <= 86400"):
        _env(data, grading_timeout_s=bad)


@pytest.mark.parametrize("data", [None, 5])
def test_no_data_is_named_not_a_bare_iteration_error(data):
    """`math` without env_config 'data' failed with "'NoneType' object is not iterable"."""
    from r3_rllib.envs.math_env import MathEnv

    with pytest.raises(TypeError, match=r"data must be a file.*env_config needs a 'data' entry"):
        MathEnv(data=data)
