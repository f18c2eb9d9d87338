"""The known name a typo most likely meant, for the "did you mean ...?" of every unknown-name error (config keys,
env names and options, object paths, checkpoint overrides). Pure: no Ray."""

from __future__ import annotations

import difflib
from collections.abc import Collection


def closest_name(key: str, known: Collection[str]) -> str | None:
    """The known name a typo ``key`` most likely meant: among difflib's close matches, the one fewest edits away
    (insertions, deletions, substitutions and swaps of two neighbouring letters), then difflib's order. difflib
    alone ranks by matching blocks and breaks ties by the larger string: 'gpro' (two swapped letters) came out
    'hgpo', not 'grpo'."""
    matches = difflib.get_close_matches(key, sorted(known), n=5)
    if not matches:
        return None
    return min(matches, key=lambda name: (edit_distance(key, name), matches.index(name)))


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: the fewest insertions, deletions, substitutions and transpositions of two
    adjacent characters that turn ``a`` into ``b`` (no substring edited twice)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]
