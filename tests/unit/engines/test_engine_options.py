"""`EngineOptions`: the runners' engine as a typed, versioned object built from the config."""

from __future__ import annotations

import pickle

import pytest

from r3_rllib import R3Config
from r3_rllib.engines.options import EngineOptions


def test_config_builds_the_options_and_they_cross_processes_intact():
    config = R3Config().training(
        engine="hf", model_path="m", dtype="float32", engine_kwargs={"max_batch_size": 8}
    )
    options = config.engine_options()
    assert (options.kind, options.model_path, options.dtype) == ("hf", "m", "float32")
    assert dict(options.backend_kwargs) == {"max_batch_size": 8} and not options.rollout_head
    with pytest.raises(TypeError):
        options.backend_kwargs["max_batch_size"] = (
            1  # read-only: a runner cannot change what the driver decided
        )
    assert pickle.loads(pickle.dumps(options)) == options


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="unknown engine kind 'tgi'"):
        EngineOptions(kind="tgi", model_path=None)
    with pytest.raises(ValueError, match=r"may not set \['dtype'\]"):
        EngineOptions(kind="hf", model_path=None, backend_kwargs={"dtype": "float16"})
    with pytest.raises(ValueError, match="format 7"):
        EngineOptions(kind="hf", model_path=None, format=7)
