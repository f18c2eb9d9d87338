"""A learner's update does not depend on the torch thread count: the weights after two epochs, the loss, gradient
norm and entropy are bit-identical at 1, 2 and 3 threads (matrix products and reductions along a dimension are
thread-invariant on CPU; whole-tensor sums go through core/reductions.py, tested there), in fp32 and in bf16
(dtype='bfloat16': oneDNN's bf16 products, on a CPU that has them). This is what lets ``cpu_threads='auto'`` (the
default) give each update the cores that are free when it starts and still promise the same numbers for the same
seed. (The runners keep their reservation under 'auto': the HF engine's sampled log-probs differ in the last bit
between 1 and 2 threads.)"""

from __future__ import annotations

import functools
import itertools

import gymnasium as gym
import pytest
import torch
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import learner_threads
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.core import threads as core_threads
from r3_rllib.models.dtypes import cpu_has_native_bf16
from r3_rllib.types import TrainingBatch
from r3_rllib.types.samples import Sample

# Whole learner updates at several thread counts (~9 s): the whole suite runs them, not the fast tier.
pytestmark = pytest.mark.slow

THREADS = (1, 2, 3)
RESPONSE_TOKENS = 600


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _updated_weights(
    model_path: str, threads: int, samples: list[Sample], follow: bool = False, dtype: str = "auto"
) -> tuple[list[torch.Tensor], dict]:
    # cpu_threads='reserved': the learner runs exactly num_cpus_per_learner threads in its update.
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=threads)
        .training(
            model_path=model_path,
            cpu_threads="reserved",
            dtype=dtype,
            micro_batch_size=len(samples),
            num_epochs=2,  # the second epoch's proximal log-probs come from a no-grad pass
            gradient_checkpointing=False,
            lr=1e-2,  # large Adam steps: a last-bit difference in one step would show in every weight after
        )
    )
    space = gym.spaces.Text(8)
    learner: R3Learner = cfg.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    if follow:  # a plan of `threads` from a reservation of 1: the update follows the (faked) free cores
        learner._threads = learner_threads.UpdateThreads(1, threads, 1)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(samples), seed=3)
    if not follow:
        assert torch.get_num_threads() == threads
    return [p.detach().clone() for p in learner.policy.parameters()], metrics


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return random_samples(12, min_response_len=RESPONSE_TOKENS - 50, max_response_len=RESPONSE_TOKENS)


@pytest.fixture(scope="module")
def one_thread(tiny_random_model, samples) -> tuple[list[torch.Tensor], dict]:
    """The update at one thread, which every other thread count and schedule must equal."""
    before = torch.get_num_threads()
    try:
        return _updated_weights(tiny_random_model, 1, samples)
    finally:
        torch.set_num_threads(before)


def _assert_equal_to_one_thread(runs: dict[int, tuple[list[torch.Tensor], dict]]) -> None:
    """Every thread count's weights, loss, gradient norm and entropy equal to the bit the 1-thread update's."""
    weights, metrics = runs[1]
    assert metrics["grad_norm"] > 0
    for t in THREADS[1:]:
        assert all(torch.equal(a, b) for a, b in zip(weights, runs[t][0], strict=True)), f"{t} threads"
        for key in ("loss", "grad_norm", "entropy"):
            assert metrics[key] == runs[t][1][key], (key, t)


def test_a_learner_update_is_bit_identical_at_1_2_and_3_threads(tiny_random_model, samples, one_thread):
    runs = {1: one_thread} | {t: _updated_weights(tiny_random_model, t, samples) for t in THREADS[1:]}
    _assert_equal_to_one_thread(runs)


@pytest.mark.skipif(
    not cpu_has_native_bf16(),
    reason="no avx512_bf16 or AMX: bf16 is emulated here (the library warns off it)",
)
def test_a_bf16_update_is_bit_identical_at_1_2_and_3_threads(tiny_random_model, samples):
    """dtype='bfloat16' on CPU (fp32 weights, bf16 autocast): oneDNN's bf16 matrix products too."""
    runs = {t: _updated_weights(tiny_random_model, t, samples, dtype="bfloat16") for t in THREADS}
    _assert_equal_to_one_thread(runs)


def test_an_update_whose_threads_change_while_it_runs_is_bit_identical(
    tiny_random_model, samples, one_thread, monkeypatch
):
    """The free cores change during an update (faked: every other pair of readings sees the machine busy), so
    its thread count moves between 1 and 3 inside forwards and backwards: the same weights and metrics as 1 thread."""
    readings = itertools.cycle([0.0, 0.0, 2.0, 2.0])  # cores busy elsewhere, of 3: none, then two
    monkeypatch.setattr(core_threads, "available_cores", lambda: 3)
    monkeypatch.setattr(learner_threads, "phase_start_threads", lambda planned, reserved: reserved)
    follower = functools.partial(
        core_threads.FreeCoreFollower, interval_s=0.0, read_busy=lambda: next(readings)
    )
    made: list[core_threads.FreeCoreFollower] = []
    monkeypatch.setattr(
        learner_threads, "FreeCoreFollower", lambda *a, **k: made.append(follower(*a, **k)) or made[-1]
    )
    weights, metrics = one_thread
    moved, moved_metrics = _updated_weights(tiny_random_model, 3, samples, follow=True)
    assert made[-1].changes >= 10  # switched inside the passes, not once
    assert 1.0 < moved_metrics["torch_threads"] < 3.0
    assert all(torch.equal(a, b) for a, b in zip(weights, moved, strict=True))
    for key in ("loss", "grad_norm", "entropy"):
        assert metrics[key] == moved_metrics[key], key


def test_an_update_polls_from_at_most_poll_points_modules_and_parameters(monkeypatch):
    """40 linear layers (40 modules with parameters, 80 trainable parameters): hooks on 32 of each, spread from the
    first (every 40/32-th, every 80/32-th), none left after the update."""
    assert learner_threads.spread(list(range(10)), 4) == [0, 2, 5, 7]  # i * 10 // 4 for i < 4
    assert learner_threads.spread([1, 2], 4) == [1, 2]
    monkeypatch.setattr(learner_threads, "phase_start_threads", lambda planned, reserved: reserved)
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(40)])
    threads = learner_threads.UpdateThreads(start=1, most=3, reserved=1)

    def hooks() -> tuple[int, int]:
        forward = sum(len(m._forward_pre_hooks) for m in model.modules())
        backward = sum(len(p._backward_hooks or {}) for p in model.parameters())
        return forward, backward

    threads.start(model)
    assert hooks() == (learner_threads.POLL_POINTS, learner_threads.POLL_POINTS) == (32, 32)
    assert len(model[0]._forward_pre_hooks) == 1 and len(model[1]._forward_pre_hooks) == 1  # 1 * 40 // 32 = 1
    assert len(model[4]._forward_pre_hooks) == 0  # 3 * 40 // 32 = 3, 4 * 40 // 32 = 5
    threads.stop()
    assert hooks() == (0, 0)


def test_matrix_products_of_small_shapes_are_the_same_bits_at_1_and_2_threads():
    """MKL without strict reproducibility (MKL_CBWR, set by importing r3_rllib) rounds some shapes differently at 1
    and 2 threads: 12 of these 96 shapes on an AMD EPYC with AVX-512, in a sweep with other random values
    (BENCHMARKS.md section 40). This passes in MKL's non-strict AUTO mode too: that the mode is STRICT is checked
    in tests/unit/core/test_mkl_mode.py."""
    import r3_rllib  # noqa: F401  (sets MKL_CBWR before MKL's first call in this process)

    gen = torch.Generator().manual_seed(0)
    differ = []
    for m in (1, 3, 10, 17, 33, 64, 100, 1024):
        for k in (50, 100, 128, 333):
            for n in (64, 100, 128):
                a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
                torch.set_num_threads(1)
                one = a @ b
                torch.set_num_threads(2)
                if not torch.equal(one, a @ b):
                    differ.append((m, k, n))
    assert differ == [], differ
