"""Benchmark evaluation of a policy: pass@1 averaged over n samples, pass@n, response length, truncation.

Protocol (DeepScaleR / R^3): every problem is rendered exactly as the math environment renders it during training
(same template, same chat template), sampled ``n`` times at temperature 0.6 / top-p 0.95, and each response is graded
by the rule-based math grader against the gold answer(s). Per benchmark:

- ``pass@1`` is the mean correctness over all ``n`` samples of all problems ("avg@n"), the number papers report;
- ``pass@n`` is the unbiased pass@k estimator of Chen et al. (2021) at ``k = n``, i.e. the fraction of problems with at
  least one correct sample;
- ``mean_response_tokens`` and ``truncated_frac`` (responses that hit ``max_new_tokens``) show whether the budget cut
  reasoning short, which silently lowers accuracy.

The "average" row is the unweighted mean over benchmarks, as in the papers' tables.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams
from r3_rllib.engines.registry import (
    DEFAULT_ENGINE,
    ENGINE_KINDS,
    default_engine,
    engine_class,
    engines_where,
)
from r3_rllib.envs.data import MathProblem
from r3_rllib.envs.math_env import DEFAULT_PROMPT_TEMPLATE, MathEnv
from r3_rllib.eval.benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    load_benchmark,
    local_path,
    parse_benchmark_names,
)
from r3_rllib.warmstart.named import build_model_path

# The training prompt (DeepScaleR's instruction); evaluation must see exactly what training saw.
PROMPT_TEMPLATE = DEFAULT_PROMPT_TEMPLATE

# DeepScaleR evaluates its 1.5B models with a 32k-token response budget.
DEFAULT_MAX_NEW_TOKENS = 32768
DEFAULT_ENV_MAX_NEW_TOKENS = 1024  # r3 eval --env
DEFAULT_BATCH_SIZE = 64  # prompts per engine call (each fans out to n samples)


# -- metrics ------------------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from ``c`` correct out of ``n`` samples.

    ``1 - C(n-c, k) / C(n, k)``: the chance that a random k-subset of the n samples holds a correct one.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class BenchmarkResult:
    name: str
    num_problems: int
    n: int
    pass_at_1: float  # avg@n: mean correctness over all samples
    pass_at_n: float  # unbiased pass@k with k = n
    mean_response_tokens: float
    truncated_frac: float
    problem_ids: list[str] = field(default_factory=list)
    num_correct: list[int] = field(default_factory=list)  # per problem, out of n
    mean_reward: float | None = None  # env evaluations (r3 eval --env): the env's reward, over all samples

    @classmethod
    def from_samples(
        cls,
        name: str,
        problem_ids: Sequence[str],
        correct: Sequence[Sequence[bool]],
        response_tokens: Sequence[Sequence[int]],
        truncated: Sequence[Sequence[bool]],
    ) -> BenchmarkResult:
        """Aggregate per-sample results; every argument is ``[problem][sample]`` with the same n per problem."""
        if not correct:
            raise ValueError(f"benchmark {name!r}: no problems were evaluated")
        n = len(correct[0])
        if n == 0 or any(len(row) != n for row in correct):
            raise ValueError(f"benchmark {name!r}: every problem needs the same number (>0) of samples")
        counts = [int(sum(bool(x) for x in row)) for row in correct]
        return cls(
            name=name,
            num_problems=len(correct),
            n=n,
            pass_at_1=float(np.mean([c / n for c in counts])),
            pass_at_n=float(np.mean([pass_at_k(n, c, n) for c in counts])),
            mean_response_tokens=float(np.mean([t for row in response_tokens for t in row])),
            truncated_frac=float(np.mean([bool(t) for row in truncated for t in row])),
            problem_ids=list(problem_ids),
            num_correct=counts,
        )


SUMMARY_FIELDS = ("pass_at_1", "pass_at_n", "mean_response_tokens", "truncated_frac")


@dataclass
class EvalReport:
    results: list[BenchmarkResult]
    config: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> BenchmarkResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no result for {name!r}; have {[r.name for r in self.results]}")

    @property
    def average(self) -> dict[str, float]:
        """Unweighted mean of each summary metric over benchmarks; ``num_problems`` is the total."""
        out = {f: float(np.mean([getattr(r, f) for r in self.results])) for f in SUMMARY_FIELDS}
        out["num_problems"] = sum(r.num_problems for r in self.results)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "benchmarks": {r.name: asdict(r) for r in self.results},
            "average": self.average,
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_markdown(self) -> str:
        n = self.results[0].n if self.results else 0
        header = (
            f"| benchmark | problems | pass@1 (avg@{n}) % | pass@{n} % | mean response tokens | truncated % |\n"
            "|---|---:|---:|---:|---:|---:|"
        )

        def row(name: str, num: int, m: dict[str, float]) -> str:
            return (
                f"| {name} | {num} | {100 * m['pass_at_1']:.1f} | {100 * m['pass_at_n']:.1f} | "
                f"{m['mean_response_tokens']:.0f} | {100 * m['truncated_frac']:.1f} |"
            )

        lines = [header]
        for r in self.results:
            lines.append(row(r.name, r.num_problems, {f: getattr(r, f) for f in SUMMARY_FIELDS}))
        if len(self.results) > 1:
            avg = self.average
            lines.append(row("**average**", int(avg["num_problems"]), avg))
        return "\n".join(lines)


# -- evaluation ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderedPrompts:
    token_ids: list[list[int]]
    texts: list[str]
    think_in_prompt: list[bool]  # the prompt opens a <think> block: an answer needs a closing </think>


def render_prompts(
    tokenizer, problems: Sequence[MathProblem], prompt_template: str, apply_chat_template: bool
) -> RenderedPrompts:
    """Prompts exactly as :class:`~r3_rllib.envs.math_env.MathEnv` renders them in training, as token ids.

    The environment itself renders (template, chat template, fallback to plain text for tokenizers without one) and
    the ids come from ``tokenizer(text, add_special_tokens=False)`` like the rollout runner's, so an evaluated model
    sees byte-identical prompts to the ones it was trained on.
    """
    env = MathEnv(
        data=list(problems),
        tokenizer=tokenizer,
        prompt_template=prompt_template,
        apply_chat_template=apply_chat_template,
        shuffle=False,
    )
    texts = [env.reset(options={"query_id": p.id})[0] for p in problems]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    # Same rule as MathEnv.reset: DeepSeek-R1 chat templates end the generation prompt with "<think>\n".
    think = [
        env.think_in_prompt if env.think_in_prompt is not None else t.rstrip().endswith("<think>")
        for t in texts
    ]
    return RenderedPrompts(token_ids=ids, texts=texts, think_in_prompt=think)


def _response_text(completion: Completion, tokenizer) -> str:
    # Engines fill ``text`` when they hold a tokenizer; decode here otherwise so grading never sees an empty string.
    if completion.text:
        return completion.text
    return tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def _grade(grader, pairs: list[tuple[str, tuple[str, ...]]], think: list[bool]) -> list[bool]:
    """Grade in at most two calls (prompts with and without an opened think block take different rules)."""
    out: list[bool] = [False] * len(pairs)
    for flag in (False, True):
        idx = [i for i, t in enumerate(think) if t == flag]
        if idx:
            grades = grader.grade_many([pairs[i] for i in idx], think_in_prompt=flag)
            for i, g in zip(idx, grades, strict=True):
                out[i] = bool(g.correct)
    return out


def _generate_checked(
    engine: GenerationEngine, prompt_ids: list[list[int]], n: int, params: SamplingParams
) -> list[list[Completion]]:
    """``engine.generate``, refusing a result that is not ``n`` completions for each prompt."""
    groups = engine.generate(prompt_ids, n, params)
    if len(groups) != len(prompt_ids) or any(len(g) != n for g in groups):
        raise RuntimeError(
            f"engine returned {[len(g) for g in groups]} completions for {len(prompt_ids)} prompts x n={n}"
        )
    return groups


def _grade_groups(
    grader,
    tokenizer,
    groups: list[list[Completion]],
    problems: Sequence[MathProblem],
    prompts: RenderedPrompts,
    start: int,
) -> list[bool]:
    """One verdict per completion, group after group: ``groups[j]`` answers ``problems[j]``, the prompt
    ``start + j`` of ``prompts``."""
    pairs, think = [], []
    for j, (problem, group) in enumerate(zip(problems, groups, strict=True)):
        for c in group:
            pairs.append((_response_text(c, tokenizer), problem.answers))
            think.append(prompts.think_in_prompt[start + j])
    return _grade(grader, pairs, think)


def _load_and_render(
    names: list[str],
    tokenizer,
    data_dir: str | Path | None,
    max_problems: int | None,
    prompt_template: str,
    apply_chat_template: bool,
) -> tuple[dict[str, list[MathProblem]], dict[str, RenderedPrompts]]:
    """Every benchmark's problems and rendered prompts, loaded before any generation: a bad file or name fails
    before (possibly hours of) sampling."""
    suites = {name: load_benchmark(name, data_dir=data_dir, max_problems=max_problems) for name in names}
    rendered = {
        name: render_prompts(tokenizer, problems, prompt_template, apply_chat_template)
        for name, problems in suites.items()
    }
    return suites, rendered


def _run_benchmark(
    engine: GenerationEngine,
    tokenizer,
    grader,
    name: str,
    problems: Sequence[MathProblem],
    prompts: RenderedPrompts,
    n: int,
    batch_size: int,
    sampling: SamplingParams,
    seeds: Iterator[int],
    bar: Any,
) -> BenchmarkResult:
    """Sample and grade one benchmark in batches of ``batch_size`` problems, each engine call seeded by the next
    of ``seeds``; ``bar`` (a tqdm bar) advances per problem."""
    bar.set_postfix_str(name)
    correct: list[list[bool]] = []
    lengths: list[list[int]] = []
    truncated: list[list[bool]] = []
    for start in range(0, len(problems), batch_size):
        stop = min(start + batch_size, len(problems))
        params = replace(sampling, seed=next(seeds))
        groups = _generate_checked(engine, prompts.token_ids[start:stop], n, params)
        verdicts = _grade_groups(grader, tokenizer, groups, problems[start:stop], prompts, start)
        for j, group in enumerate(groups):
            correct.append(verdicts[j * n : (j + 1) * n])
            lengths.append([len(c.token_ids) for c in group])
            truncated.append([c.truncated for c in group])
        bar.update(stop - start)
    return BenchmarkResult.from_samples(name, [p.id for p in problems], correct, lengths, truncated)


def evaluate(
    engine: GenerationEngine,
    tokenizer,
    benchmarks: str | Sequence[str] = PAPER_BENCHMARKS,
    *,
    n: int = 16,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    data_dir: str | Path | None = None,
    max_problems: int | None = None,
    prompt_template: str = PROMPT_TEMPLATE,
    apply_chat_template: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
    progress: bool = True,
    grader=None,
) -> EvalReport:
    """Sample ``n`` responses per problem of each benchmark with ``engine`` and grade them (see module docstring).

    ``benchmarks``: names from :data:`~r3_rllib.eval.benchmarks.BENCHMARKS` (list or comma-separated string).
    ``data_dir``: read ``{name}.jsonl`` from this folder instead of the hub. ``max_problems``: first N per benchmark.
    ``grader``: an object with ``grade_many([(response, golds), ...], think_in_prompt=bool)`` returning results with
    a ``correct`` attribute (default: a fresh :class:`~r3_rllib.rewards.math_grader.MathGrader`, closed at the end).
    Sampling stops at the tokenizer's eos, as in training; ``seed + i`` seeds the i-th engine call.
    """
    from tqdm.auto import tqdm

    for arg, value in (("n", n), ("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if value < 1:
            raise ValueError(f"{arg} must be >= 1, got {value}")
    names = parse_benchmark_names(benchmarks)
    suites, rendered = _load_and_render(
        names, tokenizer, data_dir, max_problems, prompt_template, apply_chat_template
    )
    stop_ids = tuple(i for i in [getattr(tokenizer, "eos_token_id", None)] if i is not None)  # as in training
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop_token_ids=stop_ids
    )
    seeds = itertools.count(seed)  # a distinct seed per engine call: batches must not share random streams
    own_grader = grader is None
    if own_grader:
        from r3_rllib.rewards.math_grader import MathGrader

        grader = MathGrader()
    run = partial(_run_benchmark, engine, tokenizer, grader, n=n, batch_size=batch_size, sampling=sampling)
    total = sum(len(p) for p in suites.values())
    try:
        with tqdm(total=total, desc="eval", unit="problem", disable=not progress, dynamic_ncols=True) as bar:
            results = [
                run(name, problems, rendered[name], seeds=seeds, bar=bar) for name, problems in suites.items()
            ]
    finally:
        if own_grader:
            grader.close()
    config = {
        "benchmarks": names,
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "data_dir": None if data_dir is None else str(data_dir),
        "max_problems": max_problems,
        "prompt_template": prompt_template,
        "apply_chat_template": apply_chat_template,
        "seed": seed,
    }
    return EvalReport(results=results, config=config)


# -- command line -------------------------------------------------------------------------------------------------------
def default_engine_kind() -> str:
    """The engine ``r3 eval`` uses when none is named: with a GPU visible, the first registered engine that
    prefers one and is installed (vLLM: fast long generations), else the transformers engine
    (:func:`~r3_rllib.engines.registry.default_engine`)."""
    import torch

    return default_engine(torch.cuda.is_available())


def _split_names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``, checked when the command line is read: ``--n 0`` was refused only
    inside the evaluation, after the model had loaded (minutes for a large one)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high] (``(low, high]`` when ``low_open``; ``high`` may be inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above_low = value > low if low_open else value >= low
        if not (above_low and value <= high and math.isfinite(value)):  # NaN fails every comparison
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"expected a number in {bracket}{low}, {high}], got {text!r}")
        return value

    return parse


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """How each problem is sampled: ``--n`` samples, their budget, temperature, top-p, batching and seed."""
    parser.add_argument(
        "--n", type=_int_at_least(1), default=16, help="samples per problem (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=_int_at_least(1),
        default=None,
        help=f"default: {DEFAULT_MAX_NEW_TOKENS} for the math benchmarks, {DEFAULT_ENV_MAX_NEW_TOKENS} with --env",
    )
    parser.add_argument(
        "--temperature", type=_float_in(0.0, math.inf), default=0.6, help="default: %(default)s"
    )
    parser.add_argument(
        "--top-p", type=_float_in(0.0, 1.0, low_open=True), default=0.95, help="default: %(default)s"
    )
    parser.add_argument(
        "--batch-size", type=_int_at_least(1), default=DEFAULT_BATCH_SIZE, help="prompts per engine call"
    )
    parser.add_argument("--seed", type=int, default=0)


def add_eval_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--model", required=True, help="model folder or hub name, or a run's trial or checkpoint folder"
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
    parser.add_argument(
        "--benchmarks",
        default=",".join(PAPER_BENCHMARKS),
        help=f"comma-separated, from {', '.join(BENCHMARKS)} (default: %(default)s)",
    )
    _add_sampling_args(parser)
    parser.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default=None,
        help=f"default: {' or '.join(engines_where(lambda c: c.default_on_gpu))} when installed and a GPU is "
        f"visible, else {DEFAULT_ENGINE}",
    )
    parser.add_argument(
        "--data-dir", default=None, help="read <benchmark>.jsonl files here instead of the hub"
    )
    parser.add_argument(
        "--max-problems", type=_int_at_least(1), default=None, help="first N problems of each benchmark"
    )
    parser.add_argument(
        "--no-chat-template",
        action="store_true",
        help="feed the templated problem as plain text (base models)",
    )
    parser.add_argument(
        "--prompt-template", default=PROMPT_TEMPLATE, help="user-turn template with {problem}"
    )
    parser.add_argument(
        "--out", default=None, help="write the report as JSON here (and a .md table beside it)"
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="vLLM only (default: %(default)s)"
    )
    parser.add_argument("--tensor-parallel-size", type=_int_at_least(1), default=1, help="vLLM only")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--reasoning-gym",
        default=None,
        help="comma-separated reasoning-gym tasks to evaluate instead of the math benchmarks (their held-out "
        "problems, graded by each task's verifier; needs the [envs] extra); --max-problems problems each "
        "(default 100)",
    )
    parser.add_argument(
        "--reasoning-gym-env",
        type=json.loads,
        default=None,
        help='JSON: the training run\'s reasoning_gym env options (e.g. \'{"few_shot": 3}\') and "task_config": '
        "{task: options} for tasks trained at other than their default settings",
    )
    add_env_eval_args(parser)
    parser.add_argument(
        "--with-head",
        action="store_true",
        help="R^2PO: sample with the rollout head saved beside the model (rollout_head.safetensors) switched on; "
        "by default the base policy is evaluated (head off), as exported and served",
    )
    return parser


def _engine_kwargs(kind: str, args: argparse.Namespace, model_path: Path) -> dict[str, Any]:
    """Keyword arguments of ``make_engine(kind, model_path, tokenizer, ...)`` for ``r3 eval``: the engine's
    :meth:`~r3_rllib.engines.base.GenerationEngine.evaluation_kwargs` (vLLM: seed, a KV cache for the longest
    benchmark prompt plus the response budget, capped by the model the engine loads from ``model_path``, GPU
    share, tensor parallelism, no top-k log-probs), and the rollout head's switches.

    Without ``--with-head`` the plain engine is built: it loads the HF folder only, so a rollout head saved beside
    the model is ignored and the base policy is evaluated. With it, the rollout-head engine samples from
    ``lm_logits + head(hidden)`` with the saved head (see :func:`_check_head`).
    """
    out: dict[str, Any] = {}
    if getattr(args, "with_head", False):
        out.update(rollout_head=True, rollout_logits=True)
    options = engine_class(kind).evaluation_kwargs(
        seed=args.seed,
        max_new_tokens=max_new_tokens_of(args),
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    return {**out, **options}


def _check_head(args: argparse.Namespace, model_path: Path) -> None:
    """``--with-head`` needs a saved head: the engine would otherwise attach a fresh near-zero one and silently
    evaluate the base policy under the head's name."""
    if not getattr(args, "with_head", False):
        return
    from r3_rllib.models.rollout_head import HEAD_CONFIG_FILE, HEAD_WEIGHTS_FILE, has_rollout_head

    if not has_rollout_head(model_path):
        raise FileNotFoundError(
            f"--with-head: no rollout head in {model_path} ({HEAD_WEIGHTS_FILE} and {HEAD_CONFIG_FILE}; export the "
            "policy with export_policy(..., with_head=True))"
        )


def add_env_eval_args(parser: argparse.ArgumentParser) -> None:
    """``r3 eval --env NAME``: any text env's held-out queries instead of the math benchmarks (env_eval.py)."""
    parser.add_argument(
        "--env",
        default=None,
        help="score this text env instead of the math benchmarks: a registered name (reward_fn, arithmetic, ...) "
        "or 'module:Class'; its held-out queries (split 'test'), --max-problems of them (default all)",
    )
    parser.add_argument(
        "--env-config",
        type=json.loads,
        default=None,
        help="with --env: the env_config, as JSON (as in training)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --env: one env_config key (a YAML value; repeatable), e.g. --set reward=my_rewards:exact_match",
    )
    parser.add_argument(
        "--split", default="test", help="with --env: the env's split option (default: %(default)s)"
    )
    parser.add_argument(
        "--greedy", action="store_true", help="with --env: one greedy response per query (not --n)"
    )


def env_config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--env-config`` with each ``--set key=value`` on top (a value read as YAML: numbers, lists, true/false)."""
    import yaml

    config = dict(args.env_config or {})
    if not isinstance(args.env_config or {}, dict):
        raise ValueError(f"--env-config must be a JSON object, got {args.env_config!r}")
    for text in args.set or []:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {text!r}")
        config[key.strip()] = yaml.safe_load(value)
    return config


def _eval_env(args: argparse.Namespace, tokenizer) -> Any:
    """``--env``'s env, built with ``--env-config``/``--set`` and ``--split`` (a note when it has no split option:
    its queries are then the ones it trains on)."""
    from r3_rllib.eval.env_eval import build_eval_env, takes_split

    split = args.split or None
    if split is not None and not takes_split(args.env):
        print(
            f"r3 eval: note: env {args.env!r} has no split option: scoring the queries it serves",
            file=sys.stderr,
        )
    return build_eval_env(args.env, env_config_from_args(args), tokenizer, split)


def _env_report(engine: GenerationEngine, tokenizer, args: argparse.Namespace, env: Any) -> EvalReport:
    from r3_rllib.eval.env_eval import evaluate_env

    report = evaluate_env(
        engine,
        tokenizer,
        env,
        name=args.env,
        n=args.n,
        greedy=args.greedy,
        num_queries=args.max_problems,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    report.config.update(env_config=_printable(env_config_from_args(args)), split=args.split or None)
    return report


def _printable(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` for a JSON report: values that are not JSON data (a function, a tokenizer) as their repr."""
    return {
        k: v if isinstance(v, str | int | float | bool | type(None) | list | dict) else repr(v)
        for k, v in config.items()
    }


def _reasoning_gym_report(engine: GenerationEngine, tokenizer, args: argparse.Namespace) -> EvalReport:
    from r3_rllib.eval.reasoning_gym_eval import evaluate_reasoning_gym

    return evaluate_reasoning_gym(
        engine,
        tokenizer,
        _split_names(args.reasoning_gym),
        n=args.n,
        num_problems=args.max_problems or 100,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        env_options=args.reasoning_gym_env,
    )


def max_new_tokens_of(args: argparse.Namespace) -> int:
    """``--max-new-tokens``, else its default: the math benchmarks' 32k, or 1024 with ``--env``."""
    if args.max_new_tokens is not None:
        return int(args.max_new_tokens)
    return DEFAULT_ENV_MAX_NEW_TOKENS if getattr(args, "env", None) else DEFAULT_MAX_NEW_TOKENS


#: The report written when ``--out`` names an existing folder (its table beside it as ``results.md``).
DEFAULT_REPORT_NAME = "results.json"


def report_path(out: str | None) -> str | None:
    """Where ``--out`` writes the report, settled before the engine is built: an existing folder gets
    ``results.json`` inside it. Written as given, a folder failed with an IsADirectoryError after the whole
    evaluation (hours on the full benchmarks), and the report was lost."""
    if out is None:
        return None
    return str(Path(out) / DEFAULT_REPORT_NAME) if Path(out).is_dir() else out


def _check_data_dir(names: list[str], data_dir: str | None) -> None:
    """With ``--data-dir``: every benchmark's file is there, checked before the engine is built (loading a large
    model takes minutes)."""
    if data_dir is None:
        return
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir {data_dir} is not a folder")
    for name in names:
        if not local_path(name, data_dir).is_file():
            raise FileNotFoundError(
                f"benchmark {name!r}: {local_path(name, data_dir)} not found (with --data-dir, "
                "benchmarks are read only from <benchmark>.jsonl files there)"
            )


def run_eval(
    args: argparse.Namespace,
    *,
    engine_factory: Callable[..., GenerationEngine] | None = None,
    model_label: str | None = None,
) -> int:
    """``r3 eval``: evaluate a model on benchmarks, print the markdown table, optionally write JSON (and .md).
    ``model_label``: what the report names as the model (default ``--model``; ``r3 eval`` of a run passes the run's
    folder while ``--model`` is its export, cli.py)."""
    model = Path(args.model)
    if model.is_dir() and not (model / "config.json").is_file():
        print(
            f"r3 eval: error: --model {args.model}: a folder without config.json is neither a model folder nor a "
            "run of ours (runs/<name> with one trial, a trial's folder or a checkpoint folder)",
            file=sys.stderr,
        )
        return 2
    return _run_eval(args, engine_factory, model_label or str(args.model))


def _run_eval(
    args: argparse.Namespace, engine_factory: Callable[..., GenerationEngine] | None, model_label: str
) -> int:
    env_eval = getattr(args, "env", None)
    args.max_new_tokens = max_new_tokens_of(args)
    try:
        names = parse_benchmark_names(args.benchmarks)
        _check_data_dir(names, args.data_dir)
        args.out = report_path(args.out)
        model_path = build_model_path(args.model)  # builds a named model first
        _check_head(args, model_path)
    except (OSError, ValueError) as e:
        print(f"r3 eval: error: {e}", file=sys.stderr)
        return 2
    from r3_rllib.models.tiny import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or model_path)
    try:  # the env is built (its data read, its reward function imported) before the model is loaded
        env = _eval_env(args, tokenizer) if env_eval else None
    except (OSError, ValueError, TypeError) as e:
        print(f"r3 eval: error: --env {env_eval}: {e}", file=sys.stderr)
        return 2
    kind = args.engine or default_engine_kind()
    if engine_factory is None:
        from r3_rllib.engines import make_engine

        engine_factory = make_engine
    engine = engine_factory(kind, model_path, tokenizer, **_engine_kwargs(kind, args, model_path))
    try:
        report = (
            _env_report(engine, tokenizer, args, env)
            if env is not None
            else _reasoning_gym_report(engine, tokenizer, args)
            if args.reasoning_gym
            else evaluate(
                engine,
                tokenizer,
                names,
                n=args.n,
                temperature=args.temperature,
                top_p=args.top_p,
                max_new_tokens=args.max_new_tokens,
                data_dir=args.data_dir,
                max_problems=args.max_problems,
                prompt_template=args.prompt_template,
                apply_chat_template=not args.no_chat_template,
                batch_size=args.batch_size,
                seed=args.seed,
                progress=not args.quiet,
            )
        )
    except (OSError, ValueError) as e:
        print(f"r3 eval: error: {e}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()
    report.config.update(model=model_label, engine=kind, with_head=bool(getattr(args, "with_head", False)))
    return _print_report(report, args.out)


def _print_report(report: EvalReport, out_path: str | None) -> int:
    """The markdown table (and each env's mean reward) on stdout; the JSON and the table at ``out_path``. 1 when
    ``out_path`` cannot be written (permissions, a full disk): the table above is then the only copy, said so,
    rather than a traceback under it."""
    table = report.to_markdown()
    print(table)
    for r in report.results:
        if r.mean_reward is not None:
            print(f"{r.name}: mean reward {r.mean_reward:.4f} over {r.num_problems} queries x {r.n}")
    if not out_path:
        return 0
    try:
        out = report.to_json(out_path)
    except OSError as e:
        print(
            f"r3 eval: error: cannot write --out {out_path} ({e}); the table above is the result",
            file=sys.stderr,
        )
        return 1
    table_path = out.with_suffix(".md") if out.suffix != ".md" else out.with_name(out.name + ".table.md")
    try:
        table_path.write_text(table + "\n")
    except OSError as e:
        # The JSON (every number of the table) is written: say so, rather than that --out failed.
        print(f"wrote {out}; r3 eval: error: cannot write the table {table_path} ({e})", file=sys.stderr)
        return 1
    print(f"wrote {out} and {table_path}", file=sys.stderr)
    return 0
