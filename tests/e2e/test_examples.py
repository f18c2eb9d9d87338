"""The examples: the GPU run files load into the configs they describe (offline), the custom env keeps the TextEnv
contract, and the Tune sweep and custom-env scripts run end to end in their quick modes."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys

import pytest
from numeric import f64_tol
from repo_paths import REPO

EXAMPLES = REPO / "examples"
R3_YAML = EXAMPLES / "deepscaler_r1_distill_1p5b.yaml"
GRPO_YAML = EXAMPLES / "grpo_baseline_r1_distill_1p5b.yaml"
R3_SWITCHES = ("replay", "reflection", "ranking")


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def custom_env_module(monkeypatch):
    """The custom-env example, imported with the registry restored afterwards (importing it registers its env)."""
    from r3_rllib.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())
    module = _load_example("custom_text_env")
    assert registry.get_text_env_factory("digit_sort") is module.DigitSortEnv
    return module


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the Hugging Face hub (models, tokenizers, datasets) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"the run-file loader touched the hub: {args[:1]}")

    import datasets
    import huggingface_hub
    import transformers

    for module, names in (
        (huggingface_hub, ("snapshot_download", "hf_hub_download")),
        (datasets, ("load_dataset",)),
    ):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


# -- the DeepScaleR-setting run files ------------------------------------------------------------------------------
def test_deepscaler_run_file_builds_the_paper_setting(no_hub):
    from r3_rllib.train_config import load_run_file

    spec = load_run_file(R3_YAML)
    c = spec.config
    assert c.model_path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert c.env == "math"
    assert c.env_config["data"] == "agentica-org/DeepScaleR-Preview-Dataset"
    assert c.env_config["max_prompt_tokens"] == 1024
    assert c.env_config["length_bonus_max_tokens"] == 8192
    # vLLM on one GPU per runner, not colocated with a learner, so no sleep mode
    assert c.engine == "vllm"
    assert c.engine_kwargs["enable_sleep_mode"] is False and c.sleep_between_rollouts is False
    assert 0.5 <= c.engine_kwargs["gpu_memory_utilization"] <= 0.95
    assert c.engine_kwargs["max_model_len"] >= 1024 + 8192
    assert c.num_gpus_per_env_runner == 1
    # FSDP learners, one GPU each
    assert 4 <= c.num_learners <= 8
    assert c.num_gpus_per_learner == 1
    assert c.use_fsdp
    # a sequence at the length limit fits one learner pass; shorter ones share passes up to the same size
    assert c.micro_batch_max_tokens == c.engine_kwargs["max_model_len"]
    assert not c.learner_entropy
    assert c.rollout_timeout_s == 3600
    # DeepScaleR's published 8k-stage values
    assert c.group_size == 8
    assert c.queries_per_iteration == 128
    assert c.max_new_tokens == 8192
    assert c.lr == 1e-6
    assert c.temperature == 0.6
    assert c.kl_coef == 0.001 and c.kl_type == "k3"
    assert c.num_minibatches == 2 and c.num_epochs == 1
    assert c.gradient_checkpointing
    # R^3: all three parts, mixed-group advantages
    assert all(getattr(c, s) for s in R3_SWITCHES)
    assert c.advantage_estimator == "mixed"
    assert c.ranking_r_max < 1.0
    assert c.eval_interval > 0 and c.eval_env_config["split"] == "test"
    assert spec.stop == {"training_iteration": 1040}
    assert spec.run["name"] == "deepscaler_r1_distill_1p5b_r3"


def test_grpo_baseline_is_the_same_setting_with_r3_off(no_hub):
    from r3_rllib.config import R3_FIELDS
    from r3_rllib.train_config import load_run_file

    r3, grpo = load_run_file(R3_YAML), load_run_file(GRPO_YAML)
    assert not any(getattr(grpo.config, s) for s in R3_SWITCHES)
    assert grpo.config.advantage_estimator == "grpo"
    # Everything outside R^3's own settings is identical: model, data, rewards, sizes, optimiser, resources.
    r3_only = {f for f in R3_FIELDS if f.startswith(("replay", "reflection", "ranking", "adv_"))}
    r3_only |= {"advantage_estimator"}
    a, b = r3.config.to_dict(), grpo.config.to_dict()
    differing = {k for k in a.keys() | b.keys() if k not in r3_only and a.get(k) != b.get(k)}
    assert differing == set()
    assert r3.stop == grpo.stop
    assert {k: v for k, v in r3.run.items() if k != "name"} == {
        k: v for k, v in grpo.run.items() if k != "name"
    }
    assert r3.run["name"] != grpo.run["name"]


@pytest.mark.parametrize("path", [R3_YAML, GRPO_YAML], ids=lambda p: p.stem)
def test_env_config_keys_are_math_env_parameters(path, no_hub):
    """The loader does not build the env, so a misspelled env_config key would only fail on the GPU cluster."""
    from r3_rllib.envs.math_env import MathEnv
    from r3_rllib.train_config import load_run_file

    c = load_run_file(path).config
    params = set(inspect.signature(MathEnv.__init__).parameters) - {"self"}
    assert set(c.env_config) <= params
    assert set(c.eval_env_config) <= params


# -- the custom env (no Ray) ---------------------------------------------------------------------------------------
def test_digit_sort_env_contract_and_shaped_reward(custom_env_module):
    env_module = custom_env_module
    env = env_module.DigitSortEnv(length=3, num_queries=50, seed=0)
    prompt, info = env.reset()
    assert prompt == prompt[:-1] + "<" and info["query_id"] == f"sort:{prompt[:-1]}"
    assert info["gold"] == "".join(sorted(prompt[:-1]))

    # A query with three distinct digits, e.g. "531" (gold "135"): exact -> 1; "13<eos>" -> 0.5 * 2/3 (two
    # positions right, longer length 3); "1350" -> 0.5 * 3/4; "531" -> 0.5 * 1/3 (the middle digit); "x" -> 0.
    query = next(q for q in env.queries if len(set(q)) == 3)
    qid = f"sort:{query}"
    gold = "".join(sorted(query))
    cases = {
        gold + "<eos>": 1.0,
        gold[:2] + "<eos>": 0.5 * 2 / 3,
        gold + "0": 0.5 * 3 / 4,
        gold[::-1]: 0.5 / 3,
        "x": 0,
    }
    for response, expected in cases.items():
        obs, info = env.reset(options={"query_id": qid})
        assert obs == query + "<" and info["query_id"] == qid
        _, reward, terminated, truncated, step_info = env.step(response)
        # By hand: a product and a quotient of small numbers in float64, each within an ulp of 1 (a wrong count of
        # matching positions moves the reward by 0.5 / 4 or more).
        assert reward == pytest.approx(expected, rel=0, abs=f64_tol(1.0, ulps=4)), response
        assert terminated and not truncated
        assert step_info["correct"] is (expected == 1.0)

    # user_content replaces the prompt; the answer stays the query's
    obs, info = env.reset(options={"query_id": qid, "user_content": f"{query}?{query}<"})
    assert obs == f"{query}?{query}<" and info["query_text"] == query + "<"
    assert env.step(gold)[1] == 1.0


def test_digit_sort_env_splits_epochs_and_state(custom_env_module):
    env_module = custom_env_module
    train = env_module.DigitSortEnv(length=2, num_queries=45, seed=3)
    test = env_module.DigitSortEnv(length=2, num_queries=45, split="test")
    assert len(train) == len(test) == 45
    assert not set(train.queries) & set(test.queries)
    seen = [train.reset()[1]["query_id"] for _ in range(45)]
    assert len(set(seen)) == 45 and train.epoch == 0
    train.reset()
    assert train.epoch == 1
    state = train.state()
    nxt = [train.reset()[1]["query_id"] for _ in range(3)]
    train.set_state(state)
    assert [train.reset()[1]["query_id"] for _ in range(3)] == nxt
    with pytest.raises(ValueError, match="num_queries"):
        env_module.DigitSortEnv(length=2, num_queries=60)
    with pytest.raises(KeyError, match="sort:xx"):
        train.reset(options={"query_id": "sort:xx"})


# -- scripts end to end --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_tune_sweep_quick(ray_session, tiny_random_model, tmp_path, capsys):
    sweep = _load_example("tune_sweep")
    rc = sweep.main(["--quick", "--storage", str(tmp_path), "--model", tiny_random_model])
    out = capsys.readouterr().out
    assert rc == 0, out
    trials = [line for line in out.splitlines() if line.startswith("trial ")]
    assert len(trials) == 2
    assert {"replay_k=1", "replay_k=2"} <= {w for line in trials for w in line.split()}
    assert all("iterations=1" in line and "error=None" in line for line in trials)
    assert "best: replay_k=" in out
    assert (tmp_path / "r3_sweep").is_dir()


@pytest.mark.slow
def test_custom_text_env_quick_trains_and_reports_rewards(tmp_path):
    """Runs as a user would: its own Ray, the env registered in the driver only."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_text_env.py"), "--quick", "--num-cpus", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Runners and the replay actor restart after a crash, and get no constructor argument in the object store
    # (runner_group.py): Ray's core worker logs that as an error, once per process, and this is a fresh one.
    assert "constructor arguments in the object store" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("iter ")]
    assert [int(words[1]) for words in lines] == [1, 2]
    for words in lines:
        reward = float(words[words.index("reward") + 1])
        assert 0.0 <= reward <= 1.0
