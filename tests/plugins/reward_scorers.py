"""Reward scorers of a user's own (``scorer_class``) and a rule function, for the reward server's tests: each
behaves by what the response says, so one rollout can mix normal grading with a hang, an exception, garbage or a
worker that dies.

- ``"hang"`` in a response: :class:`LengthScorer` sleeps 60 s (a judge that hangs);
- ``"raise"``: raises; ``"garbage"``: returns a string for the batch; ``"nan"``: a NaN score for that response;
  ``"die"``: the worker process exits (only in a Ray actor: never in the test process);
- otherwise the score is ``len(response) / 10``.
"""

from __future__ import annotations

import os
import time

from r3_rllib.rewards.scoring import RewardScore


class LengthScorer:
    def __init__(self, spec) -> None:
        self.name = spec.name

    def score(self, requests):
        texts = [r.response_text for r in requests]
        if any("hang" in t for t in texts):
            time.sleep(60)
        if any("raise" in t for t in texts):
            raise RuntimeError("the scorer failed")
        if any("garbage" in t for t in texts):
            return "not a list of scores"
        if any("die" in t for t in texts) and _in_an_actor():
            os._exit(1)
        return [RewardScore(float("nan")) if "nan" in t else RewardScore(len(t) / 10) for t in texts]


def _in_an_actor() -> bool:
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class GroupLengthScorer:
    """A group judge: each response's rank by length within its group (longest 1.0, then 0.5 ... for 3)."""

    def __init__(self, spec) -> None:
        self.name = spec.name
        self.calls: list[int] = []

    def score_groups(self, groups):
        out = []
        for g in groups:
            if any("unsure" in r.response_text for r in g):
                out.append([RewardScore(0.0, "judge_unparsable") for _ in g])
                continue
            order = sorted(range(len(g)), key=lambda i: len(g[i].response_text))
            scores = [0.0] * len(g)
            for rank, i in enumerate(order):
                scores[i] = rank / max(1, len(g) - 1)
            out.append([RewardScore(s) for s in scores])
        return out


class FormatGate:
    """1.0 when the response is digits only, else 0.0 (a "format first" gate)."""

    def __init__(self, spec) -> None:
        self.name = spec.name

    def score(self, requests):
        return [RewardScore(1.0 if r.response_text.strip().isdigit() else 0.0) for r in requests]


def digits_rule(prompt_text: str, response_text: str, gold: str | None) -> float:
    """A rule term: 1.0 when the response is digits only."""
    return 1.0 if response_text.strip().isdigit() else 0.0


class HangWhileFlagged:
    """Scores 1.0, but hangs (60 s) while the file named by the spec's ``rubric`` exists: a judge that hangs for
    a while."""

    def __init__(self, spec) -> None:
        self.name = spec.name
        self.flag = spec.rubric

    def score(self, requests):
        if self.flag and os.path.exists(self.flag):
            time.sleep(60)
        return [RewardScore(1.0) for _ in requests]
