"""The name a typo most likely meant (core/typo_hints.py): fewest edits first, a swap of two letters counting one."""

from __future__ import annotations

import pytest

from r3_rllib.config.field import unknown_key_message
from r3_rllib.core.typo_hints import closest_name, edit_distance


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("abc", "", 3),
        ("gpro", "grpo", 1),  # two neighbouring letters swapped: one edit
        ("gpro", "hgpo", 2),  # an insertion and a deletion
        ("kitten", "sitting", 3),
        ("ca", "abc", 3),  # optimal string alignment: no substring edited twice (unrestricted Damerau: 2)
    ],
)
def test_edit_distance_by_hand(a, b, distance):
    assert edit_distance(a, b) == distance == edit_distance(b, a)


def test_a_swapped_pair_of_letters_names_the_key_it_came_from():
    """difflib alone scores 'grpo' and 'hgpo' alike for 'gpro' (0.75) and picks the larger string."""
    presets = ["grpo", "dapo", "hgpo", "r3"]
    assert closest_name("gpro", presets) == "grpo"
    assert (
        unknown_key_message("gpro", presets, "preset") == "unknown key 'gpro' in preset; did you mean 'grpo'?"
    )
    assert closest_name("hgop", presets) == "hgpo"
    assert closest_name("trainig", ["training", "environment", "run"]) == "training"
    assert closest_name("zzzz", presets) is None
    assert unknown_key_message("zzzz", presets, "preset") == (
        "unknown key 'zzzz' in preset; known keys: dapo, grpo, hgpo, r3"
    )


def test_every_unknown_name_error_ranks_its_hint_the_same_way():
    """R3Config's unknown settings (.r3()) and the text env registry take the same hint as run-file keys."""
    from r3_rllib.algorithms.r3.config import R3Config
    from r3_rllib.envs.registry import unknown_text_env_message

    with pytest.raises(ValueError, match="did you mean 'kl_coef'"):
        R3Config().r3(kl_ceof=0.1)
    assert "did you mean 'gridworld'?" in unknown_text_env_message("gridwrold")


def test_an_unknown_training_setting_is_named_with_the_closest_of_ours_and_rllibs():
    """Was: RLlib's ``training() got an unexpected keyword argument``, no hint. `.training()` takes both our fields
    and RLlib's; the hint comes from either."""
    from r3_rllib.algorithms.r3.config import R3Config

    with pytest.raises(ValueError, match="Unknown training setting 'gruop_size'; did you mean 'group_size'"):
        R3Config().training(gruop_size=4)
    with pytest.raises(ValueError, match="did you mean 'grad_clip'"):
        R3Config().training(grad_clp=1.0)
    config = R3Config().training(group_size=4, grad_clip=0.5, lr=1e-4)
    assert (config.group_size, config.grad_clip, config.lr) == (4, 0.5, 1e-4)
