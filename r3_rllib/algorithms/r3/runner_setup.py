"""How an EnvRunner builds its TextEnv: the env factory (by class, entry-point name or Tune-registered name), the
policy tokenizer handed to envs that take one, and each runner's share of the data order (its ``shard``) and seed.
"""

from __future__ import annotations

import inspect

from r3_rllib.envs.base import TextEnv
from r3_rllib.models.hub import policy_path


def _text_env_factory(name: str):
    # Private: Tune's cluster-wide registry has no public lookup (tests/unit/test_rllib_private_api.py guards it).
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from r3_rllib.envs.registry import get_text_env_factory

    try:
        return get_text_env_factory(name)
    except ValueError:
        if _global_registry.contains(ENV_CREATOR, name):
            return _global_registry.get(ENV_CREATOR, name)
        raise


def build_env(name, env_config: dict, tokenizer) -> TextEnv:
    """Make the TextEnv, handing it the policy's tokenizer when it takes one and none is configured."""
    cfg = dict(env_config)
    # The env class/factory itself (it reaches remote runners by pickling), or a name known in this process
    # (built-in envs, entry points) or in Ray Tune's cluster-wide registry (names the driver registered, see
    # R3Config.environment).
    factory = name if callable(name) else _text_env_factory(name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if "tokenizer" in params and cfg.get("tokenizer") is None:
        cfg["tokenizer"] = tokenizer
    env = factory(**cfg)
    if not isinstance(env, TextEnv):
        raise TypeError(f"text env {name!r} built a {type(env).__name__}, not a TextEnv")
    return env


#: How far apart the runners' sampling seeds start (runner_seed).
RUNNER_SEED_STRIDE = 1000


def runner_seed(config, worker_index: int | None) -> int:
    """Each runner's sampling seed: its engine's samples differ from the other runners' but are reproducible."""
    return int(config.seed or 0) + RUNNER_SEED_STRIDE * int(worker_index or 0)


def env_accepts_shard(name) -> bool:
    """Whether the TextEnv factory names a ``shard`` parameter (the shipped envs do; see ``envs/data.py``). A factory
    taking only ``**kwargs`` counts as not shardable: it may hand them to an env that does not know the key."""
    factory = name if callable(name) else _text_env_factory(name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "shard" in params


def runner_env_config(config, worker_index: int | None, *, shardable: bool = True) -> dict:
    """The env_config runner `worker_index` builds its TextEnv with.

    Shardable envs get one data order for all runners (the env's seed plus the global `config.seed`, the same on
    every runner) and runner `worker_index`'s `shard` of it: positions of each iteration's `queries_per_iteration`
    global batch, split as the algorithm splits a rollout (see `envs.data.runner_shards`). Together the runners
    walk one permutation per epoch, each query at most once per epoch and never twice in one iteration; the last
    `len(data) % queries_per_iteration` queries of each epoch's permutation are skipped that epoch (different ones
    every epoch). A local runner (worker_index 0, no remote runners) takes the whole batch.

    Envs without a `shard` keyword keep the older scheme: each runner walks the whole data in its own order (the
    env's seed offset by the runner's), so runners may serve one query in the same iteration.
    """
    from r3_rllib.envs.data import runner_shards

    env_config = {**model_context_config(config), **dict(config.env_config)}
    if not shardable:
        return {**env_config, "seed": env_config.get("seed", 0) + runner_seed(config, worker_index)}
    num_runners = int(config.num_env_runners or 0)
    batch = int(config.queries_per_iteration)
    if num_runners < 1 or not worker_index:
        shard = runner_shards(batch, 1)[0]
    else:
        shard = runner_shards(batch, num_runners)[int(worker_index) - 1]
    return {**env_config, "seed": env_config.get("seed", 0) + int(config.seed or 0), "shard": shard.as_dict()}


def model_context_config(config) -> dict:
    """:func:`model_context` for an env that checks its prompts against the model's context (its factory names
    ``model_max_positions``, as every shipped env does: ``envs/context.py``): a prompt whose tokens + max_new_tokens
    exceed it is refused there, naming the query, instead of training past the model's positions. Empty for other
    envs (they would not know the keys)."""
    factory = config.env if callable(config.env) else _text_env_factory(config.env)
    try:
        if "model_max_positions" not in inspect.signature(factory).parameters:
            return {}
    except (TypeError, ValueError):
        return {}
    return model_context(config)


def model_context(config) -> dict:
    """``model_max_positions`` (the model config's position limit) and ``max_new_tokens`` of the run; empty when the
    model's config is unreadable or names no limit (the engine names that). Also the bound a reflection prompt is
    held to (``envs.context.drop_long_prompts``)."""
    try:
        from transformers import AutoConfig

        from r3_rllib.engines.budget import model_max_positions

        positions = model_max_positions(AutoConfig.from_pretrained(policy_path(config.model_path)))
    except (OSError, TypeError, ValueError):
        return {}
    return (
        {"model_max_positions": positions, "max_new_tokens": int(config.max_new_tokens)} if positions else {}
    )


def eval_env_config(config) -> dict:
    """The held-out env's config: the training env's with ``eval_env_config`` on top, and the model's context as
    for the training env (:func:`model_context_config`), so held-out prompts are checked too."""
    return {**model_context_config(config), **dict(config.env_config), **dict(config.eval_env_config)}


def start_gateway(config, engine, tokenizer, defaults):
    """An agent env's rollout gateway (:mod:`r3_rllib.gateway`): ``engine`` behind an OpenAI-compatible endpoint on
    ``config.gateway_host`` (loopback by default; a free port), sampling with ``defaults`` where a call sets
    nothing else, calls bounded by the model's context, batches waiting up to ``config.gateway_max_batch_wait_s``
    for every open session's call (reproducible batches); started."""
    from r3_rllib.gateway import Gateway

    gateway = Gateway(
        engine,
        tokenizer,
        model_name="policy",
        defaults=defaults,
        max_context=model_context(config).get("model_max_positions"),
        host=config.gateway_host,
        max_batch_wait_s=float(config.gateway_max_batch_wait_s),
    )
    gateway.start()
    return gateway


def load_policy_tokenizer(config):
    """The policy's tokenizer (``tokenizer_path``, else the model's folder)."""
    from r3_rllib.models.tiny import load_tokenizer

    return load_tokenizer(policy_path(config.tokenizer_path or config.model_path))
