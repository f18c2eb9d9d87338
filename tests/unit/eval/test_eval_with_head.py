"""`r3 eval --with-head`: the base policy by default (a head saved beside the model is ignored), the rollout-head
engine with the head on when asked; a missing head is an error before any engine is built."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS

from r3_rllib.cli import main as cli_main
from r3_rllib.engines.base import Completion, GenerationEngine
from r3_rllib.eval.evaluate import _engine_kwargs, add_eval_args, run_eval
from r3_rllib.models import default_tiny_model_path
from r3_rllib.models.rollout_head import RolloutHead, save_rollout_head

torch.set_num_threads(TORCH_THREADS)


def parse(argv):
    return add_eval_args(argparse.ArgumentParser()).parse_args(argv)


class FixedEngine(GenerationEngine):
    """Answers every prompt with a wrong boxed answer (no model)."""

    def generate(self, prompt_ids, n, params):
        return [
            [
                Completion(
                    prompt_ids=list(ids),
                    token_ids=[1, 2],
                    logprobs=np.zeros(2, dtype=np.float32),
                    entropies=np.zeros(2, dtype=np.float32),
                    finish_reason="stop",
                    text="\\boxed{999}",
                )
                for _ in range(n)
            ]
            for ids in prompt_ids
        ]

    def update_weights(self, named_tensors, version):
        raise NotImplementedError

    @property
    def version(self):
        return 0


class RecordingFactory:
    def __init__(self):
        self.calls: list[tuple[str, Path, dict]] = []

    def __call__(self, kind, model_path, tokenizer, **kwargs):
        self.calls.append((kind, Path(model_path), kwargs))
        return FixedEngine()


@pytest.fixture
def model_with_head(tmp_path) -> Path:
    """The shipped tiny model with a (strong, random) rollout head saved beside it."""
    path = tmp_path / "policy"
    shutil.copytree(default_tiny_model_path(), path)
    config = json.loads((path / "config.json").read_text())
    head = RolloutHead(config["hidden_size"], config["vocab_size"], init_std=0.5, seed=0)
    save_rollout_head(head, path)
    return path


@pytest.fixture
def data_dir(tmp_path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "math500.jsonl").write_text(
        json.dumps({"id": "m0", "problem": "What is 2+3?", "answer": "5"}) + "\n"
    )
    return d


def test_option_parses_and_defaults_off():
    assert parse(["--model", "m"]).with_head is False
    assert parse(["--model", "m", "--with-head"]).with_head is True


def test_engine_kwargs_select_the_rollout_head_engine(tmp_path):
    base = parse(["--model", "m"])
    head = parse(["--model", "m", "--with-head"])
    assert _engine_kwargs("hf", base, tmp_path) == {}
    assert _engine_kwargs("hf", head, tmp_path) == {"rollout_head": True, "rollout_logits": True}
    vllm_base = _engine_kwargs("vllm", base, tmp_path)
    vllm_head = _engine_kwargs("vllm", head, tmp_path)
    assert "rollout_head" not in vllm_base and vllm_base["logprobs_k"] == 0
    assert vllm_head == {**vllm_base, "rollout_head": True, "rollout_logits": True}


@pytest.mark.parametrize("with_head", [False, True])
def test_run_eval_builds_the_engine_for_the_option(model_with_head, data_dir, tmp_path, with_head, capsys):
    factory = RecordingFactory()
    argv = [
        "--model",
        str(model_with_head),
        "--benchmarks",
        "math500",
        "--data-dir",
        str(data_dir),
        "--n",
        "2",
    ]
    argv += ["--engine", "hf", "--quiet", "--out", str(tmp_path / "report.json")]
    argv += ["--with-head"] if with_head else []
    assert run_eval(parse(argv), engine_factory=factory) == 0
    [(kind, path, kwargs)] = factory.calls
    assert kind == "hf" and path == model_with_head
    if with_head:
        assert kwargs == {"rollout_head": True, "rollout_logits": True}
    else:
        assert "rollout_head" not in kwargs and "rollout_logits" not in kwargs
    assert json.loads((tmp_path / "report.json").read_text())["config"]["with_head"] is with_head
    assert "| math500 |" in capsys.readouterr().out


def test_with_head_without_a_saved_head_fails_before_the_engine(data_dir, capsys):
    def never_called(*args, **kwargs):
        raise AssertionError("the engine must not be built")

    argv = ["--model", str(default_tiny_model_path()), "--benchmarks", "math500", "--data-dir", str(data_dir)]
    assert run_eval(parse([*argv, "--with-head"]), engine_factory=never_called) == 2
    assert "--with-head: no rollout head" in capsys.readouterr().err


def test_cli_accepts_with_head(model_with_head, data_dir, monkeypatch, capsys):
    """`r3 eval --with-head` through the real command line, make_engine replaced by the recording factory."""
    factory = RecordingFactory()
    monkeypatch.setattr("r3_rllib.engines.make_engine", factory)
    argv = ["eval", "--model", str(model_with_head), "--benchmarks", "math500", "--data-dir", str(data_dir)]
    assert cli_main([*argv, "--n", "1", "--engine", "hf", "--quiet", "--with-head"]) == 0
    assert factory.calls[-1][2] == {"rollout_head": True, "rollout_logits": True}


def test_real_engines_from_the_kwargs(model_with_head):
    """The kwargs build what they promise: a plain HF engine (no head) by default, the saved head switched on with
    --with-head, and the two sample differently (the saved head is strong)."""
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.engines.rollout_head_sampling import RolloutHeadHFEngine
    from r3_rllib.models.rollout_head import get_rollout_head
    from r3_rllib.models.tiny import load_tokenizer

    tok = load_tokenizer(model_with_head)
    base = make_engine(
        "hf", model_with_head, tok, **_engine_kwargs("hf", parse(["--model", "m"]), model_with_head)
    )
    head = make_engine(
        "hf",
        model_with_head,
        tok,
        **_engine_kwargs("hf", parse(["--model", "m", "--with-head"]), model_with_head),
    )
    try:
        assert type(base) is HFEngine and get_rollout_head(base.model) is None
        assert isinstance(head, RolloutHeadHFEngine) and head.rollout_logits
        assert head.head.init_std == 0.5  # the saved head, not a fresh near-zero one
        prompt = [tok("12+34=", add_special_tokens=False)["input_ids"]]
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
        a = base.generate(prompt, 4, params)[0]
        b = head.generate(prompt, 4, params)[0]
        assert [c.token_ids for c in a] != [c.token_ids for c in b]
    finally:
        base.shutdown()
        head.shutdown()
