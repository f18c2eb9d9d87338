"""The rules that relate two or more fields of a config, one named function each, and the check that runs them all.

A rule takes the config (any object with the :class:`~r3_rllib.config.settings.R3Settings` fields and RLlib's
``num_env_runners``) and returns the message of what is wrong, or None. Single-field rules (choices, ranges) are
not here: they are declared beside their fields and checked by :func:`~r3_rllib.config.field.field_errors`. A rule
reading a field that may itself be invalid (an unknown estimator name) returns None for it: the field's own rule
names the problem.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from r3_rllib.config.field import Rule, field_errors, field_rule, rules_errors
from r3_rllib.config.mode_options import mode_options_are_read
from r3_rllib.config.settings import RLLIB_FIELD_RULES, R3Settings
from r3_rllib.core.advantages import (
    ADVANTAGE_FNS,
    GROUPLESS_ESTIMATORS,
    is_step_level,
    learners_compute_token_advantages,
    needs_greedy_baseline,
    uses_critic,
)
from r3_rllib.core.losses import GSPO_AGG_MODES, LOSS_FNS, TOKEN_ADVANTAGE_LOSSES
from r3_rllib.core.objects import ObjectPathError, is_object_path
from r3_rllib.core.reflection import build_reflection_prompt
from r3_rllib.core.schedules import schedule_error, warmup_updates
from r3_rllib.core.typo_hints import closest_name
from r3_rllib.engines.options import engine_kwargs_error
from r3_rllib.engines.registry import EngineCapabilities, engine_capabilities, engines_where
from r3_rllib.reward_models.specs import RewardModelsError, parse_reward_models

#: A cross-field rule: the config -> the message of what is wrong, or None.
ConfigRule = Callable[[Any], "str | None"]

_R3_PARTS = ("replay", "reflection", "ranking")


def queries_cover_runners(config: Any) -> str | None:
    """Every EnvRunner gets at least one query per iteration."""
    if config.queries_per_iteration < max(1, config.num_env_runners):
        return "queries_per_iteration must be >= num_env_runners"
    return None


def overlong_buffer_fits_responses(config: Any) -> str | None:
    """DAPO's penalised buffer lies inside the response budget."""
    length = config.overlong_buffer_len
    if length is not None and not 1 <= length <= config.max_new_tokens:
        return f"overlong_buffer_len must be in [1, max_new_tokens={config.max_new_tokens}] or None, got {length}"
    return None


def fsdp_needs_several_learners(config: Any) -> str | None:
    """``fsdp=True`` shards the policy over the learners; with one learner (``num_learners`` 0 or 1) it would
    change nothing: that learner holds the whole policy and its optimizer state either way. Refused rather than
    honoured by wrapping the one learner in FSDP2: FSDP2 over a world of one shards nothing, so it saves no memory
    (verl wraps a single GPU to offload parameters and optimizer state to the CPU, which this learner does not do),
    and its mixed precision is what the unsharded learner's autocast already gives (fp32 master weights, bf16
    compute). An RLlib or verl user who writes fsdp=True means "shard": the message says to add learners, or to
    leave fsdp at None, which shards as soon as there are two."""
    learners = getattr(config, "num_learners", None)  # RLlib's field: an R3Settings alone has none
    if config.fsdp is None or not config.fsdp or not isinstance(learners, int) or learners > 1:
        return None
    return (
        f"fsdp=True shards the policy across learners, but num_learners={learners} runs a single learner, which "
        "holds the whole policy (there is nothing to shard across): set num_learners >= 2 (one device each) to "
        "shard it, or leave fsdp at None (on from two learners)"
    )


def minibatches_fit_the_batch(config: Any) -> str | None:
    """``num_minibatches`` splits a batch of ``queries_per_iteration x group_size`` samples (every response or
    trajectory is at least one sample, in every rollout kind): more minibatches than that would be cut to as many
    as the batch has samples, silently. Not checked with a step-level estimator ('hgpo'): it trains on the steps
    of multi-step episodes, a count known once they ran. Batches that shrink at run time (dynamic sampling's
    'train_on_kept', a runner skipped, stale groups dropped, R^2PO's flat groups left out, a deferred ranking's
    groups kept whole) are still split into at most as many minibatches as they hold (core/batching.py)."""
    if is_step_level(config.advantage_estimator):
        return None
    samples = config.queries_per_iteration * config.group_size
    if config.num_minibatches > samples:
        return (
            f"num_minibatches={config.num_minibatches} is more than the {samples} samples of a batch "
            f"(queries_per_iteration={config.queries_per_iteration} x group_size={config.group_size}): a "
            f"minibatch needs at least one sample; set num_minibatches <= {samples}"
        )
    return None


def ddof_only_for_grpo(config: Any) -> str | None:
    """The std's degrees of freedom are a parameter of the 'grpo' estimator only; 'mixed' divides by a
    population std of its own, so a sample std asked for with it would be silently ignored. Estimators that divide
    by no group std (rloo, drgrpo, REINFORCE++, hgpo) have nothing to ignore: GRPO's preset (ddof 1, verl's) with
    one of them swapped in is accepted."""
    if config.adv_std_ddof == 1 and config.advantage_estimator == "mixed":
        return f"adv_std_ddof applies to advantage_estimator 'grpo' only ({config.advantage_estimator!r} was given)"
    return None


def gspo_needs_sequence_mean(config: Any) -> str | None:
    """GSPO's and SAPO's objectives are means over sequences (verl forces this mode for both; GSPO also takes
    'seq-mean-token-sum', LUSPO); the learner also scales micro-batches by the mode's count (sequences here), so
    the config must say it."""
    allowed = {"gspo": GSPO_AGG_MODES, "gspo_token": GSPO_AGG_MODES, "sapo": ("seq-mean-token-mean",)}
    modes = allowed.get(config.policy_loss)
    if modes is not None and config.loss_agg_mode not in modes:
        luspo = " or 'seq-mean-token-sum' (LUSPO)" if len(modes) > 1 else ""
        return (
            f"policy_loss {config.policy_loss!r} needs loss_agg_mode 'seq-mean-token-mean' (a mean over "
            f"sequences){luspo}, got {config.loss_agg_mode!r}"
        )
    return None


def vespo_weights_are_token_importance_weights(config: Any) -> str | None:
    """VESPO folds the behaviour weights into each sequence's weight as a sum of token log-weights (TRL's way): a
    sequence-level weight (the same number on every token) would enter once per token."""
    if config.policy_loss == "vespo" and config.rollout_is == "sequence":
        return (
            "policy_loss 'vespo' folds token importance weights into each sequence's weight: it needs rollout_is "
            "'token' (TRL refuses its sequence modes too), got 'sequence'"
        )
    return None


def gdpo_reads_every_objective(config: Any) -> str | None:
    """GDPO normalises the env's reward and each reward term's score apart: what changes only the composed reward
    (a gate's override, R^3's ranking reward, the overlong penalty, the KL in the reward) would be ignored, and a
    replayed sample carries no term scores."""
    if config.advantage_estimator != "gdpo":
        return None
    gates = [t.get("name") for t in config.reward_models or () if isinstance(t, dict) and t.get("gate")]
    reasons = {
        f"the gate term {gates[0]!r} overrides only the composed reward" if gates else "": bool(gates),
        "replay: a replayed sample carries no term scores": bool(config.replay),
        "ranking replaces only the composed reward": bool(config.ranking),
        "overlong_shaping changes only the composed reward": bool(config.overlong_shaping),
        "use_kl_in_reward changes only the composed reward": bool(config.use_kl_in_reward),
    }
    on = [reason for reason, is_on in reasons.items() if is_on]
    if on:
        return (
            "advantage_estimator 'gdpo' reads the env's reward and each term's score, not the composed reward "
            f"(TRL's normalize_then_sum): {on[0]}; turn it off or use 'grpo'"
        )
    return None


def replay_excludes_dynamic_sampling(config: Any) -> str | None:
    """Dynamic sampling drops exactly the all-equal groups replay acts on: together, replay would never act."""
    if config.replay and config.dynamic_sampling:
        return (
            "replay with dynamic_sampling: dynamic sampling drops the all-equal groups that replay would mix "
            "past samples into, so replay would never act; turn one of them off"
        )
    return None


def ranking_survives_dynamic_sampling(config: Any) -> str | None:
    """Ranking rewards the failures of all-wrong groups, but dynamic sampling on 'accuracy' drops every group whose
    responses are all right or all wrong before the batch is built (the driver filters, then ranks: coordinator.py,
    groups.py), so ranking would never act. On 'reward' an all-wrong group whose shaped rewards differ (the
    overlong penalty, an env's partial credit) is kept and ranked."""
    if config.ranking and config.dynamic_sampling and config.dynamic_sampling_metric == "accuracy":
        return (
            "ranking with dynamic_sampling (dynamic_sampling_metric='accuracy'): dynamic sampling drops the "
            "all-wrong groups that ranking rewards, so ranking would never act; turn one of them off, or set "
            "dynamic_sampling_metric='reward' (all-wrong groups whose rewards differ are kept and ranked)"
        )
    return None


def truncation_mask_keeps_ranking_on_the_driver(config: Any) -> str | None:
    """``mask_truncated_completions`` leaves the truncated responses out of the update after their groups' rewards
    and advantages are set; ranking whose entropies the learners compute sets the ranked failures' rewards inside the
    update (ranking_deferred.py), from the batch it is sent: without the truncated failures, every all-wrong group
    would be ranked on a part of its failures."""
    if config.mask_truncated_completions and config.ranking and ranking_entropies_from_learner(config):
        return (
            "mask_truncated_completions with ranking on the learners' entropies (ranking_entropy_source="
            f"{config.ranking_entropy_source!r}, engine {config.engine!r}): the learners rank each all-wrong group's failures inside the "
            "update, which the truncated ones would have left; set ranking_entropy_source='engine' (the ranking "
            "then uses the engine's entropies, on the driver), or turn one of them off"
        )
    return None


def clip_cov_band_is_ordered(config: Any) -> str | None:
    """Clip-Cov draws tokens whose covariance lies strictly between the two bounds: an empty band drops nothing."""
    if config.policy_loss == "clip_cov" and not config.clip_cov_lb < config.clip_cov_ub:
        return (
            f"policy_loss 'clip_cov' needs clip_cov_lb < clip_cov_ub (the covariance band its tokens are drawn "
            f"from), got {config.clip_cov_lb} and {config.clip_cov_ub}"
        )
    return None


def ref_sync_needs_a_reference_model(config: Any) -> str | None:
    """sync_ref_model moves the learner's frozen reference model: a run without one (kl_coef 0 and no
    use_kl_in_reward), with LoRA's (the
    adapter switched off: nothing to move) or with R^2PO's (its stage-A term's 'initial' target is that model too)
    would change nothing or something else."""
    if not config.sync_ref_model:
        return None
    if config.kl_coef <= 0 and not config.use_kl_in_reward:
        return (
            "sync_ref_model needs kl_coef > 0 or use_kl_in_reward: without a KL term there is no reference model "
            "to sync"
        )
    if config.lora_rank > 0:
        return (
            "sync_ref_model with lora_rank > 0: LoRA's reference is the policy with its adapter switched off, not "
            "a model of its own to move (TRL refuses it with PEFT too)"
        )
    if config.rollout_head:
        return (
            "sync_ref_model with rollout_head (R^2PO): stage A's KL target 'initial' is the same reference model, "
            "which would move with it"
        )
    return None


def task_reward_parts_need_the_task_reward(config: Any) -> str | None:
    """With ``distill_task_reward=False`` the learner zeroes the task advantages (learner_distill.py): what only
    changes them would be silently ignored. Replay and ranking change nothing else (replayed samples have no
    teacher log-probs); the overlong penalty and reward terms also shape the rewards dynamic sampling filters on
    with 'reward' and R^2PO's stage A rarity counts (its advantages are kept), and are accepted there. Reflection
    (its groups are distilled too) and dynamic sampling (it chooses the groups) still act."""
    if not getattr(config, "distill_teacher", None) or getattr(config, "distill_task_reward", True):
        return None
    on = [part for part in ("replay", "ranking") if getattr(config, part)]
    if not (config.rollout_head or (config.dynamic_sampling and config.dynamic_sampling_metric == "reward")):
        on += ["overlong_shaping"] if config.overlong_shaping else []
        on += ["reward_models"] if config.reward_models else []
    if not on:
        return None
    verb, subject, obj = ("changes", "it", "it") if len(on) == 1 else ("change", "they", "them")
    return (
        f"{', '.join(on)} with distill_task_reward=False: the task advantages are zeroed (the update trains on the "
        f"teacher's signal alone), and {'/'.join(on)} only {verb} those, so {subject} would be ignored; turn {obj} "
        "off or set distill_task_reward=True"
    )


def refill_rounds_agree_with_gen_batches(config: Any) -> str | None:
    """dynamic_sampling_max_rounds is the older spelling of max_num_gen_batches - 1 (it counted the refills, verl
    counts the batches): both set, they must say the same, else one of them would be silently ignored. Only with
    dynamic_sampling on (off, neither is read), so a config saved with the old field set still loads when it
    does not sample dynamically."""
    rounds, batches = config.dynamic_sampling_max_rounds, config.max_num_gen_batches
    if not config.dynamic_sampling or rounds is None or (batches > 0 and rounds + 1 == batches):
        return None
    limit = f"{batches} generation batches" if batches > 0 else "no limit"
    return (
        f"dynamic_sampling_max_rounds={rounds} ({rounds + 1} generation batches) contradicts "
        f"max_num_gen_batches={batches} ({limit}): max_num_gen_batches counts the generation batches, the first "
        f"included, so set max_num_gen_batches={rounds + 1} and leave dynamic_sampling_max_rounds at None"
    )


def shortfall_needs_a_batch_limit(config: Any) -> str | None:
    """With no limit on the generation batches they never run out, so 'train_on_kept' would never apply."""
    if not config.dynamic_sampling or config.dynamic_sampling_shortfall != "train_on_kept":
        return None
    if config.max_num_gen_batches <= 0:
        return (
            f"dynamic_sampling_shortfall='train_on_kept' with max_num_gen_batches={config.max_num_gen_batches} "
            "(no limit): the generation batches never run out, so there is never a short batch to train on; "
            "set max_num_gen_batches >= 1 or dynamic_sampling_shortfall='raise'"
        )
    return None


def sleep_needs_an_engine_that_sleeps(config: Any) -> str | None:
    """``sleep_between_rollouts`` frees memory only where the engine can: vLLM built with sleep mode. The HF engine
    holds nothing it could free, and vLLM without ``enable_sleep_mode`` ignores the call, so either would keep the
    GPU memory a colocated learner was promised. (An engine of another package decides for itself.)"""
    if not config.sleep_between_rollouts:
        return None
    if config.engine == "hf":
        return (
            "sleep_between_rollouts does nothing with engine 'hf' (it has no sleep mode): use engine 'vllm'"
        )
    if config.engine == "vllm" and not (config.engine_kwargs or {}).get("enable_sleep_mode"):
        return "sleep_between_rollouts with engine 'vllm' needs engine_kwargs enable_sleep_mode: true"
    return None


def overlap_needs_awake_engine(config: Any) -> str | None:
    """Overlapped generation samples while the learner trains: the engine cannot sleep between rollouts."""
    if config.overlap_generation and config.sleep_between_rollouts:
        return (
            "overlap_generation needs the engine awake while the learner trains; "
            "turn off sleep_between_rollouts (or overlap_generation)"
        )
    if (config.max_staleness or 0) >= 1 and config.sleep_between_rollouts:
        return (
            f"max_staleness={config.max_staleness} generates while the learner trains: the engine must stay awake; "
            "turn off sleep_between_rollouts (or set max_staleness=0)"
        )
    return None


def max_staleness_agrees_with_overlap(config: Any) -> str | None:
    """overlap_generation is max_staleness 1: a run may set both only when they say the same."""
    if config.max_staleness is not None and config.overlap_generation and config.max_staleness != 1:
        return (
            f"overlap_generation=True is max_staleness=1, but max_staleness={config.max_staleness}; "
            "set only max_staleness"
        )
    return None


def _capabilities(config: Any) -> EngineCapabilities | None:
    """What the config's engine can do, or None when no engine of that name is registered (the engine field's
    own rule names the problem)."""
    try:
        return engine_capabilities(config.engine)
    except ValueError:
        return None


def ranking_entropies_from_learner(config: Any) -> bool:
    """Whether the learners compute the ranking's entropies: ``ranking_entropy_source`` 'learner', or 'auto' with an
    engine whose entropies are estimates (vLLM's top-k ones). An unregistered engine counts as exact (its own rule
    names it)."""
    source = config.ranking_entropy_source
    capabilities = _capabilities(config)
    return source == "learner" or (
        source == "auto" and capabilities is not None and not capabilities.exact_entropies
    )


def partial_rollouts_need_overlap_and_a_stepping_engine(config: Any) -> str | None:
    """Partial rollouts load weights during generation: only when generation overlaps updates, on an engine that
    pauses between decoding steps (capabilities.partial_rollouts) with its core in the runner's process and, with
    LoRA, adapters merged into its weights."""
    if not config.partial_rollouts:
        return None
    if not (config.overlap_generation or (config.max_staleness or 0) >= 1):
        return "partial_rollouts needs generation to overlap updates: set max_staleness >= 1"
    caps = _capabilities(config)
    if caps is None:
        return None
    if not caps.partial_rollouts:
        stepping = engines_where(lambda c: c.partial_rollouts)
        return (
            f"partial_rollouts with engine={config.engine!r} is not supported: it does not pause between decoding "
            f"steps to load weights (engines that do: {', '.join(stepping) or 'none'})"
        )
    if caps.out_of_process and config.engine_kwargs.get("in_process") is False:
        return (
            f"partial_rollouts with engine={config.engine!r} needs the engine core in the runner's process (drop "
            "engine_kwargs['in_process']=False): a multiprocess core keeps decoding while weights load, so the "
            "tokens' versions would not be known"
        )
    several_modes = len(caps.lora_modes) > 1
    if several_modes and config.lora_rank > 0 and config.engine_kwargs.get("lora_mode") != "merge":
        return (
            f"partial_rollouts with engine={config.engine!r} and LoRA needs engine_kwargs['lora_mode']='merge': a "
            "request keeps the adapter it started with, so a newer adapter could not reach the responses in flight"
        )
    if config.rollout_head:
        return "partial_rollouts with rollout_head (R^2PO) is not supported: its sampler decodes outside the engine"
    return None


def rollout_head_needs_an_engine_with_a_head(config: Any) -> str | None:
    """R^2PO samples through the engine's rollout-head variant: the engine must declare one."""
    caps = _capabilities(config)
    if config.rollout_head and caps is not None and not caps.rollout_head:
        with_head = engines_where(lambda c: c.rollout_head)
        return (
            f"rollout_head with engine={config.engine!r}: the engine has no rollout-head variant (engines that "
            f"have one: {', '.join(with_head) or 'none'})"
        )
    return None


def lora_needs_an_engine_that_applies_adapters(config: Any) -> str | None:
    """LoRA sends the runners adapters: the engine must apply them (capabilities.lora_modes not empty)."""
    caps = _capabilities(config)
    if config.lora_rank > 0 and caps is not None and not caps.lora_modes:
        with_lora = engines_where(lambda c: bool(c.lora_modes))
        return (
            f"lora_rank={config.lora_rank} with engine={config.engine!r}: the engine applies no LoRA adapters "
            f"(engines that do: {', '.join(with_lora) or 'none'})"
        )
    return None


def prefetch_is_for_the_synchronous_loop(config: Any) -> str | None:
    """prefetch_rollout asks for the next rollout at an iteration's end: the synchronous loop's; the overlapped and
    streaming loops ask for theirs ahead already."""
    if config.prefetch_rollout and (config.overlap_generation or (config.max_staleness or 0) >= 1):
        staleness = 1 if config.max_staleness is None else config.max_staleness
        return (
            f"prefetch_rollout is for the synchronous loop, but max_staleness={staleness} already asks for "
            "rollouts ahead of the update; turn prefetch_rollout off (or set max_staleness=0)"
        )
    return None


def streaming_excludes_dynamic_sampling(config: Any) -> str | None:
    """Streaming rollouts (max_staleness >= 2) consume groups as they arrive; DAPO's dynamic sampling refills one
    batch with synchronous rounds, which would interleave with the requests in flight."""
    if (config.max_staleness or 0) >= 2 and config.dynamic_sampling:
        return (
            f"max_staleness={config.max_staleness} (streaming rollouts) with dynamic_sampling is not supported: "
            "use max_staleness <= 1 or turn off dynamic_sampling"
        )
    return None


def passk_needs_two_responses(config: Any) -> str | None:
    """Pass@k's advantage is the margin of a group's best response over its second (verl refuses a group of one)."""
    if config.advantage_estimator == "grpo_passk" and config.group_size < 2:
        return f"advantage_estimator 'grpo_passk' needs group_size >= 2 (a best and a second response), got {config.group_size}"
    return None


def greedy_baseline_is_graded_like_the_samples(config: Any) -> str | None:
    """ReMax's baseline (``remax``) is the env's reward of one greedy response per prompt, decoded by the policy's
    engine; its advantage ``R_i - b`` is verl's only while ``R_i`` is on the same scale. Refused: reward_models
    (the reward server composes the sampled responses' rewards, the greedy one keeps the env's), R^3's ranking
    (an all-wrong group's ranking rewards replace the env's), DAPO's overlong shaping (a penalty on the sampled
    responses only), R^2PO's rollout head (its sampler decodes outside the engine; a stage-A estimator scores the
    head's samples, which have no greedy response)."""
    estimator, head = config.advantage_estimator, config.rollout_head_advantage
    if needs_greedy_baseline(head):
        return (
            f"rollout_head_advantage {head!r}: R^2PO's stage A has no greedy response to take a baseline from"
        )
    if not needs_greedy_baseline(estimator):
        return None
    with_others = [
        (
            config.reward_models,
            "reward_models: the reward server composes the sampled responses' rewards, the "
            "greedy response would keep the env's",
        ),
        (config.ranking, "ranking: R^3's ranking rewards replace the env's on all-wrong groups"),
        (config.overlong_shaping, "overlong_shaping: its penalty lowers the sampled responses' rewards only"),
        (config.rollout_head, "rollout_head (R^2PO): its sampler decodes outside the engine"),
    ]
    errors = [why for on, why in with_others if on]
    if errors:
        return (
            f"advantage_estimator {estimator!r} subtracts the env's reward of a greedy response from each sampled "
            f"response's; not with {'; '.join(errors)}"
        )
    return None


def rarity_is_not_a_policy_estimator(config: Any) -> str | None:
    """R^2PO's stage-A advantage trains the rollout head; on the policy itself it would reward wrong answers in a
    mostly-right group."""
    if config.advantage_estimator == "rarity":
        return "advantage_estimator 'rarity' is R^2PO's rollout-head advantage, not a policy estimator"
    return None


def renamed_estimators_name_the_new_one(config: Any) -> str | None:
    """An estimator's old name is refused with the name that replaced it (``reinforce_pp`` is verl's
    ``reinforce_plus_plus_baseline`` now, with verl's statistics)."""
    errors = [
        f"{field} {getattr(config, field)!r} was renamed: use {ADVANTAGE_FNS.renamed[getattr(config, field)]!r}"
        for field in ("advantage_estimator", "rollout_head_advantage")
        if getattr(config, field) in ADVANTAGE_FNS.renamed
    ]
    return "; ".join(errors) or None


def registry_entries_find_their_fields(config: Any) -> str | None:
    """The chosen estimator and loss read config fields by name (declared at registration): they must exist."""
    errors = []
    for name, registry in ((config.advantage_estimator, ADVANTAGE_FNS), (config.policy_loss, LOSS_FNS)):
        if isinstance(name, str) and (name in registry or is_object_path(name)):
            try:
                registry.params_from(name, config)
                registry.batch_params_from(name, config)
            except ObjectPathError:
                pass  # the field's own rule names the path that does not import
            except ValueError as e:
                errors.append(str(e))
    return "; ".join(errors) or None


def r3_parts_are_single_step(config: Any) -> str | None:
    """Replay and reflection work on one prompt per query, ranking on one response's entropy profile; a multi-step
    query has a prompt per step and a trajectory of responses."""
    on = [part for part in _R3_PARTS if getattr(config, part)]
    if config.advantage_estimator == "hgpo" and on:
        return (
            f"R^3's {'/'.join(on)} work on single-step groups; they are not defined for the step samples "
            "of 'hgpo' (multi-step envs): turn them off"
        )
    return None


def engine_kwargs_fit_the_engine(config: Any) -> str | None:
    """``engine_kwargs`` the engine takes (engines/options.py): named now, not by every runner as it starts."""
    return engine_kwargs_error(config.engine, config.engine_kwargs or {})


def reflection_template_fills(config: Any) -> str | None:
    """A reflection template of one's own must fill (its placeholders known, ``{query}`` and ``{wrong_answer}``
    present, braces balanced): checked here, where it is set, not in every runner."""
    if config.reflection_template is None:
        return None
    try:
        build_reflection_prompt(
            "q", "a", guidance=config.reflection_guidance, template=config.reflection_template
        )
    except ValueError as e:
        return f"reflection_template: {e}"
    return None


def reward_kl_needs_a_sequence_reward(config: Any) -> str | None:
    """use_kl_in_reward subtracts each response's summed KL from its one reward, which is verl's KL in the reward for
    an estimator that sums the token rewards (GRPO, RLOO, REINFORCE++-baseline); verl's PPO, REINFORCE++ and ReMax
    take returns of the token rewards, which the learners compute per token
    (:func:`~r3_rllib.core.advantages.learners_compute_token_advantages`). A step-level estimator scores the
    steps of an episode, whose KL would be counted per step; R^2PO's stages score two policies (the head's logits,
    the base's) against one reference."""
    if not config.use_kl_in_reward:
        return None
    estimator = config.advantage_estimator
    if isinstance(estimator, str) and is_step_level(estimator):
        return (
            f"use_kl_in_reward with the step-level advantage_estimator {estimator!r}: the penalty is per response "
            "(a single-step estimator's sample); use the KL as a loss term (kl_coef)"
        )
    if config.rollout_head:
        return "use_kl_in_reward with rollout_head (R^2PO): use the KL as a loss term (kl_coef)"
    return None


def groups_fit_the_estimator(config: Any) -> str | None:
    """A group estimator's baseline is the group's other responses: two at least. An estimator without one
    (:data:`~r3_rllib.core.advantages.GROUPLESS_ESTIMATORS`: 'gae', 'reinforce_plus_plus', 'remax') takes groups of
    one (verl's PPO samples one response per prompt), except under dynamic sampling, which keeps the groups whose
    rewards differ, and with R^3's ranking, which orders a group's failures."""
    if config.group_size >= 2:
        return None
    name = config.advantage_estimator
    if not (isinstance(name, str) and name in GROUPLESS_ESTIMATORS):
        return (
            f"group_size must be >= 2 (group advantages need at least two samples), got {config.group_size}; "
            f"groups of one are for an advantage_estimator without a group baseline: {sorted(GROUPLESS_ESTIMATORS)}"
        )
    if config.dynamic_sampling:
        return f"dynamic_sampling keeps groups whose rewards differ: it needs group_size >= 2, got {config.group_size}"
    if config.ranking:  # a group of one never has two failures to order: the part would never act
        return f"ranking orders a group's failures: it needs group_size >= 2, got {config.group_size}"
    return None


def critic_fits_the_run(config: Any) -> str | None:
    """Token advantages computed on the learners (advantage_estimator 'gae', learner_critic.py; REINFORCE++ and
    ReMax with use_kl_in_reward, learner_token_returns.py) are one per token: the losses of
    :data:`~r3_rllib.core.losses.TOKEN_ADVANTAGE_LOSSES` read them ('clipped_pg' is verl's PPO loss); 'gspo' and
    losses registered elsewhere take one per response. Not built with them: R^2PO (two policies, one critic),
    distillation (its term mixes the task's one advantage per response) and ranking from the learners' entropies
    (those rewards are known only during the update, after the token targets). With LoRA the policy trains an
    adapter; the critic's own adapter is critic_lora_rank."""
    estimator = config.advantage_estimator
    if not learners_compute_token_advantages(estimator, config.use_kl_in_reward, config.gae_gamma):
        return None
    label = repr(estimator) if uses_critic(estimator) else f"{estimator!r} with use_kl_in_reward"
    if config.policy_loss not in TOKEN_ADVANTAGE_LOSSES:
        return (
            f"advantage_estimator {label} gives one advantage per token; policy_loss {config.policy_loss!r} "
            f"takes one per response: use one of {sorted(TOKEN_ADVANTAGE_LOSSES)} ('clipped_pg' is verl's PPO loss; "
            "'gspo_token' is GSPO's per-token form)"
        )
    others = {
        "rollout_head": bool(config.rollout_head),
        "distill_teacher": config.distill_teacher is not None,
        "ranking with the learners' entropies": bool(config.ranking)
        and ranking_entropies_from_learner(config),
    }
    clash = [name for name, on in others.items() if on]
    if clash:
        return (
            f"advantage_estimator {label} (token advantages on the learners) is not built with "
            f"{', '.join(clash)}; "
            "use a group estimator ('grpo', ...) there"
            + (
                ", or ranking_entropy_source 'engine'"
                if "ranking with the learners' entropies" in clash
                else ""
            )
        )
    return None


def lr_schedule_is_well_formed(config: Any) -> str | None:
    """``lr`` as a schedule (RLlib's ``[[timestep, value], ...]``, core/schedules.py): pairs of finite numbers
    from timestep 0, nondecreasing, values >= 0. RLlib's own check leaves out the values' sign and type."""
    return schedule_error("lr", getattr(config, "lr", None))  # an R3Settings alone has no lr


def lr_shape_is_complete(config: Any) -> str | None:
    """lr_scheduler_type's decay ends at lr_total_steps, and a warm-up ratio is a share of it: both need it, and a
    warm-up cannot outlast it. ``lr`` as RLlib's schedule already sets the rate at every sample: shaping it again
    would multiply two schedules, so only 'constant' without a warm-up goes with it."""
    kind, total = config.lr_scheduler_type, config.lr_total_steps
    warmup = warmup_updates(config.lr_warmup_steps, config.lr_warmup_steps_ratio, total)
    if not isinstance(getattr(config, "lr", None), int | float | type(None)) and (
        kind != "constant" or warmup
    ):
        return (
            f"lr is a schedule ([[timestep, value], ...]) and lr_scheduler_type={kind!r} with a warm-up of "
            f"{warmup} updates shapes it again: use one, a fixed lr with lr_scheduler_type and lr_warmup_steps, or "
            "lr's schedule alone"
        )
    ratio = config.lr_warmup_steps is None and config.lr_warmup_steps_ratio > 0
    if total is None and (kind != "constant" or ratio):
        what = f"lr_scheduler_type {kind!r}" if kind != "constant" else "lr_warmup_steps_ratio"
        return (
            f"{what} needs lr_total_steps, the run's number of updates (verl's total_training_steps; `r3 train` "
            "takes it from the run file's stop.training_iteration)"
        )
    if total is not None and warmup > total:
        return f"the warm-up ({warmup} updates) is longer than lr_total_steps={total}"
    if config.lr_warmup_steps is not None and config.lr_warmup_steps_ratio > 0:
        return (
            f"lr_warmup_steps={config.lr_warmup_steps} and lr_warmup_steps_ratio={config.lr_warmup_steps_ratio} "
            "both set the warm-up (verl takes the steps and ignores the ratio): give one"
        )
    if total is not None and kind == "constant" and not ratio:
        return (
            f"lr_total_steps={total} is read by lr_scheduler_type 'cosine' or 'linear' and by "
            "lr_warmup_steps_ratio, none of which is set: it would be ignored"
        )
    return None


def head_schedule_has_a_stage(config: Any) -> str | None:
    """R^2PO's cycle runs at least one of its two stages (checked while rollout_head is off too)."""
    if config.rollout_head_head_iters == 0 and config.rollout_head_base_iters == 0:
        return "rollout_head_head_iters and rollout_head_base_iters cannot both be 0"
    return None


def head_advantage_is_single_step(config: Any) -> str | None:
    """Stage A scores the G responses to one prompt: its estimator cannot be a multi-step one."""
    name = config.rollout_head_advantage
    if is_step_level(name):
        return f"rollout_head_advantage {name!r} is a multi-step estimator; stage A scores single groups"
    return None


def rollout_head_needs_single_step_estimator(config: Any) -> str | None:
    """Stage A's rarity counts equal rewards among the G responses to ONE prompt; a multi-step estimator's groups
    are steps regrouped by observation across trajectories, where "rare outcome" has no meaning, and the head would
    be trained per step on a reward defined per episode."""
    if config.rollout_head and is_step_level(config.advantage_estimator):
        return (
            f"rollout_head (R^2PO) with the multi-step estimator {config.advantage_estimator!r}: the rarity reward "
            "of stage A is defined on the G single-step responses to one prompt, not on step samples regrouped "
            "by observation; use a single-step env and estimator"
        )
    return None


def lora_targets_are_module_names(config: Any) -> str | None:
    """LoRA's target modules are 'all-linear' or a non-empty list of module names (peft's two forms we pass on)."""
    targets = config.lora_target_modules
    if targets == "all-linear":
        return None
    if isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets):
        return None
    return f"lora_target_modules must be 'all-linear' or a non-empty list of module names, got {targets!r}"


def lora_excludes_rollout_head(config: Any) -> str | None:
    """R^2PO trains the head and the whole base in turns (its stages switch requires_grad of every base
    parameter): that would unfreeze the base LoRA keeps frozen, and the runners' head-and-base sync has no
    adapter form."""
    if config.lora_rank > 0 and config.rollout_head:
        return (
            "lora_rank > 0 with rollout_head (R^2PO): its stages train the whole base; use one or the other"
        )
    return None


def rollout_rs_band_is_ordered(config: Any) -> str | None:
    """Rejection keeps ratios in [lower, upper]: the band must not be empty (defaults resolved: upper is_cap,
    lower 1 / upper)."""
    if config.rollout_rs is None:
        return None
    upper = config.rollout_rs_threshold if config.rollout_rs_threshold is not None else config.is_cap
    lower = (
        config.rollout_rs_threshold_lower if config.rollout_rs_threshold_lower is not None else 1.0 / upper
    )
    if not lower < upper:
        return (
            f"rollout_rs needs rollout_rs_threshold_lower < rollout_rs_threshold (defaults: is_cap and its "
            f"reciprocal), got [{lower}, {upper}]"
        )
    return None


def rollout_rs_thresholds_need_rollout_rs(config: Any) -> str | None:
    """A rejection bound without a rejection level would be silently ignored."""
    given = [
        name
        for name in ("rollout_rs_threshold", "rollout_rs_threshold_lower")
        if getattr(config, name) is not None
    ]
    if given and config.rollout_rs is None:
        return f"{'/'.join(given)} given but rollout_rs is None (no rejection): set rollout_rs or drop them"
    return None


def rollout_is_level_needs_a_weight(config: Any) -> str | None:
    """rollout_is chooses the level of a weight that off_policy_correction (or R^2PO's stage B weight) turns on;
    a non-default level with no weight anywhere would be silently ignored."""
    stage_b = config.rollout_head and config.rollout_head_stage_b_weight == "truncated_is"
    if config.rollout_is != "token" and not (config.off_policy_correction or stage_b):
        return (
            f"rollout_is {config.rollout_is!r} with off_policy_correction=False: no importance weight is "
            "applied; turn off_policy_correction on or leave rollout_is at 'token'"
        )
    return None


def icepop_weight_is_per_token(config: Any) -> str | None:
    """IcePop's weight M(r_t) replaces rollout_is's: a sequence-level weight asked for beside it would be
    silently dropped."""
    if config.rollout_rs == "icepop" and config.rollout_is == "sequence":
        return (
            "rollout_rs 'icepop' weights each token by its own ratio in the band (0 outside), which replaces "
            "rollout_is's weight: rollout_is 'sequence' would be ignored; set rollout_is='token' (the default)"
        )
    return None


def head_kl_aggregation_agrees_under_rejection(config: Any) -> str | None:
    """R^2PO stage A's KL term aggregated otherwise than the policy term is weighted by its own count per
    micro-batch; rejection rescales the minibatch's whole gradient by the policy term's kept share after the
    passes, which would rescale the KL term by a share that is not its own."""
    rejects = config.rollout_rs not in (None, "icepop") or config.rollout_token_veto_threshold is not None
    mode = config.rollout_head_kl_agg_mode
    if not (config.rollout_head and config.rollout_head_kl_coef > 0 and rejects) or mode == "loss_agg_mode":
        return None
    if mode != config.loss_agg_mode:
        return (
            f"rollout_head_kl_agg_mode {mode!r} with loss_agg_mode {config.loss_agg_mode!r} and rejection "
            "(rollout_rs / rollout_token_veto_threshold) is not supported: set rollout_head_kl_agg_mode="
            "'loss_agg_mode' or loss_agg_mode to the same mode"
        )
    return None


def printed_samples_are_recorded(config: Any) -> str | None:
    """log_samples prints rows of the recorded groups: with none recorded there is nothing to print."""
    if config.log_samples > 0 and config.sample_log_fraction <= 0:
        return (
            f"log_samples={config.log_samples} prints recorded samples, but sample_log_fraction=0 records none: "
            "set sample_log_fraction > 0 or log_samples=0"
        )
    return None


def is_weight_alarm_can_fire(config: Any) -> str | None:
    """The importance weight is truncated (at is_cap; IcePop: at its band's upper bound), so a health alarm above
    that bound would never fire."""
    threshold = config.health_is_weight_max
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        return None
    bound, name = config.is_cap, "is_cap"
    if config.rollout_rs == "icepop" and config.rollout_rs_threshold is not None:
        bound, name = config.rollout_rs_threshold, "rollout_rs_threshold"
    if isinstance(bound, int | float) and threshold > bound:
        return (
            f"health_is_weight_max={threshold} can never fire: the importance weight is truncated at "
            f"{name}={bound}; set it at or below {bound}, or None"
        )
    return None


def distill_settings_need_a_teacher(config: Any) -> str | None:
    """Training on distillation alone needs a teacher: without one nothing would train."""
    if not getattr(config, "distill_teacher", None) and getattr(config, "distill_task_reward", True) is False:
        return "distill_task_reward=False trains on the teacher's signal alone: set distill_teacher (or leave it True)"
    return None


def distillation_has_no_rejection(config: Any) -> str | None:
    """The distillation term is aggregated over every response token, while rollout_rs drops rejected tokens from
    the policy loss and rescales the micro-batch by the share kept: the term would be scaled by that share and
    still train the rejected tokens. Refused rather than done half-way."""
    if getattr(config, "distill_teacher", None) and getattr(config, "rollout_rs", None):
        return (
            f"distill_teacher with rollout_rs={config.rollout_rs!r} is not supported: the distillation term does "
            "not follow the rejection (set rollout_rs=None, or drop the teacher)"
        )
    return None


def reward_models_are_terms(config: Any) -> str | None:
    """Every entry of reward_models is a reward term (reward_models/specs.py names the entry and the field)."""
    entries = getattr(config, "reward_models", None)
    if not isinstance(entries, (list, tuple)):
        return None  # None (off) or a wrong type, which the field's own rule names
    try:
        parse_reward_models(entries)
    except RewardModelsError as e:
        return str(e)
    return None


def ranking_source_has_a_judge(config: Any) -> str | None:
    """ranking_source 'judge' or 'both' ranks by a group judge's scores: ranking on, a 'group_judge' term, and for
    'both' the entropies on the driver (with the learner's entropies the learners rank by entropy alone:
    algorithms/r3/ranking_deferred.py)."""
    source = getattr(config, "ranking_source", "entropy")
    if source == "entropy":
        return None
    if not config.ranking:
        return f"ranking_source {source!r} orders R^3's ranking: it needs ranking=True"
    entries = config.reward_models if isinstance(config.reward_models, (list, tuple)) else []
    if not any(isinstance(e, Mapping) and e.get("type") == "group_judge" for e in entries):
        return f"ranking_source {source!r} needs a reward_models term of type 'group_judge' (its scores rank)"
    if source == "both" and ranking_entropies_from_learner(config):
        return (
            "ranking_source 'both' mixes the judge's ranking with the entropy ranking on the driver, but the "
            "ranking's entropies come from the learners (ranking_entropy_source "
            f"{config.ranking_entropy_source!r} with engine {config.engine!r}): set ranking_entropy_source 'engine' "
            "or ranking_source 'judge'"
        )
    return None


#: Every cross-field rule, in the order their messages are listed.
def env_seeds_are_integers(config: Any) -> str | None:
    """``seed`` in ``env_config`` / ``eval_env_config`` is the base each runner's env seed is offset from
    (runner_setup.py adds the run's seed and the runner's): anything but an integer failed in every EnvRunner, after
    Ray started and the model loaded, with a bare TypeError."""
    for name in ("env_config", "eval_env_config"):
        value = getattr(config, name, None)
        seed = value.get("seed") if isinstance(value, dict) else None
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            return (
                f"{name}['seed'] must be an integer (each runner's env seed is offset from it), got {seed!r}"
            )
    return None


def resume_checkpoint_exists(config: Any) -> str | None:
    """``resume_from_checkpoint`` is restored once the runners and learners have started: a path that is not there
    is named now, before Ray starts (a Tune search over it is checked in each trial)."""
    path = getattr(config, "resume_from_checkpoint", None)
    if isinstance(path, (str, os.PathLike)) and not os.path.isdir(path):
        return (
            f"resume_from_checkpoint: no folder {os.fspath(path)!r} here (a checkpoint's folder, or a Tune trial's "
            "folder for its newest complete checkpoint)"
        )
    return None


def _env_config_choices(env_config: Any) -> list[Mapping]:
    """The env_configs ``env_config`` stands for: itself, or each mapping of a Ray Tune grid search over whole
    env_configs (``tune.grid_search([{...}, {...}])`` is a ``{"grid_search": [...]}`` placeholder, resolved per
    trial). A search over one option's values (``{"digits": tune.grid_search([1, 2])}``) keeps its key, so it is
    checked as any key is. Anything but a mapping stands for none: its type is not this rule's to name."""
    if isinstance(env_config, Mapping) and len(env_config) == 1 and "grid_search" in env_config:
        values = env_config["grid_search"]
        return [v for v in values if isinstance(v, Mapping)] if isinstance(values, (list, tuple)) else []
    return [env_config] if isinstance(env_config, Mapping) else []


def env_config_fits_the_env(config: Any) -> str | None:
    """Every key of ``env_config`` is an option the env's factory takes; else the message names the key and the
    closest option it does take. Each EnvRunner would fail with Python's ``unexpected keyword argument`` only after
    Ray started and the model loaded. The env is a name of the text-env registry of this process, a
    ``"module:Class"`` path or a class or factory. Envs that cannot be imported here (an optional package, a name
    only Ray Tune's registry knows) or that take ``**kwargs`` are left to the runners. (``eval_env_config`` is not
    checked: its default, ``{split: test}``, is for envs with a held-out split, and is unused by the others.)"""
    from r3_rllib.envs.registry import get_text_env_factory

    env = getattr(config, "env", None)
    choices = _env_config_choices(getattr(config, "env_config", None))
    if env is None or not any(choices):
        return None  # nothing to look up: no env, or no option given (importing the env would check nothing)
    try:
        factory = env if callable(env) else get_text_env_factory(env)
        params = inspect.signature(factory).parameters
    except Exception:  # noqa: BLE001 - any failure to look here only skips the check; the runner reports its own
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    known = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD]
    for key in (k for choice in choices for k in choice):
        if key not in known:
            return _unknown_env_option(key, known, env)
    return None


def _unknown_env_option(key: Any, known: list[str], env: Any) -> str:
    """``environment.env_config: env 'math' takes no option 'problem_kye'; did you mean 'problem_key'?`` (or the
    options it takes, when none is close)."""
    name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
    close = closest_name(str(key), known)
    hint = f"; did you mean {close!r}?" if close else f"; its options: {', '.join(sorted(known))}"
    return f"environment.env_config: env {name!r} takes no option {key!r}{hint}"


CROSS_FIELD_RULES: tuple[ConfigRule, ...] = (
    queries_cover_runners,
    overlong_buffer_fits_responses,
    ddof_only_for_grpo,
    gspo_needs_sequence_mean,
    vespo_weights_are_token_importance_weights,
    gdpo_reads_every_objective,
    replay_excludes_dynamic_sampling,
    ranking_survives_dynamic_sampling,
    truncation_mask_keeps_ranking_on_the_driver,
    clip_cov_band_is_ordered,
    ref_sync_needs_a_reference_model,
    refill_rounds_agree_with_gen_batches,
    shortfall_needs_a_batch_limit,
    overlap_needs_awake_engine,
    sleep_needs_an_engine_that_sleeps,
    max_staleness_agrees_with_overlap,
    prefetch_is_for_the_synchronous_loop,
    streaming_excludes_dynamic_sampling,
    partial_rollouts_need_overlap_and_a_stepping_engine,
    rollout_head_needs_an_engine_with_a_head,
    lora_needs_an_engine_that_applies_adapters,
    rarity_is_not_a_policy_estimator,
    passk_needs_two_responses,
    greedy_baseline_is_graded_like_the_samples,
    renamed_estimators_name_the_new_one,
    registry_entries_find_their_fields,
    r3_parts_are_single_step,
    reward_kl_needs_a_sequence_reward,
    groups_fit_the_estimator,
    critic_fits_the_run,
    lr_schedule_is_well_formed,
    lr_shape_is_complete,
    engine_kwargs_fit_the_engine,
    reflection_template_fills,
    head_schedule_has_a_stage,
    head_advantage_is_single_step,
    rollout_head_needs_single_step_estimator,
    lora_targets_are_module_names,
    lora_excludes_rollout_head,
    rollout_rs_band_is_ordered,
    rollout_rs_thresholds_need_rollout_rs,
    rollout_is_level_needs_a_weight,
    icepop_weight_is_per_token,
    head_kl_aggregation_agrees_under_rejection,
    printed_samples_are_recorded,
    is_weight_alarm_can_fire,
    reward_models_are_terms,
    ranking_source_has_a_judge,
    distill_settings_need_a_teacher,
    task_reward_parts_need_the_task_reward,
    env_seeds_are_integers,
    env_config_fits_the_env,
    resume_checkpoint_exists,
    distillation_has_no_rejection,
    fsdp_needs_several_learners,
    minibatches_fit_the_batch,
    mode_options_are_read,
)


def config_errors(
    config: Any, extra_rules: Iterable[ConfigRule] = (), field_rules: Mapping[str, Rule] | None = None
) -> list[str]:
    """Every problem of ``config``: each field against its own rule (or its rule in ``field_rules``), RLlib's
    settings against :data:`~r3_rllib.config.settings.RLLIB_FIELD_RULES`, then every cross-field rule and
    ``extra_rules``."""
    errors = field_errors(R3Settings, config, field_rules) + rules_errors(RLLIB_FIELD_RULES, config)
    for rule in (*CROSS_FIELD_RULES, *extra_rules):
        try:
            message = rule(config)
        except TypeError:
            if not errors:
                raise
            continue  # a comparison with a value of the wrong type, which its field's rule has named already
        if message:
            errors.append(message)
    return errors


_R3_RULES = {f.name: field_rule(f) for f in dataclasses.fields(R3Settings)}


def setting_error(name: str, value: Any) -> str | None:
    """The message when ``value`` breaks the rule of setting ``name`` (an R3 field or one of RLlib's in
    :data:`~r3_rllib.config.settings.RLLIB_FIELD_RULES`), else None: the check of one key of a run file or
    ``--set``, by the rule :func:`config_errors` applies to the whole config."""
    rule = _R3_RULES.get(name) or RLLIB_FIELD_RULES.get(name)
    return rule.error(name, value) if rule is not None else None


def check_config(
    config: Any, extra_rules: Iterable[ConfigRule] = (), field_rules: Mapping[str, Rule] | None = None
) -> None:
    """Raise one ValueError listing every problem of ``config`` (nothing when it has none); see
    :func:`config_errors`."""
    errors = config_errors(config, extra_rules, field_rules)
    if errors:
        raise ValueError("Invalid R3Config: " + "; ".join(errors))
