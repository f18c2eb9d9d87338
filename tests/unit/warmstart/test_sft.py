from __future__ import annotations

import math

import pytest
import torch
from numeric import TORCH_THREADS

from r3_rllib.models import default_tiny_model_path, load_tiny
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer
from r3_rllib.warmstart import arithmetic as sft
from r3_rllib.warmstart.arithmetic import (
    SFTConfig,
    encode_sft_batch,
    evaluate_exact_match,
    heldout_problems,
    lr_factor,
    read_metadata,
    train_sft,
    training_pool,
    warm_start_tiny,
)

# The band the shipped checkpoint is documented to fall in (assets/README.md): room for RL to improve.
SHIPPED_ACCURACY_BAND = (0.30, 0.70)

# 1-digit addition with a small model learns in seconds.
QUICK = dict(
    digits=1, num_eval=20, train_pool=60, hidden=64, layers=2, lr=3e-3, warmup_steps=10, batch_size=64
)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(TORCH_THREADS)


class P:
    def __init__(self, expression: str, answer: str) -> None:
        self.expression, self.answer = expression, answer


def test_encode_sft_batch_masks_only_answer_and_eos():
    tok = build_tiny_tokenizer()
    ids, attn, loss_mask = encode_sft_batch([P("12+34", "46"), P("1+2", "3")], tok)
    first = tok.encode("12+34=46") + [tok.eos_token_id]
    second = tok.encode("1+2=3") + [tok.eos_token_id] + [tok.pad_token_id] * 3
    assert ids.tolist() == [first, second]
    assert attn.tolist() == [[1] * 9, [1] * 6 + [0] * 3]
    # Position t predicts token t+1: targets "4", "6", eos sit at positions 5, 6, 7 (row 1: "3", eos at 3, 4).
    assert loss_mask.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0]]


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = SFTConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # 0.55
    assert lr_factor(110, cfg) == pytest.approx(0.1)


def test_heldout_and_training_problems_are_disjoint():
    cfg = SFTConfig(num_eval=200, steps=10)
    held = {p.expression for p in heldout_problems(cfg)}
    pool = {p.expression for p in training_pool(cfg)}
    assert len(held) == 200 and len(pool) == 10 * 64
    assert not held & pool


@pytest.mark.slow
def test_short_sft_run_lowers_loss_and_learns():
    cfg = SFTConfig(steps=120, eval_every=40, **QUICK)
    tok = build_tiny_tokenizer()
    untrained = build_tiny_model(tok, hidden=64, layers=2)
    pool = training_pool(cfg)
    assert evaluate_exact_match(untrained, tok, pool) <= 0.05
    model, tok, metrics = train_sft(cfg, log=lambda _: None)
    losses = [h["loss"] for h in metrics["history"]]
    assert losses[-1] < 0.5 * losses[0]
    assert evaluate_exact_match(model, tok, pool) >= 0.8
    assert metrics["heldout_accuracy"] >= 0.3


def test_training_is_deterministic_for_a_seed():
    cfg = SFTConfig(steps=5, eval_every=5, **QUICK)
    a = train_sft(cfg, log=lambda _: None)[0].state_dict()
    b = train_sft(cfg, log=lambda _: None)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_warm_start_caches_by_config(tmp_path, monkeypatch):
    kwargs = dict(digits=1, steps=3, eval_every=3, num_eval=20, train_pool=60, cache_dir=tmp_path, log=print)
    first = warm_start_tiny(**kwargs)
    assert first.parent == tmp_path and (first / "model.safetensors").is_file()
    meta = read_metadata(first)
    assert meta["steps_trained"] == 3 and meta["config"]["digits"] == 1

    def fail(*args, **kwargs):
        raise AssertionError("a cached checkpoint must not be retrained")

    monkeypatch.setattr(sft, "train_sft", fail)
    assert warm_start_tiny(**kwargs) == first
    with pytest.raises(AssertionError, match="must not be retrained"):
        warm_start_tiny(**{**kwargs, "seed": 1})


def test_warm_start_uses_r3_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("R3_CACHE_DIR", str(tmp_path))
    path = warm_start_tiny(digits=1, steps=1, eval_every=1, num_eval=20, train_pool=60, log=lambda _: None)
    assert path.parent == tmp_path


def test_main_prints_accuracy_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "ckpt"
    argv = ["--out", str(out), "--steps", "2", "--digits", "1", "--num-eval", "20", "--train-pool", "60"]
    assert sft.main(argv) == 0
    printed = capsys.readouterr().out
    assert "held-out greedy exact match" in printed and (out / "config.json").is_file()
    assert sft.main(["--", "--out", str(tmp_path / "bad"), "--steps", "0"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err
    too_many = ["--out", str(tmp_path / "bad"), "--digits", "1", "--num-eval", "20", "--train-pool", "100"]
    assert sft.main(too_many) == 2
    assert "train_pool=100" in capsys.readouterr().err


def test_shipped_checkpoint_accuracy_is_in_the_documented_band():
    path = default_tiny_model_path()
    meta = read_metadata(path)
    assert meta is not None, "the shipped checkpoint lacks its training metadata"
    cfg = SFTConfig(**meta["config"])
    model, tok = load_tiny(path)
    problems = heldout_problems(cfg)
    accuracy = evaluate_exact_match(model, tok, problems)
    lo, hi = SHIPPED_ACCURACY_BAND
    assert lo <= accuracy <= hi, f"shipped checkpoint held-out accuracy {accuracy:.3f} outside [{lo}, {hi}]"
    # A count, not a float: greedy answers whose top two tokens nearly tie can flip with the CPU's kernels (other
    # rounding); up to 10 of the 1000 held-out problems (1 %) may, a retrained or wrong checkpoint moves many more.
    assert accuracy == pytest.approx(meta["heldout_accuracy"], abs=10 / len(problems))


def test_sft_args_wire_into_a_parent_cli(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="r3")
    sft.add_sft_args(parser.add_subparsers(dest="cmd").add_parser("sft")).set_defaults(func=sft.run_sft)
    args = parser.parse_args(
        ["sft", "--out", str(tmp_path), "--steps", "1", "--digits", "1", "--num-eval", "20"]
        + ["--train-pool", "60"]
    )
    assert args.func(args) == 0
    assert "held-out greedy exact match" in capsys.readouterr().out
