"""env 'openenv': an OpenEnv Environment defined in the test, run in-process through chat calls."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openenv")

from fake_chat_client import FakeChatClient  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from r3_rllib.envs import make_text_env  # noqa: E402
from r3_rllib.envs.adapters.openenv_env import OpenEnvEnv  # noqa: E402


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnvironment(Environment):
    """Guess the seed's number in up to 3 tries: reward 1 on the right guess."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state, self.target = State(episode_id=episode_id), int(seed or 0)
        return GuessObservation(feedback=f"Guess a number (hint: {kwargs.get('hint', 'none')}).")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        right = action.guess.strip() == str(self.target)
        done = right or self._state.step_count == 3
        return GuessObservation(feedback="wrong", done=done, reward=1.0 if right else 0.0)

    @property
    def state(self):
        return self._state


class InfEnvironment(GuessEnvironment):
    def step(self, action, timeout_s=None, **kwargs):
        return GuessObservation(feedback="", done=True, reward=float("inf"))


def test_openenv_episode_reward_comes_from_the_environment():
    env = make_text_env(
        "openenv",
        environment=GuessEnvironment,
        action=GuessAction,
        action_field="guess",
        tasks=[{"seed": 4, "hint": "even"}, {"seed": 5}],
        shuffle=False,
    )
    client = FakeChatClient(["3", "4"])
    task = env.agent_task("openenv-0")
    result = asyncio.run(asyncio.wait_for(env.run_agent(client, "policy", task), 10))
    assert result["reward"] == 1.0 and result["correct"] and result["info"] == {"turns": 2, "done": True}
    assert client.calls[0]["messages"] == [{"role": "user", "content": "Guess a number (hint: even)."}]
    assert client.calls[1]["messages"][1:] == [
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "wrong"},
    ]


def test_openenv_errors_are_named():
    with pytest.raises(ValueError, match="no field 'message'"):
        OpenEnvEnv(environment=GuessEnvironment, action=GuessAction)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        OpenEnvEnv(environment="no_such_module:Env", action=GuessAction, action_field="guess")
    with pytest.raises(TypeError, match="not an openenv Environment"):
        OpenEnvEnv(environment=dict, action=GuessAction, action_field="guess")
    env = OpenEnvEnv(environment=InfEnvironment, action=GuessAction, action_field="guess", num_tasks=1)
    with pytest.raises(ValueError, match="non-finite reward"):
        asyncio.run(
            asyncio.wait_for(env.run_agent(FakeChatClient(["1"]), "policy", env.agent_task("openenv-0")), 10)
        )
