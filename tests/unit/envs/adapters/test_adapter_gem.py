"""env 'gem': a GEM env registered in the test, played through chat calls; rewards come from the env's steps."""

from __future__ import annotations

import asyncio

import pytest

gem = pytest.importorskip("gem")

from fake_chat_client import FakeChatClient  # noqa: E402

from r3_rllib.envs import make_text_env  # noqa: E402
from r3_rllib.envs.adapters.gem_env import GemEnv  # noqa: E402
from r3_rllib.envs.base import supports_agent_runs  # noqa: E402


class CountdownEnv(gem.Env):
    """Say the seed's number, then its successor: reward 1 per right answer, 2 turns."""

    def reset(self, seed=None):
        self.target, self.turn = int(seed or 0), 0
        return f"Say {self.target}.", {}

    def step(self, action):
        right = action.strip() == str(self.target + self.turn)
        self.turn += 1
        done = self.turn == 2
        return ("" if done else f"Now say {self.target + 1}."), float(right), done, False, {}


class NanEnv(CountdownEnv):
    def step(self, action):
        return "", float("nan"), True, False, {}


gem.register("test:Countdown-v0", entry_point=CountdownEnv)
gem.register("test:Nan-v0", entry_point=NanEnv)


def test_gem_episode_reward_is_the_sum_of_step_rewards():
    env = make_text_env("gem", env_id="test:Countdown-v0", seeds=[3, 7], shuffle=False)
    assert supports_agent_runs(env) and env.query_ids == ["gem-3", "gem-7"]
    task = env.agent_task("gem-7")
    client = FakeChatClient(["7", "9"])
    result = asyncio.run(asyncio.wait_for(env.run_agent(client, "policy", task), 10))
    assert result["reward"] == 1.0 and result["info"] == {"turns": 2, "done": True}
    assert client.calls[0]["messages"] == [{"role": "user", "content": "Say 7."}]
    # The second prompt extends the first: the reply, then the env's next observation.
    assert client.calls[1]["messages"][1:] == [
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Now say 8."},
    ]
    prompt, info = env.reset()
    assert info["query_id"] in env.query_ids
    with pytest.raises(TypeError, match="agent env"):
        env.step("7")


def test_gem_errors_are_named():
    with pytest.raises(ValueError, match="cannot make env 'test:Nope-v0'"):
        GemEnv(env_id="test:Nope-v0")
    env = GemEnv(env_id="test:Nan-v0", num_tasks=1)
    with pytest.raises(ValueError, match="non-finite reward"):
        asyncio.run(
            asyncio.wait_for(env.run_agent(FakeChatClient(["x"]), "policy", env.agent_task("gem-0")), 10)
        )
