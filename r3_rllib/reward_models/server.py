"""The reward server: the config's reward terms (``reward_models``) graded in a pool of Ray actors, batched and
asynchronous, and composed with the env's reward into each sample's reward.

A driver-side rollout stage (:class:`~r3_rllib.algorithms.r3.rollout_stages.RolloutStage`, name
``reward_server``). :meth:`RewardServer.submit` turns every sample of a rollout into a
:class:`~r3_rllib.rewards.scoring.RewardRequest` (the group's prompt, the sample's response, the env's reward and
verdict; ``gold`` is None: the runners do not send the env's gold answer to the driver) and splits the groups, whole
(a group judge sees each group's requests together), over the ``reward_workers`` actors: one batch per worker per
rollout, in order. It returns at once; with overlap_generation or streaming the runners are generating the next
rollout while the workers grade. :meth:`RewardServer.resolve` waits for the batches until ``reward_timeout_s``
after the submit, then composes (``r3_rllib.core.reward_composition``). The workers build their scorers (a judge
loads its model) once, when the server starts, which waits for them: a term that cannot be built stops the run
before training with the scorer's error. A replacement worker's start is not counted in the timeout.

Failures never stop the run; each scores 0 with a reason, counted in ``reward_server/failures/<reason>``:

- ``timeout``: a batch not graded in time. Its worker is killed and replaced (a hung judge would hang the next
  batch too); the next rollout is graded by the fresh worker.
- ``worker_died``: the worker process died during the batch; it is replaced.
- ``scorer_error``: a scorer raised (logged with its traceback); the term's other batches and the other terms
  are graded as usual.
- ``bad_output``: a scorer returned something else than one finite :class:`RewardScore` per request.
- a reason of the scorer's own (a judge whose verdict did not parse: ``judge_unparsable``, ...).

Each sample gets: ``reward`` the composed reward (from ``env_reward``, the env's, so grading a sample twice gives
the same reward), ``reward_parts`` each term's score (0 for a failed one), ``grade_reason`` ``"<term>:<reason>"``
of its first failed term (else the env's). ``correct`` stays the env's verdict: R^3's replay (successes and
failures of a query), reflection, ranking (all-wrong groups) and the accuracy metrics read the verifiable outcome,
which a learned score does not give.

With ``ranking_source`` 'judge' or 'both', the first ``group_judge`` term's scores of each group are written on
the group (``Group.judge_scores``) for R^3's ranking of all-wrong groups (``algorithms/r3/groups.py``); a group the
judge failed on keeps the entropy ranking.

Metrics (``reward_server/...``): ``<term>_mean`` (the term's mean score over the graded samples, failures as 0),
``failures/<reason>`` (count), ``reward_mean`` (composed), ``env_reward_mean``, ``wait_s`` (seconds the learner
waited in :meth:`resolve`, a replacement worker's start included), ``worker_start_s`` (of them, waiting for
replacement workers to start: not counted against ``reward_timeout_s``), ``grade_s`` (the workers' grading seconds, summed), ``judge_ranked_groups``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import ray

from r3_rllib.actor_start import START_TIMEOUT_S, remote_outside_trial, wait_until_started
from r3_rllib.core.method import TrainingPhase
from r3_rllib.core.reward_composition import Term, compose_reward, term_value
from r3_rllib.reward_models.specs import RewardModelSpec, parse_reward_models
from r3_rllib.rewards.scoring import RewardRequest, RewardScore
from r3_rllib.types.samples import Group, Sample

logger = logging.getLogger(__name__)

#: One graded request of one term: (value, reason); reason None when graded normally.
Graded = tuple[float, str | None]

#: The server's own failure reasons, always in the metrics (0 when none); a scorer's own reasons appear when seen.
FAILURE_REASONS = ("timeout", "worker_died", "scorer_error", "bad_output")

#: ranking_source -> the judge's share of the ranking rewards (``Group.judge_rank_weight``).
JUDGE_RANK_WEIGHTS = {"entropy": 0.0, "judge": 1.0, "both": 0.5}


def checked_scores(out: Any, n: int) -> list[Graded]:
    """A scorer's output for ``n`` requests as (value, reason) pairs: ``bad_output`` for the whole batch when it is
    not a list of ``n`` scores, for one request when its entry is not a :class:`RewardScore` with a finite value;
    a score with a reason counts as 0 with it."""
    if not isinstance(out, (list, tuple)) or len(out) != n:
        return [(0.0, "bad_output")] * n
    graded: list[Graded] = []
    for score in out:
        value = getattr(score, "value", None)
        if (
            not isinstance(score, RewardScore)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
        ):
            graded.append((0.0, "bad_output"))
        elif score.reason is not None:
            graded.append((0.0, str(score.reason)))
        elif not math.isfinite(value):
            graded.append((0.0, "bad_output"))
        else:
            graded.append((float(value), None))
    return graded


def grade_term(scorer: Any, name: str, groups: Sequence[Sequence[RewardRequest]]) -> list[Graded]:
    """One term's grades of every request of ``groups``, flat in order: a group scorer (``score_groups``) sees each
    group whole, any other scorer every request in one ``score`` call. A scorer that raises gives
    ``scorer_error`` for the batch (logged)."""
    sizes = [len(g) for g in groups]
    try:
        if callable(getattr(scorer, "score_groups", None)):
            out = scorer.score_groups([list(g) for g in groups])
            if not isinstance(out, (list, tuple)) or len(out) != len(groups):
                return [(0.0, "bad_output")] * sum(sizes)
            return [graded for o, n in zip(out, sizes, strict=True) for graded in checked_scores(o, n)]
        return checked_scores(scorer.score([r for g in groups for r in g]), sum(sizes))
    except Exception:
        logger.exception("reward term %r raised on a batch of %d requests", name, sum(sizes))
        return [(0.0, "scorer_error")] * sum(sizes)


class RewardWorker:
    """One actor of the pool: every term's scorer, built once (a judge's model loads here, not per batch)."""

    def __init__(self, specs: Sequence[RewardModelSpec]) -> None:
        from r3_rllib.reward_models import build_scorer

        self.names = [s.name for s in specs]
        self.scorers = [build_scorer(s) for s in specs]

    def ready(self) -> bool:
        """True once the scorers are built (the driver waits on it)."""
        return True

    def grade(self, groups: Sequence[Sequence[RewardRequest]]) -> tuple[list[list[Graded]], float]:
        """(each term's grades of every request of ``groups``, flat in order; the seconds it took)."""
        start = time.perf_counter()
        grades = [grade_term(s, n, groups) for s, n in zip(self.scorers, self.names, strict=True)]
        return grades, time.perf_counter() - start


@dataclass
class _Batch:
    worker: int  # index in the pool
    ref: Any  # ObjectRef of RewardWorker.grade
    groups: list[int]  # indices of its groups in the submitted rollout
    size: int  # requests


@dataclass
class PendingGrades:
    """What :meth:`RewardServer.submit` sent: the batches and when they were sent."""

    batches: list[_Batch]
    submitted_at: float


def requests_of(group: Group) -> list[RewardRequest]:
    """One request per sample of ``group``, in order."""
    return [
        RewardRequest(
            query_id=group.query_id,
            prompt_text=group.prompt_text,
            response_text=s.response_text,
            env_reward=float(s.env_reward),
            env_correct=bool(s.correct),
            gold=group.gold,
        )
        for s in group.samples
    ]


def split_groups(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Group indices in ``parts`` contiguous runs of about equal request counts (groups whole, order kept; empty
    runs dropped)."""
    total, runs, run, done = sum(sizes), [], [], 0
    for i, n in enumerate(sizes):
        run.append(i)
        done += n
        if done * parts >= total * (len(runs) + 1) and len(runs) < parts - 1:
            runs.append(run)
            run = []
    return [r for r in [*runs, run] if r]


class RewardServer:
    """The reward server stage (see the module docstring)."""

    name = "reward_server"

    def __init__(
        self,
        specs: Sequence[RewardModelSpec],
        *,
        env_reward_weight: float = 1.0,
        workers: int = 1,
        timeout_s: float = 120.0,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        ranking_source: str = "entropy",
    ) -> None:
        if not specs:
            raise ValueError("the reward server needs at least one reward term")
        self.specs = list(specs)
        self.terms = [Term(s.name, s.weight, s.gate, s.gate_threshold, s.gate_reward) for s in self.specs]
        self.env_reward_weight = float(env_reward_weight)
        self.timeout_s = float(timeout_s)
        self.judge_rank_weight = JUDGE_RANK_WEIGHTS[ranking_source]
        judges = [i for i, s in enumerate(self.specs) if s.type == "group_judge"]
        self.ranking_term = judges[0] if judges and self.judge_rank_weight > 0 else None
        # Outside the placement group of a Tune trial, which would capture the workers: its bundles hold the
        # runners and learners only, and an actor asking for more than they cover waits forever.
        self._actor_class = remote_outside_trial(
            RewardWorker, num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker
        )
        self.workers = [self._actor_class.remote(self.specs) for _ in range(max(1, int(workers)))]
        # Built before training: a term that cannot be built (a missing model, a bad function) stops the run here,
        # with the scorer's own error, rather than scoring 0 every iteration.
        wait_until_started(
            [w.ready.remote() for w in self.workers],
            what="reward worker(s)",
            asks=(
                f"{num_cpus_per_worker} CPU / {num_gpus_per_worker} GPU "
                "(reward_num_cpus_per_worker / reward_num_gpus_per_worker)"
            ),
        )
        self._starting: dict[int, Any] = {}  # worker index -> ready() of a replacement still starting

    @classmethod
    def from_config(cls, config: Any) -> RewardServer:
        """The server ``config`` describes (``reward_models``, ``env_reward_weight``, ``reward_workers``,
        ``reward_timeout_s``, ``reward_num_cpus_per_worker``, ``reward_num_gpus_per_worker``, ``ranking_source``)."""
        return cls(
            parse_reward_models(config.reward_models),
            env_reward_weight=config.env_reward_weight,
            workers=config.reward_workers,
            timeout_s=config.reward_timeout_s,
            num_cpus_per_worker=config.reward_num_cpus_per_worker,
            num_gpus_per_worker=config.reward_num_gpus_per_worker,
            ranking_source=config.ranking_source if config.ranking else "entropy",
        )

    def _replace_worker(self, index: int) -> None:
        """Kill worker ``index`` (hung or dead) and start a fresh one in its place."""
        try:
            ray.kill(self.workers[index], no_restart=True)
        except Exception:  # already gone
            logger.debug("reward worker %d was already gone", index)
        self.workers[index] = self._actor_class.remote(self.specs)
        self._starting[index] = self.workers[index].ready.remote()

    def _await_started(self, indices: Sequence[int]) -> float:
        """Wait for the replacements among workers ``indices`` that are still building their scorers (a judge
        loading its model is not grading time); the seconds waited. One that fails to start fails its batch
        (``worker_died``: :meth:`_collect`)."""
        refs = [ref for i in sorted(set(indices)) if (ref := self._starting.pop(i, None)) is not None]
        if not refs:
            return 0.0
        start = time.perf_counter()
        ray.wait(refs, num_returns=len(refs), timeout=START_TIMEOUT_S)
        return time.perf_counter() - start

    def needed_in(self, phase: TrainingPhase | None) -> bool:
        """Always: every phase's advantages come from the rewards."""
        return True

    def submit(self, groups: Sequence[Group]) -> PendingGrades:
        """Send ``groups``' requests to the workers (one batch of whole groups per worker); no waiting."""
        requests = [requests_of(g) for g in groups]
        runs = split_groups([len(r) for r in requests], len(self.workers))
        batches = [
            _Batch(
                w,
                self.workers[w].grade.remote([requests[i] for i in run]),
                run,
                sum(len(requests[i]) for i in run),
            )
            for w, run in enumerate(runs)
        ]
        return PendingGrades(batches, time.perf_counter())

    def _collect(self, pending: PendingGrades) -> tuple[list[list[list[Graded]]], float, float]:
        """Every batch's grades, per term (failed batches filled with their reason), the workers' seconds and the
        seconds waited for replacement workers to start; a worker that timed out or died is replaced."""
        starting_s = self._await_started([b.worker for b in pending.batches])
        deadline = pending.submitted_at + starting_s + self.timeout_s
        refs = [b.ref for b in pending.batches]
        ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.perf_counter()))
        out, grade_s = [], 0.0
        for b in pending.batches:
            ready, _ = ray.wait([b.ref], timeout=0)
            reason = None
            if not ready:
                reason = "timeout"
            else:
                try:
                    grades, seconds = ray.get(b.ref)
                    grade_s += seconds
                except ray.exceptions.RayActorError:
                    reason = "worker_died"
                except (
                    ray.exceptions.RayError
                ):  # the batch's answer failed (e.g. did not pickle); the worker lives
                    logger.exception("reward worker %d: a batch of %d requests failed", b.worker, b.size)
                    reason = "scorer_error"
            if reason is not None:
                if reason != "scorer_error":
                    logger.warning(
                        "reward worker %d: %s on a batch of %d requests; replaced", b.worker, reason, b.size
                    )
                    self._replace_worker(b.worker)
                grades = [[(0.0, reason)] * b.size for _ in self.specs]
            out.append(grades)
        return out, grade_s, starting_s

    def resolve(
        self, pending: PendingGrades, groups: Sequence[Group]
    ) -> tuple[list[Group], dict[str, float]]:
        """Wait for the grades (until ``reward_timeout_s`` after the submit) and return ``groups`` with the
        composed rewards, and the metrics (see the module docstring)."""
        start = time.perf_counter()
        batches, grade_s, starting_s = self._collect(pending)
        wait_s = time.perf_counter() - start
        per_group: dict[int, list[list[Graded]]] = {}  # group index -> per term, its samples' grades
        for b, grades in zip(pending.batches, batches, strict=True):
            offset = 0
            for i in b.groups:
                n = len(groups[i].samples)
                per_group[i] = [term[offset : offset + n] for term in grades]
                offset += n
        out = [self._apply(g, per_group[i]) for i, g in enumerate(groups)]
        metrics = self._metrics(out, [per_group[i] for i in range(len(groups))])
        metrics.update(wait_s=wait_s, worker_start_s=starting_s, grade_s=grade_s)
        return out, metrics

    def _apply(self, group: Group, grades: list[list[Graded]]) -> Group:
        """``group`` with each sample's composed reward, parts and failure reason; its judge scores for ranking."""
        samples = [self._compose(s, [term[j] for term in grades]) for j, s in enumerate(group.samples)]
        out = replace(group, samples=samples)
        if self.ranking_term is not None:
            judged = grades[self.ranking_term]
            if all(reason is None for _, reason in judged):
                out = replace(
                    out, judge_scores=[v for v, _ in judged], judge_rank_weight=self.judge_rank_weight
                )
        return out

    def _compose(self, sample: Sample, grades: Sequence[Graded]) -> Sample:
        values = [term_value(v, reason) for v, reason in grades]
        failed = [f"{t.name}:{reason}" for t, (_, reason) in zip(self.terms, grades, strict=True) if reason]
        parts = dict(sample.reward_parts or {})
        parts.update({t.name: v for t, v in zip(self.terms, values, strict=True)})
        composed = compose_reward(sample.env_reward, self.terms, values, self.env_reward_weight)
        return replace(
            sample,
            reward=composed,
            task_reward=composed,  # what the replay buffer keeps (types/samples.py)
            reward_parts=parts,
            grade_reason=failed[0] if failed else sample.grade_reason,
        )

    def _metrics(self, groups: Sequence[Group], grades: Sequence[list[list[Graded]]]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        metrics = {
            "reward_mean": float(np.mean([s.reward for s in samples])) if samples else 0.0,
            "env_reward_mean": float(np.mean([s.env_reward for s in samples])) if samples else 0.0,
            "judge_ranked_groups": float(sum(g.judge_scores is not None for g in groups)),
        }
        failures: Counter[str] = Counter(dict.fromkeys(FAILURE_REASONS, 0))
        for k, term in enumerate(self.terms):
            values = [term_value(v, r) for g in grades for v, r in g[k]]
            failures.update(r for g in grades for _, r in g[k] if r is not None)
            metrics[f"{term.name}_mean"] = float(np.mean(values)) if values else 0.0
        metrics.update({f"failures/{reason}": float(n) for reason, n in sorted(failures.items())})
        return metrics

    def stop(self) -> None:
        """Kill the workers."""
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already gone
                logger.debug("reward worker already gone at stop")
        self.workers = []
