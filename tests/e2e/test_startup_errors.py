"""A runner that cannot start fails the run with its own error and its index, in Python and in `r3 train`; vLLM's
max_model_len is derived from the prompt and response budget (so its KV cache fits what is served)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.startup import EnvRunnerStartupError, find_startup_error
from r3_rllib.engines.budget import (
    DEFAULT_PROMPT_TOKENS,
    ServingBudget,
    derive_max_model_len,
    model_max_positions,
)
from r3_rllib.envs.arithmetic import ArithmeticEnv

R3 = str(Path(sys.executable).parent / "r3")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
KV_MESSAGE = r"To serve at least one request with the model's max seq len \(2048\)"


def small_config(
    model_path: str | None = None, *, runners: int = 1, env_config: dict | None = None
) -> R3Config:
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config=env_config or {"digits": 2, "num_queries": 50})
        .env_runners(num_env_runners=runners, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(model_path=model_path, group_size=2, queries_per_iteration=2, max_new_tokens=4)
    )


# -- the serving budget (no Ray) ------------------------------------------------------------------------------------
def test_max_model_len_is_prompt_budget_plus_reflection_plus_response_capped_at_the_model():
    assert derive_max_model_len(ServingBudget(max_new_tokens=8192, max_prompt_tokens=1024), 131072) == 9216
    # the model's positions cap it (SmolLM2: 8192)
    assert derive_max_model_len(ServingBudget(max_new_tokens=8192, max_prompt_tokens=1024), 8192) == 8192
    # no prompt limit from the env: DEFAULT_PROMPT_TOKENS (2048)
    assert DEFAULT_PROMPT_TOKENS == 2048
    assert derive_max_model_len(ServingBudget(max_new_tokens=256), 8192) == 2048 + 256
    assert derive_max_model_len(ServingBudget(max_new_tokens=16, extra_prompt_tokens=100), None) == 2048 + 116
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        ServingBudget(max_new_tokens=0)
    with pytest.raises(ValueError, match="max_prompt_tokens must be >= 1"):
        ServingBudget(max_new_tokens=4, max_prompt_tokens=0)

    class Cfg:
        max_position_embeddings = 8192

    assert model_max_positions(Cfg()) == 8192 and model_max_positions(object()) is None


def test_config_serving_budget_counts_the_env_prompt_limit_and_reflection():
    """1.5B-like numbers: prompts up to 1024 tokens, 8192-token responses, reflection with answers cut to 4000
    characters. The scaffold '|' + '|' + 'fix' is 3 tokens with a tokenizer that splits on '|' (5 characters
    without one); the wrong answer adds min(8192, 4000 + 3)."""
    config = (
        R3Config.r3_preset()
        .environment("math", env_config={"data": "x.jsonl", "max_prompt_tokens": 1024})
        .training(max_new_tokens=8192)
        .r3(reflection_template="{query}|{wrong_answer}|{guidance}", reflection_guidance="fix")
    )

    def split_tokenizer(text, add_special_tokens=False):
        return {"input_ids": text.split("|")}

    assert config.serving_budget(split_tokenizer) == ServingBudget(8192, 1024, 3 + 4003)
    assert config.serving_budget().extra_prompt_tokens == 5 + 4003
    assert config.serving_budget(split_tokenizer).max_sequence_tokens == 1024 + 4006 + 8192
    # reflection off, no env limit, short responses
    plain = R3Config.grpo_preset().training(max_new_tokens=16)
    assert plain.serving_budget() == ServingBudget(16, None, 0)


def test_startup_error_survives_pickling_and_is_found_inside_wrappers():
    import pickle

    err = EnvRunnerStartupError(2, "ValueError: no KV cache", (3, 4))
    assert (
        str(err)
        == "EnvRunner 2 failed to start: ValueError: no KV cache (EnvRunner 3, 4 failed to start too)"
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.worker_index, back.reason, back.others, str(back)) == (2, err.reason, (3, 4), str(err))
    try:
        try:
            raise err
        except EnvRunnerStartupError as inner:
            raise RuntimeError("trial failed") from inner
    except RuntimeError as outer:
        assert find_startup_error(outer) is err
    assert find_startup_error(ValueError("other")) is None


# -- a runner that cannot start ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bad_model_path_names_the_runner_and_the_missing_folder(ray_session):
    with pytest.raises(
        EnvRunnerStartupError, match=r"^EnvRunner 1 failed to start: FileNotFoundError: no model folder"
    ):
        small_config("/nonexistent/model/folder").build_algo()


@pytest.mark.slow
def test_env_config_error_of_every_runner_is_reported_not_an_index_error(ray_session):
    # An option the env does not take is refused by validate(), before Ray starts, where its signature names its
    # options (tests/unit/config/test_env_options_in_validate.py); one taking **kwargs leaves them to the runners.
    class ForwardingEnv(ArithmeticEnv):  # local: reaches the runners by value
        """Hands every option to its base."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)

    config = small_config(runners=2).environment(ForwardingEnv, env_config={"digits": 2, "bogus_key": 1})
    with pytest.raises(EnvRunnerStartupError) as info:
        config.build_algo()
    err = info.value
    assert (err.worker_index, err.others) == (1, (2,))
    assert str(err).startswith("EnvRunner 1 failed to start: TypeError: ")
    assert "unexpected keyword argument 'bogus_key'" in str(err)
    assert isinstance(err.__cause__, TypeError)  # the runner's own exception, for the traceback


@pytest.mark.slow
def test_one_failed_runner_of_two_fails_the_run_instead_of_running_short_handed(ray_session, tmp_path):
    """RLlib's setup succeeds with one runner up; the run must not start with the other one missing."""

    class OneRunnerOnlyEnv(ArithmeticEnv):  # local: reaches the runners by value
        """Builds in the first runner that gets to it; any other runner's constructor raises."""

        def __init__(self, *, claim_file: str, **kwargs):
            try:
                os.close(os.open(claim_file, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                raise RuntimeError("another runner already holds this env") from None
            super().__init__(**kwargs)

    config = small_config(runners=2).environment(
        OneRunnerOnlyEnv, env_config={"digits": 2, "num_queries": 50, "claim_file": str(tmp_path / "claim")}
    )
    with pytest.raises(
        EnvRunnerStartupError,
        match=r"^EnvRunner [12] failed to start: RuntimeError: another runner already holds",
    ) as info:
        config.build_algo()
    assert info.value.others == ()


@pytest.mark.slow
@pytest.mark.vllm
def test_impossible_vllm_kv_cache_budget_is_reported_with_vllms_message(ray_session, tmp_path):
    pytest.importorskip("vllm")
    from r3_rllib.models import default_tiny_model_path

    # 2048 positions x 2 KiB of KV per token (4 layers, 2 KV heads of 32 floats, keys and values) = 4 MiB > 1 MiB
    config = small_config(str(default_tiny_model_path())).training(
        engine="vllm", engine_kwargs={"kv_cache_memory_bytes": 1024**2, "max_model_len": 2048}
    )
    with pytest.raises(
        EnvRunnerStartupError, match=rf"^EnvRunner 1 failed to start: ValueError: {KV_MESSAGE}"
    ):
        config.build_algo()


@pytest.mark.slow
@pytest.mark.vllm
def test_derived_max_model_len_fits_the_kv_cache_the_model_limit_does_not():
    """The same 1 MiB KV cache that cannot hold the shipped model's 2048 positions serves prompts of up to 64
    tokens and 16-token responses once max_model_len comes from that budget."""
    pytest.importorskip("vllm")
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.models import default_tiny_model_path

    engine = make_engine(
        "vllm",
        default_tiny_model_path(),
        kv_cache_memory_bytes=1024**2,
        budget=ServingBudget(max_new_tokens=16, max_prompt_tokens=64),
    )
    try:
        assert engine.max_model_len == 80
        assert engine.llm.llm_engine.model_config.max_model_len == 80
        (completions,) = engine.generate([[5, 6, 7]], 2, SamplingParams(max_new_tokens=16, seed=0))
        assert len(completions) == 2 and all(1 <= len(c.token_ids) <= 16 for c in completions)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_r3_train_prints_the_runners_error_not_a_library_traceback(tmp_path):
    """As a user runs it: its own Ray, Tune, a run file whose env_config value the env refuses when it is built (an
    option the env does not take is refused before Ray starts: tests/unit/test_first_hour_input.py)."""
    proc = subprocess.run(
        [
            R3,
            "train",
            str(REPO / "examples" / "tiny_arithmetic_cpu.yaml"),
            "--num-cpus",
            "2",
            "--set",
            "environment.env_config.num_queries=-5",
            "--set",
            f"run.storage_path={tmp_path}",
            "--set",
            "run.verbose=0",
        ],
        env=ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("r3 train: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(
        "r3 train: EnvRunner 1 failed to start: ValueError: num_queries must be an integer >= 1, got int -5 "
        "(traceback: "
    )
    traceback_file = errors[0].split("(traceback: ", 1)[1].rstrip(")")
    assert Path(traceback_file).is_file() and "num_queries" in Path(traceback_file).read_text()
    assert "Traceback" not in proc.stderr and "IndexError" not in proc.stderr + proc.stdout
    assert "error=EnvRunner 1 failed to start: ValueError" in proc.stdout
