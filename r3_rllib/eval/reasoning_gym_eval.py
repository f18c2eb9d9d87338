"""pass@1 over n samples on reasoning-gym tasks (``r3 eval --reasoning-gym TASKS``), graded by each task's verifier.

Each task is evaluated on its held-out problems: the ``test`` split of :class:`~r3_rllib.envs.reasoning_gym.
ReasoningGymEnv` (generated from another seed than training's, with nothing in common with the training problems),
rendered through the tokenizer's chat template with reasoning-gym's answer-format system prompt. A response counts as
correct when the task's verifier scores its ``<answer>`` 1.0; one row per task in the same report as the math
benchmarks.
"""

from __future__ import annotations

from dataclasses import replace

from r3_rllib.engines.base import GenerationEngine, SamplingParams
from r3_rllib.envs.reasoning_gym import ReasoningGymEnv
from r3_rllib.eval.evaluate import BenchmarkResult, EvalReport


def evaluate_reasoning_gym(
    engine: GenerationEngine,
    tokenizer,
    tasks: list[str],
    *,
    n: int = 16,
    num_problems: int = 100,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 1024,
    seed: int = 0,
    data_seed: int = 0,
    env_options: dict | None = None,
) -> EvalReport:
    """Sample `n` responses to each of the first `num_problems` test problems of every task in `tasks` and grade
    them with the task's verifier. `data_seed`: the env's seed (the same as training's gives the problems held out
    from that training run). `env_options`: more `ReasoningGymEnv` keywords, as the training run's env_config had
    them (e.g. ``{"few_shot": 3}``), and ``task_config``: ``{task: {its options}}`` for the tasks trained at other
    than their default settings."""
    if n < 1 or num_problems < 1:
        raise ValueError(f"n and num_problems must be >= 1, got {n} and {num_problems}")
    stop_ids = tuple(i for i in [getattr(tokenizer, "eos_token_id", None)] if i is not None)
    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop_token_ids=stop_ids
    )
    options = dict(env_options or {})
    task_configs = options.pop("task_config", {})
    unknown = sorted(set(options) & {"tasks", "split", "test_size", "seed", "tokenizer"})
    if unknown:
        raise ValueError(
            f"env_options {unknown} are set by the evaluation itself (tasks, split, sizes, seeds)"
        )
    results = []
    for i, task in enumerate(tasks):
        spec = {task: {"config": task_configs[task]}} if task in task_configs else task
        env = ReasoningGymEnv(
            tasks=spec, split="test", test_size=num_problems, seed=data_seed, tokenizer=tokenizer, **options
        )
        results.append(_evaluate_task(engine, tokenizer, env, task, n, replace(params, seed=seed + i)))
    config = {
        "reasoning_gym": list(tasks),
        "n": n,
        "num_problems": num_problems,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "data_seed": data_seed,
        "env_options": env_options or {},
    }
    return EvalReport(results=results, config=config)


def _evaluate_task(
    engine: GenerationEngine, tokenizer, env: ReasoningGymEnv, task: str, n: int, params: SamplingParams
) -> BenchmarkResult:
    prompts = [env.render_prompt(entry["question"]) for entry in env.entries]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    groups = engine.generate(prompt_ids, n, params)
    correct = [
        [env.grade(c.text, entry)[0] >= 1.0 for c in group]
        for entry, group in zip(env.entries, groups, strict=True)
    ]
    lengths = [[len(c.token_ids) for c in group] for group in groups]
    truncated = [[c.truncated for c in group] for group in groups]
    return BenchmarkResult.from_samples(f"rg:{task}", env.query_ids, correct, lengths, truncated)
