"""The TextWorld warm start: walkthrough pairs are the env's own prompts and parseable actions that win the games,
and a build of the same config is reused, not retrained (on the tiny model; no SmolLM2 run here)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("textworld")

from r3_rllib.envs.textworld_env import TextWorldEnv, parse_command  # noqa: E402
from r3_rllib.models.hub import SMOLLM2_TEXTWORLD_SFT, named_models  # noqa: E402
from r3_rllib.warmstart import named, textworld  # noqa: E402
from r3_rllib.warmstart.cached import read_metadata  # noqa: E402
from r3_rllib.warmstart.textworld import action_text, walkthrough_pairs  # noqa: E402

pytestmark = pytest.mark.slow  # compiling a game takes ~2.5 s


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("textworld")


def _env(cache, **kwargs) -> TextWorldEnv:
    # The warm start's own env (coin collector level 1); 2 games are compiled once for the module.
    return TextWorldEnv(level=1, num_games=2, cache_dir=cache, shuffle=False, **kwargs)


def test_walkthrough_pairs_are_the_env_prompts_and_win(cache):
    env = _env(cache, max_steps=4, memory=2)
    pairs = walkthrough_pairs(env)
    assert len(pairs) == sum(len(g.walkthrough) for g in env.games)
    i = 0
    for game in env.games:
        prompt, _ = env.reset(options={"query_id": game.query_id})
        for command in game.walkthrough:
            assert pairs[i] == (prompt, f"<action>{command}</action>")
            assert parse_command(pairs[i][1]) == command
            prompt, _, terminated, _, info = env.step(pairs[i][1])
            i += 1
        assert terminated and info["correct"]


def test_detours_keep_the_walkthrough_winning_and_their_prompts_are_the_envs(cache):
    # A memory as long as the horizon shows every past command, so the test can replay them through the env.
    env = _env(cache, max_steps=4, memory=4)
    pairs = walkthrough_pairs(env, detour=0.7, seed=3)
    assert len(pairs) == len(env.games)  # coin collector level 1: one walkthrough command per game
    assert any("Command: " in prompt for prompt, _ in pairs)  # some pairs come after detours
    for game, (prompt, response) in zip(env.games, pairs, strict=True):
        replayed, _ = env.reset(options={"query_id": game.query_id})
        for command in re.findall(r"^Command: (.*)$", prompt, flags=re.MULTILINE):
            assert command in ("look", "inventory")
            replayed, *_ = env.step(action_text(command))
        assert replayed == prompt and parse_command(response) == game.walkthrough[0]
        *_, info = env.step(response)
        assert info["correct"]
    with pytest.raises(ValueError, match="detour"):
        walkthrough_pairs(env, detour=1.0)


def test_build_is_skipped_when_up_to_date(cache, tmp_path, monkeypatch):
    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    monkeypatch.setenv("R3_TEXTWORLD_CACHE", str(cache))
    tokenizer = build_tiny_tokenizer()
    base = save_tiny(build_tiny_model(tokenizer, hidden=32, layers=1), tokenizer, tmp_path / "base")
    # The module's level-1 games (already compiled), not the default env's.
    env_config = {"level": 1, "max_steps": 4}
    kwargs = dict(
        base=str(base), games=1, steps=1, batch_size=2, env_config=env_config, log=lambda message: None
    )
    out = textworld.build_warm_start(tmp_path / "sft", **kwargs)
    meta = read_metadata(out, textworld.WARM_START_METADATA)
    assert (out / "config.json").is_file() and meta["pairs"] == 1 and meta["config"]["env"]["max_steps"] == 4

    def fail(config):
        raise AssertionError("an up-to-date warm start must not be retrained")

    monkeypatch.setattr(textworld, "train_warm_start", fail)
    assert textworld.build_warm_start(tmp_path / "sft", **kwargs) == out
    with pytest.raises(AssertionError, match="must not be retrained"):
        textworld.build_warm_start(tmp_path / "sft", **{**kwargs, "steps": 2})
    with pytest.raises(ValueError, match="not warm-start env settings"):
        textworld.warm_start_config(env_config={"num_games": 3})


def test_named_model_is_registered_with_a_builder():
    assert SMOLLM2_TEXTWORLD_SFT in named_models() and SMOLLM2_TEXTWORLD_SFT in named.NAMED_MODEL_BUILDERS
