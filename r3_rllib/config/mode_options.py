"""Options that only one mode reads, refused at a value other than their default while that mode is off.

An option of a mode (``max_num_gen_batches`` of dynamic sampling, ``cispo_clip_low`` of the 'cispo' loss,
``distill_coef`` of distillation, ...) set while its mode is off would be accepted and change nothing. :func:`mode_options_are_read`
names every such option, what turns its mode on and the option's default. A value equal to the default passes (a
config cannot tell it from one left alone), so a preset, a run file or a saved config that spells defaults out
still validates, as :func:`~r3_rllib.config.rules.distill_settings_need_a_teacher` decides for
``distill_task_reward``.

Two tables:

- :data:`SWITCHED_OPTIONS`: a switch (``dynamic_sampling``, ``lora_rank > 0``, ``distill_teacher``, ...) and the options read
  only while it is on.
- :data:`REGISTRY_OPTIONS`: options a policy loss or an advantage estimator reads through its registration
  (``config_params``): read when the chosen entry declares them, so a loss or estimator of one's own that reads
  ``gspo_clip_low`` or ``hgpo_alpha`` keeps them.

Left out on purpose, decided elsewhere:

- ``adv_std_ddof``: :func:`~r3_rllib.config.rules.ddof_only_for_grpo` accepts GRPO's preset (ddof 1) with another
  estimator swapped in when that estimator divides by no std.
- ``dynamic_sampling_max_rounds``: a config saved with this older spelling loads with dynamic sampling off
  (:func:`~r3_rllib.config.rules.refill_rounds_agree_with_gen_batches`).
- ``distill_task_reward``, ``ranking_source``, ``log_samples``, ``rollout_rs_threshold*``, ``rollout_is``: one
  rule each in :mod:`r3_rllib.config.rules`.
- Options the env's rollout kind reads (``max_episode_steps``, ``max_tool_turns``, ``max_trajectory_tokens``,
  ``step_gamma``, the agent and gateway settings): the kind is a property of the built env
  (``rollout.kinds.kind_for_env`` matches the instance, and a factory or an adapter may build either kind), so a
  config cannot tell. The EnvRunner refuses the first three on an env of another kind when it has built the env
  (``RolloutKind.check_config``), and the others likewise: ``step_gamma`` on an env that is neither multi-step nor
  agent, the agent and gateway settings on an env that is not an agent env.
- R^3's parts' options (``replay_*``, ``reflection_*``, ``ranking_*``): the three parts are ablation switches. An
  ablation turns one part off and keeps every other setting, and a method comparison holds one R^3 schedule for all
  its arms (bench/bench_learning.py gives its GRPO, DAPO and R^3-without-a-part arms the same ``*_start_epoch`` and
  reflection template), so a part's options are accepted while it is off.
- ``eval_env_config``, ``eval_num_queries``: also read by ``R3.evaluate_heldout()``, which a run may call with
  ``eval_interval`` 0.
- The PPO clip (``clip_low``, ``clip_high``, ``clip_ratio_c``), which only 'clipped_pg' reads: GRPO's and DAPO's
  presets set them, and a loss swapped in on top of a preset keeps them (bench/bench_learning.py's 'gspo' and
  'cispo' arms), as ``ddof_only_for_grpo`` accepts for the estimator.
- ``is_cap``: read by the off-policy correction, rejection's default band, R^2PO's stage B and distillation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from r3_rllib.config.settings import default_values
from r3_rllib.core.advantages import ADVANTAGE_FNS, uses_critic
from r3_rllib.core.losses import LOSS_FNS
from r3_rllib.core.objects import is_object_path
from r3_rllib.core.registry import Registry


@dataclass(frozen=True)
class Mode:
    """A mode, the setting that turns it on, and the options read only while it is on."""

    name: str
    switch: str
    on: Callable[[Any], bool]
    options: tuple[str, ...]


#: Every switched mode and its options.
SWITCHED_OPTIONS: tuple[Mode, ...] = (
    Mode("the KL penalty", "kl_coef > 0", lambda c: c.kl_coef > 0, ("kl_type",)),
    Mode(
        "the learning rate's decay",
        "lr_scheduler_type 'cosine' or 'linear'",
        lambda c: c.lr_scheduler_type != "constant",
        ("min_lr_ratio",),
    ),
    Mode(
        "the reference's sync",
        "sync_ref_model=True",
        lambda c: bool(c.sync_ref_model),
        ("ref_model_mixup_alpha", "ref_model_sync_steps"),
    ),
    Mode(
        "dynamic sampling",
        "dynamic_sampling=True",
        lambda c: bool(c.dynamic_sampling),
        ("max_num_gen_batches", "dynamic_sampling_shortfall", "dynamic_sampling_metric"),
    ),
    Mode(
        "the overlong penalty",
        "overlong_shaping=True",
        lambda c: bool(c.overlong_shaping),
        ("overlong_buffer_len", "overlong_penalty_factor"),
    ),
    Mode(
        "the KL penalty in the reward",
        "use_kl_in_reward=True",
        lambda c: bool(c.use_kl_in_reward),
        ("kl_penalty", "kl_ctrl_type", "kl_ctrl_coef"),
    ),
    Mode(
        "the adaptive KL controller",
        "use_kl_in_reward=True and kl_ctrl_type='adaptive'",
        lambda c: bool(c.use_kl_in_reward) and c.kl_ctrl_type == "adaptive",
        ("kl_ctrl_target_kl", "kl_ctrl_horizon"),
    ),
    Mode(
        "LoRA",
        "lora_rank > 0",
        lambda c: c.lora_rank > 0,
        ("lora_alpha", "lora_dropout", "lora_target_modules"),
    ),
    Mode(
        "reward models",
        "reward_models=[...]",
        lambda c: bool(c.reward_models),
        (
            "env_reward_weight",
            "reward_workers",
            "reward_timeout_s",
            "reward_num_cpus_per_worker",
            "reward_num_gpus_per_worker",
        ),
    ),
    Mode(
        "R^2PO",
        "rollout_head=True",
        lambda c: bool(c.rollout_head),
        (
            "rollout_head_head_iters",
            "rollout_head_base_iters",
            "rollout_head_first_stage",
            "rollout_head_advantage",
            "rollout_head_rarity_count",
            "rollout_head_skip_range",
            "rollout_head_init_std",
            "rollout_head_lr",
            "rollout_head_kl_coef",
            "rollout_head_kl_target",
            "rollout_head_kl_agg_mode",
            "rollout_head_kl_clamp",
            "rollout_head_stage_b_weight",
            "rollout_head_eval_with_head",
        ),
    ),
    Mode(
        "distillation",
        "distill_teacher",
        lambda c: bool(c.distill_teacher),
        (
            "distill_mode",
            "distill_coef",
            "distill_workers",
            "distill_num_cpus_per_worker",
            "distill_num_gpus_per_worker",
            "distill_timeout_s",
        ),
    ),
    Mode(
        "sample records",
        "sample_log_fraction > 0",
        lambda c: c.sample_log_fraction > 0,
        ("sample_log_max_groups", "sample_log_dir"),
    ),
    Mode(
        "the health checks",
        "health_checks=True",
        lambda c: bool(c.health_checks),
        (
            "health_entropy_min",
            "health_entropy_drop",
            "health_mismatch_k3_max",
            "health_is_weight_max",
            "health_zero_adv_frac_max",
            "health_zero_adv_iterations",
            "health_length_growth",
            "health_truncated_frac_max",
            "health_reward_rise",
            "health_accuracy_rise_max",
            "health_window",
            "health_baseline_iterations",
            "health_stop_on_nonfinite",
        ),
    ),
    Mode("the progress line", "progress=True", lambda c: bool(c.progress), ("progress_total_iterations",)),
    # R3.evaluate_heldout() takes its samples as an argument: only the run's own evaluations read eval_samples.
    Mode(
        "the critic",
        "advantage_estimator='gae'",
        lambda c: uses_critic(c.advantage_estimator),
        (
            "gae_lambda",
            "critic_model_path",
            "critic_lr",
            "critic_weight_decay",
            "critic_grad_clip",
            "cliprange_value",
            "critic_warmup",
            "critic_lora_rank",
            "critic_lora_alpha",
        ),
    ),
    Mode(
        "a discount of token returns",
        "advantage_estimator='gae' or 'reinforce_plus_plus'",
        lambda c: uses_critic(c.advantage_estimator) or c.advantage_estimator == "reinforce_plus_plus",
        ("gae_gamma",),
    ),
    Mode(
        "the critic's adapter",
        "critic_lora_rank > 0",
        lambda c: bool(c.critic_lora_rank),
        ("critic_lora_alpha",),
    ),
    Mode(
        "the run's evaluations",
        "eval_interval > 0 or eval_before_train=True",
        lambda c: c.eval_interval > 0 or bool(c.eval_before_train),
        ("eval_samples",),
    ),
)

#: The field naming the entry -> (its registry, the options read only by the entries that declare them).
REGISTRY_OPTIONS: dict[str, tuple[Registry, tuple[str, ...]]] = {
    "policy_loss": (
        LOSS_FNS,
        (
            "gspo_clip_low",
            "gspo_clip_high",
            "cispo_clip_high",
            "cispo_clip_low",
            "sapo_tau_pos",
            "sapo_tau_neg",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
            "kl_cov_ratio",
            "kl_cov_coef",
            "clip_cov_ratio",
            "clip_cov_lb",
            "clip_cov_ub",
        ),
    ),
    "advantage_estimator": (
        ADVANTAGE_FNS,
        (
            "hgpo_setting",
            "hgpo_history_length",
            "hgpo_alpha",
            "hgpo_mode",
            "hgpo_base_group",
            "hgpo_base_stats",
            "adv_alpha",
            "adv_lambda",
            "adv_eps",
        ),
    ),
}

_DEFAULTS = default_values()


def _changed(config: Any, options: Iterable[str]) -> list[str]:
    """The ``options`` whose value in ``config`` is not their default."""
    return [name for name in options if getattr(config, name) != _DEFAULTS[name]]


def _listing(config: Any, names: list[str]) -> tuple[str, str]:
    """``name=value, ...`` of ``names`` in ``config``, and ``name=default, ...``."""
    given = ", ".join(f"{name}={getattr(config, name)!r}" for name in names)
    defaults = ", ".join(f"{name}={_DEFAULTS[name]!r}" for name in names)
    return given, defaults


def switched_option_errors(config: Any) -> list[str]:
    """One message per mode that is off while some of its options differ from their defaults."""
    errors = []
    for mode in SWITCHED_OPTIONS:
        changed = _changed(config, mode.options)
        if not changed or mode.on(config):
            continue
        given, defaults = _listing(config, changed)
        one = len(changed) == 1
        applies, they, them = (
            ("applies", "it", "it at its default") if one else ("apply", "they", "them at their defaults")
        )
        errors.append(
            f"{given} only {applies} with {mode.name} ({mode.switch}), which is off, so {they} would be ignored: "
            f"set {mode.switch} or leave {them} ({defaults})"
        )
    return errors


def fields_read(registry: Registry, name: Any) -> set[str] | None:
    """The config fields entry ``name`` of ``registry`` reads (its per-group and batch-step parameters); None when
    ``name`` names no entry (its field's own rule names the problem)."""
    try:
        if not isinstance(name, str) or registry.lookup(name) is None:
            return None
    except (ImportError, TypeError, ValueError):
        return None
    return {
        *registry.config_params.get(name, {}).values(),
        *registry.batch_config_params.get(name, {}).values(),
    }


def _readers(registry: Registry, option: str) -> list[str]:
    """The registered names (paths left out) whose entries read ``option``."""
    return sorted(
        name
        for name in registry.config_params
        if not is_object_path(name)
        and not name.startswith("_")
        and option in (fields_read(registry, name) or ())
    )


def registry_option_errors(config: Any) -> list[str]:
    """One message per loss or estimator option set to a value other than its default that the chosen entry does
    not read (with R^2PO on, stage A's estimator ``rollout_head_advantage`` reads estimator options too)."""
    errors = []
    for field, (registry, options) in REGISTRY_OPTIONS.items():
        read = fields_read(registry, getattr(config, field))
        if read is None:
            continue
        if field == "advantage_estimator" and config.rollout_head:
            read |= fields_read(registry, config.rollout_head_advantage) or set()
        for option in _changed(config, options):
            if option in read:
                continue
            readers = " or ".join(repr(n) for n in _readers(registry, option)) or "no registered entry"
            errors.append(
                f"{option}={getattr(config, option)!r} is read by {field} {readers} only, and {field} is "
                f"{getattr(config, field)!r}, so it would be ignored: set {field} to one that reads it or leave it "
                f"at its default ({_DEFAULTS[option]!r})"
            )
    return errors


def mode_options_are_read(config: Any) -> str | None:
    """Every option of a mode that is off (:data:`SWITCHED_OPTIONS`) or of a loss or estimator not chosen
    (:data:`REGISTRY_OPTIONS`) keeps its default: set, it would be accepted and silently ignored."""
    return "; ".join(switched_option_errors(config) + registry_option_errors(config)) or None
