"""The trained-stream digest (core/stream_digest.py): equal streams, equal digests; any change to what was trained
(a sample skipped, doubled, reordered, another version or other tokens) changes it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from r3_rllib.core.stream_digest import stream_digest, stream_keys


@dataclass(frozen=True)
class _S:
    query_id: str
    policy_version: int
    response_ids: tuple[int, ...]
    is_replay: bool = False
    is_reflection: bool = False


STREAM = [_S("q1", 0, (5, 6, 7)), _S("q1", 0, (5, 8)), _S("q2", 1, (9,)), _S("q3", 1, ())]


def test_the_digest_is_a_fixed_53_bit_safe_integer():
    digest = stream_digest(STREAM)
    assert digest == stream_digest(list(STREAM))  # same stream, same number
    assert 0 <= digest < 2**32 and float(digest) == digest  # exact as a float metric and in a CSV
    assert stream_digest([]) == 0
    # list and array token ids agree (runners send arrays, replayed samples lists)
    as_arrays = [replace(s, response_ids=np.asarray(s.response_ids, dtype=np.int32)) for s in STREAM]
    assert stream_digest(as_arrays) == digest
    assert digest == 120088362  # pinned: the digest must not change between versions of the package


def test_every_change_to_the_stream_changes_the_digest():
    digest = stream_digest(STREAM)
    changed = [
        STREAM[1:],  # skipped
        [*STREAM, STREAM[-1]],  # trained twice
        [STREAM[1], STREAM[0], *STREAM[2:]],  # reordered
        [replace(STREAM[0], policy_version=1), *STREAM[1:]],  # another policy version
        [replace(STREAM[0], response_ids=(5, 6, 8)), *STREAM[1:]],  # other tokens
        [replace(STREAM[0], is_replay=True), *STREAM[1:]],  # replayed instead of fresh
        [replace(STREAM[0], query_id="q11"), *STREAM[1:]],
    ]
    assert len({stream_digest(c) for c in changed} | {digest}) == len(changed) + 1


def test_stream_keys_are_query_and_version_in_order():
    assert stream_keys(STREAM) == [("q1", 0), ("q1", 0), ("q2", 1), ("q3", 1)]
