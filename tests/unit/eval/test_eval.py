"""Benchmark evaluation: registry, pass@k arithmetic on a stub engine, prompts as in training, tiny-model runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS
from repo_paths import SHARED_DATA

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams
from r3_rllib.envs.math_env import MathEnv, render_user_text
from r3_rllib.eval import benchmarks as bench_mod
from r3_rllib.eval.benchmarks import BENCHMARKS, PAPER_BENCHMARKS, get_benchmark, load_benchmark
from r3_rllib.eval.evaluate import (
    PROMPT_TEMPLATE,
    BenchmarkResult,
    EvalReport,
    add_eval_args,
    evaluate,
    pass_at_k,
    render_prompts,
    run_eval,
)
from r3_rllib.models import (
    build_tiny_model_for_tokenizer,
    build_tiny_tokenizer,
    default_tiny_model_path,
    save_tiny,
)
from r3_rllib.models.tiny import load_tokenizer

torch.set_num_threads(TORCH_THREADS)

SHARED = SHARED_DATA
MATH_DIR = SHARED / "math"
R1_TOKENIZER = SHARED / "tokenizers" / "r1_distill_qwen_1.5b"
needs_math500 = pytest.mark.skipif(
    not (MATH_DIR / "math500.jsonl").is_file(), reason=f"shared data absent: {MATH_DIR / 'math500.jsonl'}"
)
needs_r1_tokenizer = pytest.mark.skipif(
    not R1_TOKENIZER.is_dir(), reason=f"shared tokenizer absent: {R1_TOKENIZER}"
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- pass@k -------------------------------------------------------------------------------------------------------------
def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(16, 16, 16) == 1.0
    for bad in [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_benchmark_result_from_samples():
    r = BenchmarkResult.from_samples(
        "b",
        ["p0", "p1"],
        correct=[[True, False, False, False], [True, True, True, True]],
        response_tokens=[[10, 20, 20, 20], [10, 10, 10, 10]],
        truncated=[[False, True, True, True], [False] * 4],
    )
    assert (r.num_problems, r.n, r.num_correct) == (2, 4, [1, 4])
    assert r.pass_at_1 == pytest.approx(5 / 8) and r.pass_at_n == pytest.approx(1.0)
    assert r.mean_response_tokens == pytest.approx(13.75) and r.truncated_frac == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="same number"):
        BenchmarkResult.from_samples("b", ["p0", "p1"], [[True], [True, False]], [[1], [1, 1]], [[0], [0, 0]])


# -- registry -----------------------------------------------------------------------------------------------------------
def test_registry_covers_the_paper_benchmarks():
    sizes = {name: BENCHMARKS[name].num_problems for name in PAPER_BENCHMARKS}
    assert sizes == {"aime24": 30, "amc": 83, "math500": 500, "minerva": 272, "olympiadbench": 675}
    assert {b.local_file for b in BENCHMARKS.values()} >= {
        "math500.jsonl",
        "aime24.jsonl",
        "olympiadbench.jsonl",
    }
    assert (
        get_benchmark("AIME") is BENCHMARKS["aime24"] and get_benchmark(" math-500 ") is BENCHMARKS["math500"]
    )


def test_unknown_benchmark_lists_known_and_closest():
    with pytest.raises(
        ValueError, match=r"unknown benchmark 'olympiadbenc' \(closest: 'olympiadbench'\); known .*aime24"
    ):
        get_benchmark("olympiadbenc")
    with pytest.raises(ValueError, match="unknown benchmark 'gsm8k'"):
        evaluate(None, None, "math500,gsm8k", progress=False)


def test_data_dir_missing_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "aime24.jsonl")):
        load_benchmark("aime24", data_dir=tmp_path)


def test_local_file_wins_and_hub_gets_registry_fields(tmp_path, monkeypatch):
    calls = []

    def fake_loader(source, **kwargs):
        calls.append((str(source), kwargs))
        from r3_rllib.envs.data import MathProblem

        return [MathProblem("h0", "hub problem", ("1",))]

    write_jsonl(tmp_path / "minerva.jsonl", [{"id": "m0", "problem": "local problem", "answer": "2"}])
    monkeypatch.setattr(bench_mod, "load_math_problems", fake_loader)
    load_benchmark("minerva", data_dir=tmp_path)
    assert calls[-1][0] == str(tmp_path / "minerva.jsonl")
    load_benchmark("olympiadbench", max_problems=7)
    source, kwargs = calls[-1]
    assert source == "math-ai/olympiadbench"
    assert kwargs == dict(
        split="test",
        problem_key="question",
        answer_key="final_answer",
        answers_key="answer",
        id_key="id",
        max_rows=7,
    )


@pytest.mark.parametrize(
    "name, row, answers",
    [
        # OlympiadBench as the loaders that use math-ai/olympiadbench read it, and as its dataset card describes it.
        (
            "olympiadbench",
            {"id": 7, "question": "q", "final_answer": ["$\\frac{1}{2}$"]},
            ("$\\frac{1}{2}$",),
        ),
        ("olympiadbench", {"id": 7, "question": "q", "answer": "12"}, ("12",)),
        # AMC's hub copy stores answers as floats.
        ("amc", {"id": 3, "problem": "q", "answer": 142.0}, ("142",)),
        ("minerva", {"question": "q", "answer": "0.5"}, ("0.5",)),
        (
            "math500",
            {"problem": "q", "answer": "\\sqrt{2}", "unique_id": "test/algebra/1.json"},
            ("\\sqrt{2}",),
        ),
    ],
)
def test_registry_fields_parse_hub_rows(tmp_path, name, row, answers):
    """The registry's field names read rows shaped like each hub copy (through the same loader as the hub path)."""
    from r3_rllib.envs.data import load_math_problems

    b = get_benchmark(name)
    write_jsonl(tmp_path / "rows.jsonl", [row])
    (problem,) = load_math_problems(
        str(tmp_path / "rows.jsonl"),
        problem_key=b.problem_key,
        answer_key=b.answer_key,
        answers_key=b.answers_key,
        id_key=b.id_key,
    )
    assert problem.problem == "q" and problem.answers == answers


def test_local_file_rows_and_bad_row(tmp_path):
    write_jsonl(
        tmp_path / "amc.jsonl",
        [{"id": f"a{i}", "problem": f"p{i}", "answer": str(i), "answers": [f"{i}.0"]} for i in range(5)],
    )
    problems = load_benchmark("amc", data_dir=tmp_path, max_problems=3)
    assert [p.id for p in problems] == ["a0", "a1", "a2"] and problems[1].answers == ("1", "1.0")
    write_jsonl(tmp_path / "aime24.jsonl", [{"id": "x", "problem": "p"}])
    with pytest.raises(ValueError, match=r"aime24\.jsonl: row 0 .*field 'answer'"):
        load_benchmark("aime24", data_dir=tmp_path)


# -- stub engine: known answers -> hand-computed metrics ----------------------------------------------------------------
class StubEngine(GenerationEngine):
    """Answers problem text -> (gold, number correct): the first c samples are right (10 tokens, stopped), the rest
    wrong and cut off (20 tokens)."""

    def __init__(self, tokenizer, plan: dict[str, tuple[str, int]]):
        self.tokenizer = tokenizer
        self.plan = plan
        self.calls: list[tuple[list[str], int, SamplingParams]] = []

    def generate(self, prompt_ids, n, params):
        texts = [self.tokenizer.decode(ids) for ids in prompt_ids]
        self.calls.append((texts, n, params))
        out = []
        for ids, text in zip(prompt_ids, texts, strict=True):
            (gold, c) = next(v for k, v in self.plan.items() if k in text)
            group = []
            for j in range(n):
                ok = j < c
                group.append(
                    Completion(
                        prompt_ids=list(ids),
                        token_ids=list(range(10 if ok else 20)),
                        logprobs=np.zeros(10 if ok else 20, dtype=np.float32),
                        entropies=np.zeros(10 if ok else 20, dtype=np.float32),
                        finish_reason="stop" if ok else "length",
                        text=f"So the answer is \\boxed{{{gold if ok else 999}}}.",
                    )
                )
            out.append(group)
        return out

    def update_weights(self, named_tensors, version):
        raise NotImplementedError

    @property
    def version(self):
        return 0


def make_stub_suite(tmp_path):
    write_jsonl(
        tmp_path / "data" / "math500.jsonl",
        [
            {"id": "m0", "problem": "What is six times seven?", "answer": "42"},
            {"id": "m1", "problem": "What is two plus three?", "answer": "5"},
        ],
    )
    write_jsonl(
        tmp_path / "data" / "amc.jsonl",
        [
            {"id": "a0", "problem": "How many sides has a hexagon?", "answer": 6.0},
            {"id": "a1", "problem": "What is ten squared?", "answer": "100"},
        ],
    )
    plan = {
        "six times seven": ("42", 1),
        "two plus three": ("5", 4),
        "hexagon": ("6", 0),
        "ten squared": ("100", 2),
    }
    return tmp_path / "data", plan


def test_stub_engine_metrics_and_outputs(tmp_path):
    data_dir, plan = make_stub_suite(tmp_path)
    tokenizer = build_tiny_tokenizer()  # one token per character: the stub reads prompts back exactly
    engine = StubEngine(tokenizer, plan)
    report = evaluate(
        engine,
        tokenizer,
        ["math500", "amc"],
        n=4,
        max_new_tokens=20,
        data_dir=data_dir,
        apply_chat_template=False,
        batch_size=1,
        seed=3,
        progress=False,
    )
    m, a = report["math500"], report["amc"]
    assert (m.num_problems, m.n, m.num_correct, m.problem_ids) == (2, 4, [1, 4], ["m0", "m1"])
    assert m.pass_at_1 == pytest.approx(5 / 8) and m.pass_at_n == pytest.approx(1.0)
    assert m.mean_response_tokens == pytest.approx((5 * 10 + 3 * 20) / 8)
    assert m.truncated_frac == pytest.approx(3 / 8)
    assert a.num_correct == [0, 2]
    assert a.pass_at_1 == pytest.approx(2 / 8) and a.pass_at_n == pytest.approx(0.5)
    avg = report.average
    assert avg["pass_at_1"] == pytest.approx((5 / 8 + 2 / 8) / 2) and avg["pass_at_n"] == pytest.approx(0.75)
    assert avg["num_problems"] == 4

    # Prompts are the training prompts; sampling settings and a fresh seed per engine call reach the engine.
    texts, n, params = engine.calls[0]
    assert texts == [render_user_text("What is six times seven?", PROMPT_TEMPLATE)]
    assert texts[0].endswith("Let's think step by step and output the final answer within \\boxed{}.")
    assert n == 4 and (params.temperature, params.top_p, params.max_new_tokens) == (0.6, 0.95, 20)
    assert params.stop_token_ids == (tokenizer.eos_token_id,)
    assert [c[2].seed for c in engine.calls] == [3, 4, 5, 6]

    md = report.to_markdown()
    lines = md.splitlines()
    assert lines[0].startswith("| benchmark | problems | pass@1 (avg@4) % | pass@4 %")
    assert lines[2] == "| math500 | 2 | 62.5 | 100.0 | 14 | 37.5 |"
    assert lines[3] == "| amc | 2 | 25.0 | 50.0 | 18 | 75.0 |"
    assert lines[4].startswith("| **average** | 4 | 43.8 | 75.0 |")

    out = report.to_json(tmp_path / "out" / "r.json")
    loaded = json.loads(out.read_text())
    assert loaded["benchmarks"]["math500"]["num_correct"] == [1, 4]
    assert loaded["average"]["pass_at_n"] == pytest.approx(0.75)
    assert loaded["config"]["n"] == 4 and loaded["config"]["benchmarks"] == ["math500", "amc"]


def test_engine_returning_wrong_shape_is_caught(tmp_path):
    data_dir, plan = make_stub_suite(tmp_path)
    tokenizer = build_tiny_tokenizer()

    class Short(StubEngine):
        def generate(self, prompt_ids, n, params):
            return [g[:-1] for g in super().generate(prompt_ids, n, params)]

    with pytest.raises(RuntimeError, match="completions for 2 prompts x n=4"):
        evaluate(
            Short(tokenizer, plan),
            tokenizer,
            "amc",
            n=4,
            data_dir=data_dir,
            apply_chat_template=False,
            progress=False,
        )


@needs_r1_tokenizer
def test_prompts_match_math_env_with_chat_template():
    tokenizer = load_tokenizer(R1_TOKENIZER)
    from r3_rllib.envs.data import MathProblem

    problems = [MathProblem("q0", "Compute $1+1$.", ("2",))]
    rendered = render_prompts(tokenizer, problems, PROMPT_TEMPLATE, apply_chat_template=True)
    env = MathEnv(data=problems, tokenizer=tokenizer)
    obs, _ = env.reset(options={"query_id": "q0"})
    assert rendered.texts == [obs]
    assert obs.rstrip().endswith("<think>") and rendered.think_in_prompt == [True]
    assert rendered.token_ids[0] == tokenizer(obs, add_special_tokens=False)["input_ids"]
    assert rendered.token_ids[0][0] == tokenizer.bos_token_id  # the template writes BOS once


# -- CLI ----------------------------------------------------------------------------------------------------------------
def parse(argv):
    return add_eval_args(argparse.ArgumentParser()).parse_args(argv)


def never_called(*args, **kwargs):
    raise AssertionError("the engine must not be built when the inputs are bad")


def test_cli_errors_before_building_the_engine(tmp_path, capsys):
    model = default_tiny_model_path()
    assert (
        run_eval(parse(["--model", str(model), "--benchmarks", "math5000"]), engine_factory=never_called) == 2
    )
    assert "closest: 'math500'" in capsys.readouterr().err
    args = parse(["--model", str(model), "--benchmarks", "aime24", "--data-dir", str(tmp_path)])
    assert run_eval(args, engine_factory=never_called) == 2
    assert str(tmp_path / "aime24.jsonl") in capsys.readouterr().err
    assert run_eval(parse(["--model", str(tmp_path / "nope")]), engine_factory=never_called) == 2
    assert "no model folder" in capsys.readouterr().err


# -- real tiny models through the HF engine -----------------------------------------------------------------------------
def check_report_file(path: Path, n: int, num_problems: int, max_new_tokens: int):
    data = json.loads(path.read_text())
    r = data["benchmarks"]["math500"]
    assert r["n"] == n and r["num_problems"] == num_problems and len(r["num_correct"]) == num_problems
    for key in ("pass_at_1", "pass_at_n", "truncated_frac"):
        assert 0.0 <= r[key] <= 1.0
    assert r["pass_at_1"] <= r["pass_at_n"]
    assert 0 < r["mean_response_tokens"] <= max_new_tokens
    assert path.with_suffix(".md").read_text().startswith("| benchmark |")
    return data


@needs_math500
def test_cli_shipped_tiny_model(tmp_path, capsys):
    out = tmp_path / "results.json"
    argv = [
        "--model",
        str(default_tiny_model_path()),
        "--engine",
        "hf",
        "--data-dir",
        str(MATH_DIR),
        "--benchmarks",
        "math500",
        "--max-problems",
        "3",
        "--n",
        "2",
        "--max-new-tokens",
        "6",
        "--no-chat-template",
        "--quiet",
        "--out",
        str(out),
    ]
    assert run_eval(parse(argv)) == 0
    printed = capsys.readouterr().out
    assert "| math500 | 3 |" in printed
    data = check_report_file(out, n=2, num_problems=3, max_new_tokens=6)
    assert data["config"]["engine"] == "hf" and data["config"]["apply_chat_template"] is False
    assert data["benchmarks"]["math500"]["problem_ids"] == ["math500-0", "math500-1", "math500-2"]


@pytest.mark.slow
@needs_math500
@needs_r1_tokenizer
def test_tiny_random_qwen2_with_real_tokenizer(tmp_path):
    from r3_rllib.engines import make_engine

    tokenizer = load_tokenizer(R1_TOKENIZER)
    model = build_tiny_model_for_tokenizer(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1)
    path = save_tiny(model, tokenizer, tmp_path / "model")
    engine = make_engine("hf", path, tokenizer)
    report = evaluate(
        engine, tokenizer, "math500", n=2, max_new_tokens=5, data_dir=MATH_DIR, max_problems=2, progress=False
    )
    assert isinstance(report, EvalReport) and [r.name for r in report.results] == ["math500"]
    r = report["math500"]
    assert r.num_problems == 2 and r.n == 2 and 0 < r.mean_response_tokens <= 5
    assert r.truncated_frac > 0  # a random model does not stop within 5 tokens on every sample
    report.to_json(tmp_path / "r.json")
    (tmp_path / "r.md").write_text(report.to_markdown())
    check_report_file(tmp_path / "r.json", n=2, num_problems=2, max_new_tokens=5)


@needs_math500
@pytest.mark.slow
@pytest.mark.vllm
def test_cli_vllm_engine(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "results.json"
    argv = [
        "--model",
        str(default_tiny_model_path()),
        "--engine",
        "vllm",
        "--data-dir",
        str(MATH_DIR),
        "--benchmarks",
        "math500",
        "--max-problems",
        "2",
        "--n",
        "2",
        "--max-new-tokens",
        "6",
        "--no-chat-template",
        "--quiet",
        "--out",
        str(out),
    ]
    assert run_eval(parse(argv)) == 0
    data = check_report_file(out, n=2, num_problems=2, max_new_tokens=6)
    assert data["config"]["engine"] == "vllm"


@pytest.mark.slow  # three new processes, each importing transformers
@pytest.mark.parametrize(
    "first",
    ["import r3_rllib.eval.evaluate", "from r3_rllib.eval import run_eval", "import r3_rllib.eval"],
    ids=["submodule-first", "other-name-first", "package-only"],
)
def test_the_packages_evaluate_is_the_function_whatever_was_imported_first(first):
    """`r3_rllib.eval.evaluate` names the function (as when the package imported it eagerly), also after its
    submodule was imported on its own (as `r3 eval` does): new processes, since imports are once per process."""
    import subprocess
    import sys

    code = f"{first}\nfrom r3_rllib.eval import evaluate\nimport r3_rllib.eval as e\nprint(callable(evaluate), type(e.evaluate).__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["True", "function"], done.stderr[-2000:]
