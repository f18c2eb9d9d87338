"""A group judge (RULER-style): the judge LM reads all the responses to one prompt at once and scores each in [0, 1]
relative to the others, which is what a group-relative advantage needs.

The judge is built and prompted as the one-response judge (:class:`~r3_rllib.reward_models.judge.JudgeModel`: same
engine, chat template, sampling and special-token cleaning). One prompt per group: the rubric (``spec.rubric``,
else :data:`DEFAULT_GROUP_RUBRIC` or, without a gold answer, :data:`DEFAULT_GROUP_RUBRIC_NO_GOLD`) with
``{question}`` (the group's prompt, read as the one-response judge reads it), ``{gold}``, ``{n}`` (the group's
size) and ``{responses}`` (the responses numbered from 1 in the group's order, each as ``Response k:`` and its text)
filled in.

The reply is read by :func:`r3_rllib.core.verdicts.parse_group_scores`: a JSON object ``{"scores": [s_1, ...,
s_n]}`` (other JSON shapes and a ``Response k: s`` line fallback are accepted; see there). A reply without one
score in [0, 1] per response gives the whole group ``RewardScore(0, "judge_unparsable")``; a prompt that does not fit
the engine ``judge_too_long``; an engine that raised ``judge_error`` for every group of that engine call.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from r3_rllib.core.verdicts import parse_group_scores
from r3_rllib.reward_models.judge import NO_GOLD, JudgeModel, fill_rubric
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore

_SCORE_INSTRUCTIONS = (
    "Score each response from 0 to 1 by how well it answers the question: a correct final answer first, then "
    "clear and sound reasoning. Compare the responses with each other: a better response gets a higher score; "
    "responses of equal quality may get equal scores. You may explain briefly first. End your reply with a JSON "
    'object holding one score per response, in the order shown: {"scores": [score of response 1, ..., score of '
    "response {n}]}"
)
#: The default rubric of a group judge when the requests have a gold answer.
DEFAULT_GROUP_RUBRIC = (
    "You are comparing {n} responses to the same question.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{gold}\n\n"
    "{responses}\n\n" + _SCORE_INSTRUCTIONS
)
#: The default rubric of a group judge when the env exposes no gold answer.
DEFAULT_GROUP_RUBRIC_NO_GOLD = (
    "You are comparing {n} responses to the same question.\n\nQuestion:\n{question}\n\n{responses}\n\n"
    + _SCORE_INSTRUCTIONS
)


def numbered_responses(responses: Sequence[str]) -> str:
    """The responses as ``Response 1:`` ... blocks, in order, separated by blank lines."""
    return "\n\n".join(f"Response {k}:\n{text}" for k, text in enumerate(responses, start=1))


def group_prompt(rubric: str | None, question: str, responses: Sequence[str], gold: str | None) -> str:
    """The text the group judge reads for one group (module docstring)."""
    if rubric is None:
        rubric = DEFAULT_GROUP_RUBRIC if gold is not None else DEFAULT_GROUP_RUBRIC_NO_GOLD
    values = {
        "question": question,
        "gold": NO_GOLD if gold is None else gold,
        "n": str(len(responses)),
        "responses": numbered_responses(responses),
    }
    return fill_rubric(rubric, values)


class GroupJudge:
    """Scores the responses of each group relative to each other (module docstring); a
    :class:`~r3_rllib.rewards.scoring.GroupRewardScorer`."""

    def __init__(self, spec: RewardModelSpec) -> None:
        self.name = spec.name
        self.rubric = spec.rubric
        self.batch_size = int(spec.batch_size)
        self.model = JudgeModel(spec)

    def prompt_text(self, group: Sequence[RewardRequest]) -> str:
        """The judge's prompt for ``group`` (its first request's prompt and gold), before the chat template."""
        clean = self.model.clean
        gold = group[0].gold
        responses = [clean(r.response_text) for r in group]
        question = self.model.question(group[0].prompt_text)
        return group_prompt(self.rubric, question, responses, None if gold is None else clean(gold))

    def score_groups(self, groups: Sequence[Sequence[RewardRequest]]) -> list[list[RewardScore]]:
        """For each group, one score per response in order; ``batch_size`` groups per engine call."""
        out = [[RewardScore(0.0, "judge_too_long") for _ in group] for group in groups]
        prompts = [self.model.prompt_ids(self.prompt_text(g)) if g else [] for g in groups]
        sent = [i for i, ids in enumerate(prompts) if groups[i] and self.model.fits(ids)]
        for start in range(0, len(sent), self.batch_size):
            chunk = sent[start : start + self.batch_size]
            parsers = [partial(parse_group_scores, n=len(groups[i])) for i in chunk]
            values, failure = self.model.judge([prompts[i] for i in chunk], parsers)
            for k, i in enumerate(chunk):
                if failure is not None:
                    out[i] = [RewardScore(0.0, failure) for _ in groups[i]]
                elif values[k] is None:
                    out[i] = [RewardScore(0.0, "judge_unparsable") for _ in groups[i]]
                else:
                    out[i] = [RewardScore(v) for v in values[k]]
        return out
