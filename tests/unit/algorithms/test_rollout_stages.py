"""The driver's rollout stages (algorithms/r3/rollout_stages.py): every stage submitted before the first resolves,
each applied to what the previous one returned, metrics logged per stage; the algorithm stops them at cleanup and
builds the named models every part of the run loads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ray.rllib.algorithms.algorithm import Algorithm

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.r3 import R3
from r3_rllib.algorithms.r3.rollout_stages import apply_stages
from r3_rllib.types.samples import Group, Sample


def _group(qid: str, rewards: list[float]) -> Group:
    samples = [
        Sample(
            query_id=qid,
            prompt_ids=[1],
            response_ids=[2, 3],
            behavior_logprobs=np.zeros(2, np.float32),
            entropies=np.zeros(2, np.float32),
            reward=r,
            correct=r > 0,
            truncated=False,
            policy_version=0,
        )
        for r in rewards
    ]
    return Group(query_id=qid, samples=samples)


class AddStage:
    """Adds ``delta`` to every reward; records the order of its calls in ``calls``."""

    def __init__(self, name: str, delta: float, calls: list[str]) -> None:
        self.name, self.delta, self.calls = name, delta, calls
        self.stopped = False

    def needed_in(self, phase) -> bool:
        return True

    def submit(self, groups):
        self.calls.append(f"submit {self.name}")
        return [s.reward for g in groups for s in g.samples]  # what it saw when submitted

    def resolve(self, pending, groups):
        self.calls.append(f"resolve {self.name}")
        out = [
            dataclasses.replace(
                g, samples=[dataclasses.replace(s, reward=s.reward + self.delta) for s in g.samples]
            )
            for g in groups
        ]
        return out, {"seen_mean": float(np.mean(pending)), "delta": self.delta}

    def stop(self) -> None:
        self.stopped = True


def test_stages_submit_first_then_resolve_in_order_on_the_previous_output():
    calls: list[str] = []
    logged: list[tuple[str, str, float]] = []
    groups = [_group("a", [0.0, 1.0]), _group("b", [1.0, 1.0])]
    out = apply_stages(
        [AddStage("x", 0.5, calls), AddStage("y", 2.0, calls)], groups, lambda *a: logged.append(a)
    )
    assert calls == ["submit x", "submit y", "resolve x", "resolve y"]
    assert [s.reward for g in out for s in g.samples] == [2.5, 3.5, 3.5, 3.5]
    assert [s.reward for g in groups for s in g.samples] == [0.0, 1.0, 1.0, 1.0]  # inputs left alone
    assert ("x", "seen_mean", 0.75) in logged and ("y", "seen_mean", 0.75) in logged  # both saw the rollout
    assert apply_stages([], groups, lambda *a: None) == groups


def test_a_stage_the_phase_does_not_need_is_not_called_and_logged_skipped():
    """R^2PO's stage A trains the rollout head alone, with no distillation term: the teacher is not called there."""
    from r3_rllib.core.method import DEFAULT_PHASE
    from r3_rllib.distill.teacher import TeacherStage
    from r3_rllib.r2po.method import R2POPhase
    from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE

    class Teacherlike(AddStage):
        needed_in = TeacherStage.needed_in

    calls: list[str] = []
    logged: list[tuple[str, str, float]] = []
    groups = [_group("a", [0.0, 1.0])]
    stages = [AddStage("reward", 1.0, calls), Teacherlike("distill", 5.0, calls)]
    out = apply_stages(stages, groups, lambda *a: logged.append(a), R2POPhase(HEAD_STAGE))
    assert calls == ["submit reward", "resolve reward"]
    assert [s.reward for g in out for s in g.samples] == [1.0, 2.0]
    assert ("distill", "skipped", 1.0) in logged and ("reward", "skipped", 0.0) in logged
    for phase in (R2POPhase(BASE_STAGE), DEFAULT_PHASE, None):
        calls.clear()
        apply_stages(stages, groups, lambda *a: None, phase)
        assert calls == ["submit reward", "submit distill", "resolve reward", "resolve distill"], phase


def test_a_stage_skipped_in_an_iteration_reports_only_skipped_there_not_its_earlier_metrics_as_nan():
    """The coordinator logs each rollout's stage metrics alone: a teacher skipped in R^2PO's stage A, after it
    scored stage B's rollout, reports ``skipped`` 1 and no ``scored_samples`` (RLlib would report that key, logged
    in the iteration before, as NaN); the next stage B reports its own numbers again."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
    from r3_rllib.algorithms.r3.rollout_types import Rollout
    from r3_rllib.distill.teacher import TeacherStage
    from r3_rllib.r2po.method import R2POPhase
    from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE

    class Teacherlike(AddStage):
        needed_in = TeacherStage.needed_in

        def resolve(self, pending, groups):
            return list(groups), {"scored_samples": float(len(pending))}

    coordinator = RolloutCoordinator(runners=None, config=None, metrics=MetricsLogger())
    coordinator.stages = [AddStage("reward", 1.0, []), Teacherlike("distill", 0.0, [])]
    rollout = Rollout(groups=(_group("a", [0.0, 1.0, 1.0]),))
    results = []
    for stage in (BASE_STAGE, HEAD_STAGE, BASE_STAGE):
        coordinator.score(rollout, R2POPhase(stage))
        results.append(MetricsLogger.peek_results(coordinator.metrics.reduce()))
    assert [r["distill"] for r in results] == [
        {"skipped": 0.0, "scored_samples": 3.0},
        {"skipped": 1.0},
        {"skipped": 0.0, "scored_samples": 3.0},
    ]
    assert [r["reward"]["delta"] for r in results] == [1.0, 1.0, 1.0]  # a stage every phase needs: unchanged
    # A rollout with no group (every runner lost, say): no stage ran, and none reports its earlier numbers.
    coordinator.score(Rollout(groups=()), R2POPhase(BASE_STAGE))
    empty = MetricsLogger.peek_results(coordinator.metrics.reduce())
    assert "distill" not in empty and "reward" not in empty, empty


def test_a_stage_that_drops_groups_is_an_error_naming_it():
    class Dropping(AddStage):
        def resolve(self, pending, groups):
            return list(groups)[:1], {}

    with pytest.raises(RuntimeError, match="'drop' returned 1 groups for 2"):
        apply_stages([Dropping("drop", 0.0, [])], [_group("a", [0.0]), _group("b", [1.0])], lambda *a: None)


def test_cleanup_stops_every_stage_even_when_setup_stopped_early(monkeypatch):
    monkeypatch.setattr(Algorithm, "cleanup", lambda self: None)
    stages = [AddStage("x", 0.0, []), AddStage("y", 0.0, [])]
    algo = object.__new__(R3)
    algo.coordinator = type("Coordinator", (), {"stages": stages})()
    algo.cleanup()
    assert all(s.stopped for s in stages)
    R3.cleanup(object.__new__(R3))  # no coordinator yet: nothing to stop, no error


def test_model_paths_name_every_model_the_run_loads():
    config = R3Config().training(
        model_path="policy",
        distill_teacher="teacher",
        reward_models=[
            {"name": "judge", "type": "judge", "model": "judge-model"},
            {"name": "r", "type": "rule"},
        ],
    )
    assert config.model_paths == ["policy", None, "teacher", "judge-model", None]
