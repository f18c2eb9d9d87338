"""How far a small generative judge agrees with the rule grader: SmolLM2-135M-Instruct judging SmolLM2's own answers.

    python bench/bench_judge_agreement.py                          # 200 answers, 2 rubrics, 20 groups of 4
    python bench/bench_judge_agreement.py --questions 10 --groups 5 --rubrics default   # a quick look

Answers: SmolLM2-135M-Instruct answers ``--questions`` sums of two ``--digits``-digit numbers of :class:`ChatArithmeticEnv` through its chat
template, ``--samples`` answers each at temperature ``--temperature`` (seeded), so both right and wrong answers occur;
the env's rule grader (the last integer of the answer against the sum) says which are right.

Judge (:class:`~r3_rllib.reward_models.judge.GenerativeJudge`): the same model, HF engine (``--engine``), greedy, at
most ``--judge-tokens`` tokens, on every answer with the prompt the policy saw, the answer and the gold sum, under
each rubric of ``--rubrics``: ``default`` (the judge's default rubric: explain, then a last line ``Verdict:
correct|incorrect``) and ``verdict_first`` (:data:`VERDICT_FIRST`: one sentence that asks the reply to start with the
verdict, which a 135M model follows more often). Reported per rubric: agreement with the rule grader, Cohen's kappa
and the confusion matrix, with an unparsable verdict counted as "incorrect" (the reward the run would get: 0) and
among parsed verdicts only; the unparsable rate; judge seconds per answer.

Group judge (:class:`~r3_rllib.reward_models.group_judge.GroupJudge`, default rubric): ``--groups`` groups of the
``--samples`` answers to one question, the groups with both right and wrong answers first. Reported: pairwise
agreement (over each group's (right, wrong) pairs, the fraction where the right answer scored higher; a tie counts
one half), the mean Spearman correlation of scores with correctness over mixed groups, the unparsable rate and
seconds per group.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

#: A one-sentence rubric that asks for the verdict first (small judges follow "start with" better than "end with").
VERDICT_FIRST = (
    'A student answered the question "{question}" with: "{response}". The correct answer is {gold}. Did the student '
    "get it right? Start your reply with 'Verdict: correct' or 'Verdict: incorrect'."
)
RUBRICS = {"default": None, "verdict_first": VERDICT_FIRST}


@dataclass(frozen=True)
class Answer:
    query_id: str
    prompt_text: str
    response: str
    gold: str
    correct: bool


def generate_answers(model_path: str, args: argparse.Namespace) -> list[list[Answer]]:
    """``--samples`` answers of the model to each of ``--questions`` sums, graded by the env; one list per
    question."""
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.envs.chat_arithmetic import ChatArithmeticEnv
    from r3_rllib.models.tiny import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    env = ChatArithmeticEnv(
        tokenizer=tokenizer, digits=args.digits, num_queries=args.questions, seed=args.seed
    )
    engine = make_engine("hf", model_path, tokenizer, max_batch_size=64)
    prompts, infos = [], []
    for _ in range(args.questions):
        prompt, info = env.reset()
        prompts.append(prompt)
        infos.append(info)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    params = SamplingParams(max_new_tokens=32, temperature=args.temperature, seed=args.seed)
    completions = engine.generate(ids, args.samples, params)
    groups = []
    for prompt, info, samples in zip(prompts, infos, completions, strict=True):
        group = []
        for completion in samples:
            response = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            env.reset(options={"query_id": info["query_id"]})
            _, _, _, _, step_info = env.step(response)
            correct = bool(step_info["correct"])
            group.append(Answer(info["query_id"], prompt, response, step_info["gold"], correct))
        groups.append(group)
    return groups


def cohen_kappa(rule: list[bool], judge: list[bool]) -> float:
    """Cohen's kappa of two binary labelings (nan when chance agreement is 1)."""
    n = len(rule)
    observed = sum(a == b for a, b in zip(rule, judge, strict=True)) / n
    p_rule, p_judge = sum(rule) / n, sum(judge) / n
    chance = p_rule * p_judge + (1 - p_rule) * (1 - p_judge)
    return float("nan") if chance == 1 else (observed - chance) / (1 - chance)


def agreement_stats(answers: list[Answer], scores: list) -> dict[str, float | int]:
    """Agreement, kappa and confusion counts of the judge's verdicts (value >= 0.5: correct) against the rule's."""
    rule = [a.correct for a in answers]
    judged = [s.value >= 0.5 for s in scores]
    parsed = [i for i, s in enumerate(scores) if s.reason is None]
    stats: dict[str, float | int] = {
        "n": len(answers),
        "rule_correct": sum(rule),
        "unparsable": sum(s.reason == "judge_unparsable" for s in scores),
        "other_reasons": sum(s.reason not in (None, "judge_unparsable") for s in scores),
        "agreement": sum(a == b for a, b in zip(rule, judged, strict=True)) / len(answers),
        "kappa": cohen_kappa(rule, judged),
        "parsed": len(parsed),
    }
    if parsed:
        stats["agreement_parsed"] = sum(rule[i] == judged[i] for i in parsed) / len(parsed)
        stats["kappa_parsed"] = cohen_kappa([rule[i] for i in parsed], [judged[i] for i in parsed])
    for r_name, r in (("right", True), ("wrong", False)):
        rows = [i for i in range(len(rule)) if rule[i] == r]
        stats[f"{r_name}->correct"] = sum(scores[i].reason is None and judged[i] for i in rows)
        stats[f"{r_name}->incorrect"] = sum(scores[i].reason is None and not judged[i] for i in rows)
        stats[f"{r_name}->unparsable"] = sum(scores[i].reason is not None for i in rows)
    return stats


def average_ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (Pearson on average ranks); nan when either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return float("nan") if vx == 0 or vy == 0 else cov / (vx * vy) ** 0.5


def group_stats(groups: list[list[Answer]], scores: list[list]) -> dict[str, float | int]:
    """Pairwise agreement and mean Spearman of the group judge's scores with correctness (module docstring)."""
    pairs = wins = 0.0
    rhos = []
    unparsable = 0
    for group, group_scores in zip(groups, scores, strict=True):
        if any(s.reason is not None for s in group_scores):
            unparsable += 1
        values = [s.value for s in group_scores]
        for a, va in zip(group, values, strict=True):
            for b, vb in zip(group, values, strict=True):
                if a.correct and not b.correct:
                    pairs += 1
                    wins += 1.0 if va > vb else 0.5 if va == vb else 0.0
        if len({a.correct for a in group}) == 2:
            rhos.append(spearman(values, [float(a.correct) for a in group]))
    finite = [r for r in rhos if r == r]
    return {
        "groups": len(groups),
        "mixed_groups": len(rhos),
        "unparsable_groups": unparsable,
        "pairwise_agreement": wins / pairs if pairs else float("nan"),
        "pairs": int(pairs),
        "spearman_mean": sum(finite) / len(finite) if finite else float("nan"),
        "spearman_defined": len(finite),
    }


def judged_groups(groups: list[list[Answer]], count: int) -> list[list[Answer]]:
    """``count`` groups, those with both right and wrong answers first (in question order)."""
    mixed = [g for g in groups if len({a.correct for a in g}) == 2]
    rest = [g for g in groups if len({a.correct for a in g}) < 2]
    return (mixed + rest)[:count]


def requests_of(answers: list[Answer]) -> list:
    from r3_rllib.rewards.scoring import RewardRequest

    return [
        RewardRequest(a.query_id, a.prompt_text, a.response, float(a.correct), a.correct, a.gold)
        for a in answers
    ]


def run_judges(model_path: str, groups: list[list[Answer]], args: argparse.Namespace) -> dict[str, dict]:
    """The single-answer judge under each rubric and the group judge; their statistics and times."""
    from r3_rllib.reward_models.group_judge import GroupJudge
    from r3_rllib.reward_models.judge import GenerativeJudge
    from r3_rllib.reward_models.specs import RewardModelSpec

    answers = [a for g in groups for a in g]
    base = dict(
        model=model_path, engine=args.engine, max_new_tokens=args.judge_tokens, batch_size=args.batch_size
    )
    judge = GenerativeJudge(RewardModelSpec(name="judge", type="judge", **base))
    results: dict[str, dict] = {}
    for name in args.rubrics.split(","):
        judge.rubric = RUBRICS[name]
        start = time.perf_counter()
        scores = judge.score(requests_of(answers))
        seconds = time.perf_counter() - start
        results[name] = {**agreement_stats(answers, scores), "s_per_answer": seconds / len(answers)}
        print(f"rubric {name}: {results[name]}", flush=True)
    judge.model.shutdown()
    if args.groups:
        chosen = judged_groups(groups, args.groups)
        group_judge = GroupJudge(RewardModelSpec(name="group", type="group_judge", **base))
        start = time.perf_counter()
        scores = group_judge.score_groups([requests_of(g) for g in chosen])
        seconds = time.perf_counter() - start
        results["group"] = {**group_stats(chosen, scores), "s_per_group": seconds / len(chosen)}
        print(f"group judge: {results['group']}", flush=True)
    return results


def report(results: dict[str, dict], args: argparse.Namespace, generation_s: float) -> None:
    rows = []
    for name, r in results.items():
        if name == "group":
            continue
        rows.append(
            [
                name,
                f"{r['agreement']:.3f}",
                f"{r['kappa']:.3f}",
                f"{r.get('agreement_parsed', float('nan')):.3f}",
                f"{r.get('kappa_parsed', float('nan')):.3f}",
                f"{r['unparsable'] / r['n']:.3f}",
                f"{r['right->correct']}/{r['right->incorrect']}/{r['right->unparsable']}",
                f"{r['wrong->correct']}/{r['wrong->incorrect']}/{r['wrong->unparsable']}",
                f"{r['s_per_answer']:.2f}",
            ]
        )
    headers = ["rubric", "agreement", "kappa", "agreement (parsed)", "kappa (parsed)", "unparsable"]
    headers += ["rule right -> judge correct/incorrect/unparsable", "rule wrong -> same", "judge s/answer"]
    print(common.markdown_table(headers, rows))
    first = next(iter(results.values()))
    print(
        f"\nanswers: {first['n']} ({first['rule_correct']} right by the rule grader); generation {generation_s:.0f} s"
    )
    if "group" in results:
        g = results["group"]
        print(
            f"group judge: {g['groups']} groups of {args.samples} ({g['mixed_groups']} mixed): pairwise agreement "
            f"{g['pairwise_agreement']:.3f} over {g['pairs']} pairs, mean Spearman {g['spearman_mean']:.3f} "
            f"({g['spearman_defined']} defined), unparsable groups {g['unparsable_groups']}, {g['s_per_group']:.2f} s/group"
        )
    parts = [
        f"{name}: agreement {r['agreement']:.2f}, kappa {r['kappa']:.2f}, unparsable {r['unparsable'] / r['n']:.0%}, "
        f"{r['s_per_answer']:.2f} s/answer"
        for name, r in results.items()
        if name != "group"
    ]
    line = (
        f"BENCHMARKS: SmolLM2-135M-Instruct judge ({args.engine}, greedy, {args.judge_tokens} tokens) vs rule grader "
        f"on {first['n']} SmolLM2 answers to {args.digits}-digit sums ({first['rule_correct']} right): "
        + "; ".join(parts)
    )
    if "group" in results:
        g = results["group"]
        line += (
            f"; group judge {g['groups']}x{args.samples}: pairwise {g['pairwise_agreement']:.2f}, Spearman "
            f"{g['spearman_mean']:.2f}, unparsable {g['unparsable_groups']}/{g['groups']} groups"
        )
    print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--samples", type=int, default=4, help="answers per question (the group size)")
    ap.add_argument("--digits", type=int, default=1, help="digits of each operand of the sums")
    ap.add_argument("--temperature", type=float, default=0.8, help="the answers' sampling temperature")
    ap.add_argument("--judge-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16, help="judge prompts per engine call")
    ap.add_argument("--groups", type=int, default=20, help="groups for the group judge (0: skip it)")
    ap.add_argument(
        "--rubrics", default="default,verdict_first", help=f"comma-separated of {', '.join(RUBRICS)}"
    )
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="2 questions x 2 answers, 1 group, 8 judge tokens")
    args = ap.parse_args()
    if args.smoke:
        args.questions, args.samples, args.groups, args.judge_tokens = 2, 2, 1, 8
    unknown = set(args.rubrics.split(",")) - set(RUBRICS)
    if unknown:
        ap.error(f"unknown rubrics {sorted(unknown)}; known: {', '.join(RUBRICS)}")
    common.setup_process(args.threads)
    from r3_rllib.models.smollm2 import ModelUnavailableError, build_smollm2

    try:
        model_path = str(build_smollm2(download=False))
    except ModelUnavailableError as e:
        print(f"bench_judge_agreement: SmolLM2-135M is not available: {e}", file=sys.stderr)
        return 0
    common.print_header("bench_judge_agreement", args)
    start = time.perf_counter()
    groups = generate_answers(model_path, args)
    generation_s = time.perf_counter() - start
    report(run_judges(model_path, groups, args), args, generation_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
