"""The TextWorld env: games generated and compiled once per seed, held-out games, prompts, the game's handling of
invalid commands, rewards from the score, restore mid-episode, and the lockstep multi-step rollout loop."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("textworld")

from r3_rllib.engines.base import Completion, SamplingParams  # noqa: E402
from r3_rllib.envs.textworld_env import TextWorldEnv, _clean, parse_command  # noqa: E402
from r3_rllib.rollout.kinds.multi_step import episode_stats, rollout_multistep  # noqa: E402

pytestmark = pytest.mark.slow  # compiling a game takes ~2.5 s


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("textworld")


@pytest.fixture(scope="module")
def env(cache):
    # Level 2 coin collector: the coin is one room away, so winning takes two commands.
    return TextWorldEnv(level=2, num_games=2, max_steps=4, memory=1, cache_dir=cache, seed=0)


def _walkthrough(env: TextWorldEnv, query_id: str) -> list[str]:
    return list(next(g for g in env.games if g.query_id == query_id).walkthrough)


def test_pools_are_cached_and_test_games_are_held_out(env, cache):
    test = TextWorldEnv(level=2, num_games=1, split="test", cache_dir=cache)
    assert len(env) == 2 and len(test) == 1
    assert not {g.key for g in test.games} & {g.key for g in env.games}
    mtimes = [g.path.stat().st_mtime_ns for g in env.games]
    again = TextWorldEnv(level=2, num_games=2, cache_dir=cache)  # built once: loaded, not recompiled
    assert [g.path.stat().st_mtime_ns for g in again.games] == mtimes


def test_walkthrough_wins_with_the_normalised_score(env):
    qid = env.query_ids[0]
    prompt, info = env.reset(options={"query_id": qid})
    assert "Your goal:" in prompt and "Admissible commands:" in prompt and "<action>" in prompt
    rewards, step_info = [], {}
    for command in _walkthrough(env, qid):
        _, reward, terminated, truncated, step_info = env.step(f"I will do it. <action>{command}</action>")
        rewards.append(reward)
    assert terminated and not truncated and step_info["correct"]
    assert sum(rewards) == pytest.approx(1.0) and rewards[-1] > 0


def test_invalid_commands_are_answered_by_the_game_and_episodes_truncate(env):
    qid = env.query_ids[1]
    env.reset(options={"query_id": qid})
    prompt, reward, terminated, truncated, info = env.step("<action>dance wildly</action>")
    assert info["invalid"] and reward == 0.0 and not terminated
    assert "not a verb" in prompt.lower() or "recognise" in prompt.lower()  # the game's own reply, in memory
    assert "Command: dance wildly" in prompt
    for _ in range(3):
        _, _, terminated, truncated, info = env.step("look")
    assert truncated and not terminated and not info["correct"]


def test_restore_mid_episode_replays_the_commands(env):
    qid = env.query_ids[0]
    env.reset(options={"query_id": qid})
    first = _walkthrough(env, qid)[0]
    env.step(f"<action>{first}</action>")
    state = env.state()
    expected = env._episode.obs_key
    env.reset()
    env.set_state(state)
    assert env._episode.obs_key == expected and env._episode.steps == 1


def test_parse_command():
    assert parse_command("think <action> go  east </action> then <action>take coin</action>") == "take coin"
    assert parse_command("\n  go west\nbecause") == "go west"
    assert parse_command("") == ""


class _ScriptedEngine:
    """Answers with the walkthrough command of the step for every episode of the query, or nonsense."""

    def __init__(self, answers):
        self.answers, self.calls = answers, 0

    def generate(self, prompt_ids, n, params):
        text = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return [
            [Completion(list(p), [5], np.array([-0.5]), np.array([0.1]), "stop", text=text)]
            for p in prompt_ids
        ]


class _CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text[-64:]]


def test_lockstep_rollout_loop_runs_textworld_episodes(env):
    qid = env.query_ids[0]
    answers = [f"<action>{c}</action>" for c in _walkthrough(env, qid)]
    records = rollout_multistep(_ScriptedEngine(answers), _CharTok(), env.episode, [qid], 2, SamplingParams())
    assert len(records) == 2 * len(answers)
    assert all(r.obs_key for r in records) and records[0].obs_key != records[1].obs_key
    stats = episode_stats(records)
    assert stats["success_rate"] == 1.0


def test_clean_drops_prompt_markers_but_keeps_the_games_own_text():
    assert _clean("> \n\n-= Cellar =-\nA sign says -> north.\n>") == "-= Cellar =- A sign says -> north."


def test_a_game_step_that_hangs_ends_the_episode_as_a_timeout(cache, monkeypatch):
    import threading
    import time

    env = TextWorldEnv(
        level=2, num_games=2, max_steps=4, memory=1, cache_dir=cache, seed=0, step_timeout_s=0.2
    )
    episode = env.episode(env.query_ids[0])
    release = threading.Event()

    def hang(command):
        release.wait(30)  # the game stuck on a command
        raise RuntimeError("released")

    monkeypatch.setattr(episode._env, "step", hang)
    start = time.monotonic()
    try:
        obs, reward, terminated, truncated, info = episode.step("<action>go east</action>")
    finally:
        release.set()
    # Did not wait for the hang (30 s): 10 s is 50x the 0.2 s limit (measured 0.20 s), room for a loaded machine.
    assert time.monotonic() - start < 10.0
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, True) and episode.done
    assert info["grade_reason"] == "timeout" and not info["correct"]
    assert env.step_timeout_s == 0.2 and TextWorldEnv.__init__.__kwdefaults__["step_timeout_s"] == 30.0


class _CharTokenizer:
    chat_template = None
    name_or_path = "/models/tw-char-tok"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [list(range(len(t))) for t in text]}


def test_first_prompts_are_checked_against_the_context_and_chat_modes_apply(env, cache):
    from r3_rllib.envs.data import DataError

    longest = max(len(env.episode(q).prompt) for q in env.query_ids)
    kw = dict(
        level=2, num_games=2, max_steps=4, memory=1, cache_dir=cache, seed=0, tokenizer=_CharTokenizer()
    )
    with pytest.raises(
        DataError, match=rf"textworld: query 'tw-coin_collector/.*': prompt has {longest} tokens"
    ):
        TextWorldEnv(**kw, model_max_positions=longest + 7, max_new_tokens=8)
    assert not TextWorldEnv(**kw, model_max_positions=longest + 8, max_new_tokens=8).use_chat_template
    with pytest.raises(ValueError, match="tokenizer '/models/tw-char-tok' has no chat template"):
        TextWorldEnv(**kw, apply_chat_template="required")
