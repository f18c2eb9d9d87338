import math
from dataclasses import FrozenInstanceError

import pytest

from r3_rllib.core.reflection import (
    COMPACT_REFLECTION_TEMPLATE,
    DEFAULT_REFLECTION_GUIDANCE,
    DEFAULT_REFLECTION_TEMPLATE,
    REFLECTION_HARDNESS,
    ReflectionSettings,
    build_reflection_prompt,
    past_score,
    select_reflection_queries,
    strip_think,
)


def test_default_guidance_content():
    g = DEFAULT_REFLECTION_GUIDANCE.lower()
    assert "incorrect" in g and "repeat" in g and "\\boxed{}" in DEFAULT_REFLECTION_GUIDANCE


def test_default_prompt_layout():
    p = build_reflection_prompt("What is 2+3?", "<think>2+3 is 6</think>The answer is \\boxed{6}.")
    assert p == DEFAULT_REFLECTION_TEMPLATE.format(
        query="What is 2+3?", wrong_answer="The answer is \\boxed{6}.", guidance=DEFAULT_REFLECTION_GUIDANCE
    )
    assert p.startswith("What is 2+3?") and p.endswith(DEFAULT_REFLECTION_GUIDANCE)
    assert "2+3 is 6" not in p


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>a\nb</think> final", "final"),
        ("reasoning opened by the template</think>\nfinal", "final"),
        ("<think>cut off while reason", "cut off while reason"),
        ("no tags at all ", "no tags at all"),
        ("<think>x</think>one<think>y</think>two", "onetwo"),
    ],
)
def test_strip_think(text, expected):
    assert strip_think(text) == expected


def test_keep_think_when_asked():
    p = build_reflection_prompt(
        "q", "<think>r</think>a", template="{query}|{wrong_answer}", remove_think=False
    )
    assert p == "q|<think>r</think>a"


def test_max_answer_chars_keeps_tail():
    p = build_reflection_prompt("q", "0123456789", template="{query}|{wrong_answer}", max_answer_chars=4)
    assert p == "q|...6789"
    assert (
        build_reflection_prompt("q", "0123", template="{query}|{wrong_answer}", max_answer_chars=4)
        == "q|0123"
    )
    with pytest.raises(ValueError, match="max_answer_chars"):
        build_reflection_prompt("q", "a", max_answer_chars=0)


def test_compact_template_is_printable_ascii_and_ends_with_query():
    assert all(32 <= ord(c) < 127 for c in COMPACT_REFLECTION_TEMPLATE)
    p = build_reflection_prompt("12+34=", "47", template=COMPACT_REFLECTION_TEMPLATE)
    assert p == "47?12+34="


def test_braces_in_values_are_safe_and_bad_templates_fail():
    p = build_reflection_prompt(
        "{x}", "\\boxed{5}", template="{query} {wrong_answer} {guidance}", guidance="g{}"
    )
    assert p == "{x} \\boxed{5} g{}"
    with pytest.raises(ValueError, match="placeholders"):
        build_reflection_prompt("q", "a", template="{query}")
    with pytest.raises(ValueError, match="bad reflection template"):
        build_reflection_prompt("q", "a", template="{query}{wrong_answer}{other}")


def test_select_reflection_queries():
    means = {"a": 0.1, "b": 0.5, "c": None, "d": math.nan, "e": 0.0, "f": 0.49}
    assert select_reflection_queries(means, 0.5) == ["a", "e", "f"]
    assert select_reflection_queries({}, 0.5) == []
    with pytest.raises(ValueError, match="tau"):
        select_reflection_queries(means, math.nan)
    assert select_reflection_queries(means, 0.5, max_queries=2) == ["a", "e"]
    assert select_reflection_queries(means, 0.5, max_queries=0) == []
    with pytest.raises(ValueError, match="max_queries"):
        select_reflection_queries(means, 0.5, max_queries=-1)


def test_hardness_is_past_accuracy_by_default_mean_reward_as_an_option():
    # A query seen 4 times, right once with a length bonus (reward 1.8), wrong 3 times (0): accuracy 1/4 = 0.25,
    # mean reward 1.8 / 4 = 0.45. At tau 0.3 it is hard by accuracy, not by mean reward.
    assert past_score(4, 1, 0.45) == pytest.approx(0.25)
    assert past_score(4, 1, 0.45, "mean_reward") == pytest.approx(0.45)
    # 3 of 10 right with reward 1.0 each: 0.3 either way, and 0.3 is not below tau 0.3
    assert past_score(10, 3, 0.3) == pytest.approx(0.3) and past_score(10, 3, 0.3, "mean_reward") == 0.3
    assert past_score(0, 0, math.nan) is None and past_score(0, 0, math.nan, "mean_reward") is None
    history = {"bonus": (4, 1, 0.45), "edge": (10, 3, 0.3), "new": (0, 0, math.nan), "easy": (5, 4, 1.2)}
    by_acc = {q: past_score(*h) for q, h in history.items()}
    by_mean = {q: past_score(*h, hardness="mean_reward") for q, h in history.items()}
    assert select_reflection_queries(by_acc, 0.3) == ["bonus"]
    assert select_reflection_queries(by_mean, 0.3) == []
    with pytest.raises(ValueError, match="hardness must be one of"):
        past_score(4, 1, 0.45, "reward")
    with pytest.raises(ValueError, match="n_correct must be in"):
        past_score(2, 3, 1.0)
    assert REFLECTION_HARDNESS == ("accuracy", "mean_reward")
    assert ReflectionSettings(tau=0.3).hardness == "accuracy"


def test_reflection_hardness_config_field():
    from r3_rllib.algorithms.r3.config import R3Config
    from r3_rllib.algorithms.r3.iteration_settings import iteration_settings

    cfg = R3Config.r3_preset().r3(reflection_start_epoch=0)
    assert iteration_settings(cfg, dataset_epoch=0, policy_version=0).reflection.hardness == "accuracy"
    cfg = R3Config.r3_preset().r3(reflection_start_epoch=0, reflection_hardness="mean_reward")
    assert iteration_settings(cfg, dataset_epoch=0, policy_version=0).reflection.hardness == "mean_reward"
    with pytest.raises(ValueError, match="reflection_hardness must be one of"):
        R3Config.r3_preset().r3(reflection_hardness="hard").validate()


def test_reflection_settings_render_the_prompt_with_their_template_and_limit():
    settings = ReflectionSettings(
        tau=0.3, guidance="G", template="{wrong_answer}|{query}|{guidance}", max_answer_chars=3
    )
    assert settings.prompt("1+1=", "<think>long</think>12345") == "...345|1+1=|G"
    with pytest.raises(FrozenInstanceError):
        settings.tau = 0.5  # one object per iteration, shared by every runner: never mutated
