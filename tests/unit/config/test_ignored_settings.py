"""Settings that were accepted and silently ignored are refused, naming the setting and what to set instead: fsdp=True
with one learner, max_episode_steps on an env that is not multi-step, more minibatches than a batch has samples,
and a mode's options set while the mode is off (r3_rllib/config/mode_options.py)."""

from __future__ import annotations

import dataclasses

import pytest

from r3_rllib.algorithms.r3.config import R3Config
from r3_rllib.config import R3Settings, default_values
from r3_rllib.config.mode_options import REGISTRY_OPTIONS, SWITCHED_OPTIONS
from r3_rllib.config.presets import recipe_values
from r3_rllib.core.batching import minibatch_plan
from r3_rllib.core.losses import LOSS_FNS, register_loss
from r3_rllib.envs import make_text_env
from r3_rllib.rollout.kinds import kind_for_env
from r3_rllib.rollout.kinds.agent import AgentKind
from r3_rllib.rollout.kinds.multi_step import MultiStepKind
from r3_rllib.rollout.kinds.tool_use import ToolUseKind


def _errors(config: R3Config) -> str:
    with pytest.raises(ValueError) as error:
        config.validate()
    return str(error.value)


# --- fsdp=True with one learner ------------------------------------------------------------------------------------


@pytest.mark.parametrize("learners", [0, 1])
def test_fsdp_true_with_one_learner_is_refused_naming_what_to_set(learners):
    message = _errors(R3Config().learners(num_learners=learners).training(fsdp=True))
    assert f"fsdp=True shards the policy across learners, but num_learners={learners}" in message
    assert "set num_learners >= 2" in message and "leave fsdp at None" in message


def test_fsdp_with_several_learners_or_left_unset_validates():
    R3Config().learners(num_learners=2).training(fsdp=True).validate()
    for learners in (0, 1):
        for fsdp in (None, False):
            R3Config().learners(num_learners=learners).training(fsdp=fsdp).validate()


# --- max_episode_steps on an env that is not multi-step ------------------------------------------------------------


def _runner_check(config: R3Config, env) -> None:
    """What an EnvRunner does once it has built its env (algorithms/r3/env_runner.py)."""
    kind_for_env(env).check_config(config, default_values())


def test_max_episode_steps_on_a_single_step_env_is_refused_when_the_runner_builds_it():
    config = R3Config().environment("arithmetic").training(max_episode_steps=5)
    # The env's kind is a property of the built env, so the config's own checks accept it ...
    config.validate()
    # ... and the runner refuses it as it builds the env, before the engine loads.
    with pytest.raises(ValueError, match="max_episode_steps=5 caps the episodes of multi-step envs") as error:
        _runner_check(config, make_text_env("arithmetic", num_queries=2))
    assert "env 'arithmetic' is single-step" in str(error.value) and "leave max_episode_steps at None" in str(
        error.value
    )
    _runner_check(R3Config().environment("arithmetic"), make_text_env("arithmetic", num_queries=2))


def test_max_episode_steps_is_refused_by_the_tool_and_agent_kinds_and_kept_by_the_multi_step_kind():
    defaults = default_values()
    capped = R3Config().environment("python_tool").training(max_episode_steps=3)
    with pytest.raises(ValueError, match="env 'python_tool' is a multi-turn tool env"):
        ToolUseKind().check_config(capped, defaults)
    with pytest.raises(ValueError, match="env 'agent' is an agent env"):
        AgentKind().check_config(capped.copy(copy_frozen=False).environment("agent"), defaults)
    multi_step = R3Config().environment("gridworld").training(advantage_estimator="hgpo", max_episode_steps=3)
    MultiStepKind().check_config(multi_step, defaults)
    _runner_check(multi_step, make_text_env("gridworld", num_queries=2))


@pytest.mark.parametrize(
    "setting, value",
    [("agent_episode_timeout_s", 30.0), ("gateway_host", "10.0.0.5"), ("gateway_max_batch_wait_s", 1.0)],
)
def test_agent_settings_are_refused_by_every_kind_but_the_agent_one(setting, value):
    """The gateway and the agent programs' timeout exist for agent envs only; elsewhere they were read by nothing."""
    defaults = default_values()
    config = R3Config().environment("arithmetic").training(**{setting: value})
    with pytest.raises(
        ValueError, match=rf"{setting}=.* only applies to agent envs .*env 'arithmetic' is single-step"
    ):
        _runner_check(config, make_text_env("arithmetic", num_queries=2))
    with pytest.raises(ValueError, match="env 'python_tool' is a multi-turn tool env"):
        ToolUseKind().check_config(config.copy(copy_frozen=False).environment("python_tool"), defaults)
    multi_step = config.copy(copy_frozen=False).environment("gridworld").training(advantage_estimator="hgpo")
    with pytest.raises(ValueError, match="env 'gridworld' is multi-step"):
        MultiStepKind().check_config(multi_step, defaults)
    AgentKind().check_config(config.copy(copy_frozen=False).environment("agent"), defaults)


def test_step_gamma_is_refused_where_no_episode_is_discounted():
    defaults = default_values()
    config = R3Config().environment("arithmetic").training(step_gamma=0.5)
    with pytest.raises(
        ValueError, match=r"step_gamma=0.5 only applies to multi-step and agent envs .*single-step"
    ):
        _runner_check(config, make_text_env("arithmetic", num_queries=2))
    with pytest.raises(ValueError, match="env 'python_tool' is a multi-turn tool env"):
        ToolUseKind().check_config(config.copy(copy_frozen=False).environment("python_tool"), defaults)
    AgentKind().check_config(config.copy(copy_frozen=False).environment("agent"), defaults)
    multi_step = config.copy(copy_frozen=False).environment("gridworld").training(advantage_estimator="hgpo")
    _runner_check(multi_step, make_text_env("gridworld", num_queries=2))


def test_the_invalid_action_penalty_is_refused_where_no_step_reports_an_invalid_action():
    defaults = default_values()
    config = R3Config().environment("arithmetic").training(invalid_action_penalty=0.25)
    with pytest.raises(
        ValueError, match=r"invalid_action_penalty=0.25 only applies to multi-step envs .*single-step"
    ):
        _runner_check(config, make_text_env("arithmetic", num_queries=2))
    with pytest.raises(ValueError, match="env 'python_tool' is a multi-turn tool env"):
        ToolUseKind().check_config(config.copy(copy_frozen=False).environment("python_tool"), defaults)
    with pytest.raises(ValueError, match="env 'agent' is an agent env"):
        AgentKind().check_config(config.copy(copy_frozen=False).environment("agent"), defaults)
    multi_step = config.copy(copy_frozen=False).environment("gridworld").training(advantage_estimator="hgpo")
    _runner_check(multi_step, make_text_env("gridworld", num_queries=2))


# --- num_minibatches larger than a batch ---------------------------------------------------------------------------


def test_more_minibatches_than_samples_is_refused():
    sizes = dict(queries_per_iteration=4, group_size=2)
    message = _errors(R3Config().training(num_minibatches=9, **sizes))
    assert "num_minibatches=9 is more than the 8 samples of a batch" in message
    assert "queries_per_iteration=4 x group_size=2" in message and "set num_minibatches <= 8" in message
    R3Config().training(num_minibatches=8, **sizes).validate()


def test_a_step_level_estimator_s_batch_is_not_counted_and_a_shrunk_batch_still_splits():
    # hgpo trains on the episodes' steps: as many as the episodes took, known once they ran.
    R3Config().training(
        advantage_estimator="hgpo", num_minibatches=9, queries_per_iteration=4, group_size=2
    ).validate()
    # A batch that shrank at run time (filtered groups) gets one minibatch per sample (core/batching.py).
    assert [len(mb) for mb in minibatch_plan(3, 8, seed=0)] == [1, 1, 1]


# --- a mode's options set while the mode is off --------------------------------------------------------------------

#: (settings, what the message says): an option of a mode that is off, or of a loss/estimator not chosen.
REFUSED = [
    ({"cispo_clip_low": 0.1}, "cispo_clip_low=0.1 is read by policy_loss 'cispo' only"),
    (
        {"cispo_clip_high": 0.3, "policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
        "policy_loss is 'gspo'",
    ),
    (
        {"gspo_clip_low": 1e-3, "policy_loss": "cispo"},
        "gspo_clip_low=0.001 is read by policy_loss 'gspo' or 'gspo_token'",
    ),
    ({"hgpo_alpha": 2.0}, "hgpo_alpha=2.0 is read by advantage_estimator 'hgpo' only"),
    ({"hgpo_setting": "gigpo", "advantage_estimator": "rloo"}, "advantage_estimator is 'rloo'"),
    ({"adv_alpha": 0.5}, "adv_alpha=0.5 is read by advantage_estimator 'mixed' only"),
    (
        {"adv_eps": 1e-3, "advantage_estimator": "rloo"},
        "adv_eps=0.001 is read by advantage_estimator 'grpo' or 'grpo_passk' or 'hgpo'",
    ),
    ({"distill_coef": 0.5}, "distill_coef=0.5 only applies with distillation (distill_teacher)"),
    (
        {"distill_mode": "loss", "distill_workers": 2},
        "distill_mode='loss', distill_workers=2 only apply with distillation",
    ),
    ({"kl_type": "k1"}, "kl_type='k1' only applies with the KL penalty (kl_coef > 0)"),
    (
        {"max_num_gen_batches": 4},
        "max_num_gen_batches=4 only applies with dynamic sampling (dynamic_sampling=True)",
    ),
    ({"overlong_penalty_factor": 0.5}, "only applies with the overlong penalty (overlong_shaping=True)"),
    ({"lora_alpha": 32.0}, "lora_alpha=32.0 only applies with LoRA (lora_rank > 0)"),
    ({"rollout_head_kl_coef": 0.1}, "rollout_head_kl_coef=0.1 only applies with R^2PO (rollout_head=True)"),
    ({"env_reward_weight": 0.5}, "env_reward_weight=0.5 only applies with reward models"),
    ({"health_checks": False, "health_window": 20}, "health_window=20 only applies with the health checks"),
    (
        {"sample_log_fraction": 0.0, "sample_log_max_groups": 4},
        "sample_log_max_groups=4 only applies with sample records",
    ),
    (
        {"progress": False, "progress_total_iterations": 20},
        "only applies with the progress line (progress=True)",
    ),
]

#: The same options with their mode on (or left at their defaults): accepted.
ACCEPTED = [
    {"cispo_clip_low": 0.1, "cispo_clip_high": 0.3, "policy_loss": "cispo"},
    {"gspo_clip_low": 1e-3, "policy_loss": "gspo_token", "loss_agg_mode": "seq-mean-token-mean"},
    {"hgpo_alpha": 2.0, "hgpo_setting": "gigpo", "advantage_estimator": "hgpo"},
    {"adv_alpha": 0.5, "advantage_estimator": "mixed"},
    {"adv_eps": 1e-3, "advantage_estimator": "hgpo"},
    {"distill_coef": 0.5, "distill_mode": "loss", "distill_teacher": "teacher"},
    {"kl_type": "k1", "kl_coef": 0.1},
    {"max_num_gen_batches": 4, "dynamic_sampling": True},
    {"overlong_penalty_factor": 0.5, "overlong_shaping": True},
    {"lora_alpha": 32.0, "lora_rank": 8},
    {"rollout_head_kl_coef": 0.1, "rollout_head": True},
    {"health_checks": False, "progress": False, "sample_log_fraction": 0.0},
    {"max_num_gen_batches": 10, "kl_type": "k3", "lora_alpha": 16.0},  # defaults spelled out
    # R^3's parts are ablation switches: their options stay accepted while a part is off.
    {"replay_k": 4, "reflection_tau": 0.5, "ranking_start_epoch": 0},
    # GRPO's preset (sample std, symmetric clip) with another estimator or loss swapped in.
    {**recipe_values("grpo"), "advantage_estimator": "rloo"},
    {**recipe_values("grpo"), "policy_loss": "cispo"},
]


@pytest.mark.parametrize(("settings", "says"), REFUSED, ids=[", ".join(s) for s, _ in REFUSED])
def test_an_option_of_a_mode_that_is_off_is_refused(settings, says):
    message = _errors(R3Config().training(**settings))
    assert says in message and "would be ignored" in message


@pytest.mark.parametrize("settings", ACCEPTED, ids=[", ".join(s) for s in ACCEPTED])
def test_an_option_of_a_mode_that_is_on_is_accepted(settings):
    R3Config().training(**settings).validate()


def test_the_presets_and_the_feature_defaults_validate():
    for preset in (R3Config.grpo_preset, R3Config.dapo_preset, R3Config.r3_preset):
        preset().validate()
    R3Config().training(policy_loss="cispo", **recipe_values("cispo")).validate()
    R3Config().training(rollout_head=True, **recipe_values("r2po")).validate()
    R3Config.r3_preset().training(rollout_head=True).validate()


def test_a_loss_of_one_s_own_keeps_the_options_it_declares():
    name = "test_ignored_settings_loss"
    register_loss(name, config_params={"clip_high": "cispo_clip_high"})(lambda *a, **k: None)
    try:
        R3Config().training(policy_loss=name, cispo_clip_high=0.3).validate()
        assert "policy_loss is 'test_ignored_settings_loss'" in _errors(
            R3Config().training(policy_loss=name, cispo_clip_low=0.1)
        )
    finally:
        LOSS_FNS.pop(name)


def test_every_option_of_a_mode_family_is_in_a_table_or_decided_elsewhere():
    """A new ``distill_*``, ``health_*``, ``rollout_head_*``, ``lora_*`` or ``hgpo_*`` field, or one named after a
    registered policy loss (``gspo_*``, ``cispo_*``, ``sapo_*``, ``kl_cov_*``, ...), is a mode's option: it must
    join its table (or be exempted here, with its reason in mode_options.py)."""
    tabled = {o for mode in SWITCHED_OPTIONS for o in mode.options}
    tabled |= {o for _, options in REGISTRY_OPTIONS.values() for o in options}
    switches = {"distill_teacher", "distill_task_reward", "health_checks", "rollout_head", "lora_rank"}
    losses = tuple(f"{name}_" for name in LOSS_FNS.names())
    families = ("distill_", "health_", "rollout_head_", "lora_", "hgpo_", "gspo_", "cispo_", *losses)
    fields = {f.name for f in dataclasses.fields(R3Settings)}
    untabled = {f for f in fields if f.startswith(families) and f not in tabled | switches}
    assert untabled == set()
    assert tabled <= fields


def test_the_message_agrees_in_number_with_the_settings_it_names():
    """One changed setting "applies" and is left "at its default"; two "apply" and are left "at their defaults"."""
    from r3_rllib.rollout.kinds.base import refuse_tool_settings

    defaults = default_values()
    one = R3Config().environment("arithmetic").training(max_tool_turns=6)
    with pytest.raises(
        ValueError, match=r"max_tool_turns=6 only applies to .*so it would be ignored: leave it at its"
    ):
        refuse_tool_settings(one, defaults)
    both = one.copy(copy_frozen=False).training(max_trajectory_tokens=512)
    with pytest.raises(
        ValueError,
        match=r"max_tool_turns=6, max_trajectory_tokens=512 only apply to .*env 'arithmetic' is not one, so they "
        r"would be ignored: leave them at their defaults",
    ):
        refuse_tool_settings(both, defaults)


def test_eval_samples_without_an_evaluation_of_the_run_is_refused():
    """eval_samples is read by the run's evaluations alone (R3.evaluate_heldout takes its samples as an argument):
    with neither eval_interval nor eval_before_train it would be ignored."""
    with pytest.raises(ValueError, match=r"eval_samples=4 only applies with the run's evaluations"):
        R3Config().training(eval_samples=4).validate()
    R3Config().training(eval_samples=4, eval_interval=5).validate()
    R3Config().training(eval_samples=4, eval_before_train=True).validate()
