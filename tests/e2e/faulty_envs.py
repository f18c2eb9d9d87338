"""Text envs that fail on purpose, for the fault tests (test_faults.py). Shipped to the EnvRunners by value
(``ray.cloudpickle.register_pickle_by_value`` in the test): the runners' processes cannot import tests/."""

from __future__ import annotations

import zlib
from typing import Any

from r3_rllib.envs.arithmetic import ArithmeticEnv

#: The message of the error the faulty envs raise (the test looks for it in the driver's error).
FAILURE_MESSAGE = "grader exploded on purpose"


class FaultyArithmeticEnv(ArithmeticEnv):
    """ArithmeticEnv whose ``reset`` (``fail_on="reset"``) or ``step`` (``"step"``) raises ``ZeroDivisionError``, or
    whose ``step`` grades with a NaN reward (``"nan"``); any other mode (``"none"``) is a plain ArithmeticEnv. The
    tests switch ``fail_on`` on a running runner."""

    def __init__(self, *, fail_on: str, shard: Any = None, **config: Any) -> None:
        super().__init__(shard=shard, **config)
        self.fail_on = fail_on

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.fail_on == "reset":
            raise ZeroDivisionError(FAILURE_MESSAGE)
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        if self.fail_on == "step":
            raise ZeroDivisionError(FAILURE_MESSAGE)
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan") if self.fail_on == "nan" else reward, terminated, truncated, info


class NoisyRewardEnv(ArithmeticEnv):
    """ArithmeticEnv graded with a pseudo-random reward of the response text: an untrained model's groups then have
    nonzero advantages, so every iteration updates the learners."""

    def step(self, action: str):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, zlib.crc32(action.encode()) / 2**32, terminated, truncated, info


#: The message of the error a refusing engine raises.
SAMPLING_REFUSED = "the engine refuses these sampling parameters (on purpose)"


def _refuse_sampling(*args: Any, **kwargs: Any):
    raise ValueError(SAMPLING_REFUSED)


def install_refusing_engine(runner: Any) -> None:
    """Make ``runner``'s engine refuse every ``generate`` call, as an engine refuses sampling parameters it does not
    support (``foreach_env_runner`` callback)."""
    runner.engine.generate = _refuse_sampling
