"""The name a typo most likely meant (config/field.py): fewest edits first, a swap of two letters counting one."""

from __future__ import annotations

import pytest

from r3_rllib.config.field import closest_name, edit_distance, unknown_key_message


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
