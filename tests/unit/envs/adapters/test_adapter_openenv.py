"""env 'openenv': an OpenEnv Environment written for the tests (openenv_guess.py), run in-process through a real
rollout gateway (chat calls, one session per episode): the reward is the environment's, on the replies the gateway
sampled."""

from __future__ import annotations

import pytest
from gateway_runs import extends_previous, reply_text, run_episodes


@pytest.fixture(scope="module")
def guess():
    """openenv_guess.py, imported when the first test runs (openenv's import is ~6 CPU-s)."""
    pytest.importorskip("openenv")
    import openenv_guess

    return openenv_guess


def test_openenv_episode_reward_comes_from_the_environment(scripted_gateway, guess):
    """A scripted engine behind the gateway: a wrong guess ("3"), then the right one ("4")."""
    env = guess.guess_env()
    assert env.reset(options={"query_id": "openenv-0"})[0] == "GuessEnvironment reset(seed=4, hint='even')"
    (result,), (records,) = run_episodes(scripted_gateway(["3", "4"]), env, ["openenv-0"])
    assert result["reward"] == 1.0 and result["correct"] and result["info"] == {"turns": 2, "done": True}
    assert len(records) == 2 and extends_previous(records)
    assert records[0].messages == [{"role": "user", "content": "Guess a number (hint: even)."}]
    assert records[1].messages[1:] == [
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "wrong"},
    ]


def test_openenv_episodes_on_the_tiny_model(gateway, chat_tokenizer, guess):
    """The untrained tiny model guesses: up to 3 turns, each prompt extending the last; reward 1 exactly when a
    reply the gateway returned was the number."""
    env = guess.guess_env()
    results, records = run_episodes(gateway, env, env.query_ids)
    for seed, result, calls in zip((4, 5), results, records, strict=True):
        replies = [reply_text(chat_tokenizer, r).strip() for r in calls]
        right = str(seed) in replies
        assert len(calls) == result["info"]["turns"] == (replies.index(str(seed)) + 1 if right else 3)
        assert extends_previous(calls) and result["reward"] == float(right)


def test_openenv_errors_are_named(gateway, guess):
    from r3_rllib.envs.adapters.openenv_env import OpenEnvEnv

    GuessAction = guess.GuessAction
    with pytest.raises(ValueError, match="no field 'message'"):
        OpenEnvEnv(environment=guess.GuessEnvironment, action=GuessAction)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        OpenEnvEnv(environment="no_such_module:Env", action=GuessAction, action_field="guess")
    with pytest.raises(TypeError, match="not an openenv Environment"):
        OpenEnvEnv(environment=dict, action=GuessAction, action_field="guess")
    env = OpenEnvEnv(environment=guess.InfEnvironment, action=GuessAction, action_field="guess", num_tasks=1)
    with pytest.raises(ValueError, match="non-finite reward"):
        run_episodes(gateway, env, ["openenv-0"])
