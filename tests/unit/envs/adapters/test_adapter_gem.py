"""env 'gem': a GEM env registered in the test, played through a real rollout gateway (chat calls, one session per
episode): rewards come from the env's steps on the replies the gateway sampled, and each turn's prompt extends the
previous one token for token."""

from __future__ import annotations

import pytest

gem = pytest.importorskip("gem")

from gateway_runs import extends_previous, reply_text, run_episodes  # noqa: E402

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


def test_gem_episode_reward_is_the_sum_of_step_rewards(scripted_gateway, chat_tokenizer):
    """A scripted engine behind the gateway: the replies "7" (right) then "9" (wrong) are what the model says."""
    env = make_text_env("gem", env_id="test:Countdown-v0", seeds=[3, 7], shuffle=False)
    assert supports_agent_runs(env) and env.query_ids == ["gem-3", "gem-7"]
    gateway = scripted_gateway(["7", "9"])
    (result,), (records,) = run_episodes(gateway, env, ["gem-7"])
    assert result["reward"] == 1.0 and result["correct"] and result["info"] == {"turns": 2, "done": True}
    assert [r.endpoint for r in records] == ["chat", "chat"] and extends_previous(records)
    assert records[0].messages == [{"role": "user", "content": "Say 7."}]
    # The second prompt extends the first: the reply, then the env's next observation.
    assert records[1].messages[1:] == [
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Now say 8."},
    ]
    second_prompt = chat_tokenizer.decode(list(records[1].prompt_ids))
    assert second_prompt.endswith("<bos>user\nNow say 8.<eos>\n<bos>assistant\n")
    prompt, info = env.reset()
    assert info["query_id"] in env.query_ids
    with pytest.raises(TypeError, match="agent env"):
        env.step("7")


def test_gem_episodes_on_the_tiny_model(gateway, chat_tokenizer):
    """The untrained tiny model plays: each step's reward is the env's rule on the text the gateway returned."""
    env = make_text_env("gem", env_id="test:Countdown-v0", seeds=[3, 7], shuffle=False)
    results, records = run_episodes(gateway, env, env.query_ids)
    for seed, result, calls in zip((3, 7), results, records, strict=True):
        assert len(calls) == 2 and extends_previous(calls) and result["info"]["turns"] == 2
        replies = [reply_text(chat_tokenizer, r).strip() for r in calls]
        assert calls[1].messages[1]["content"].strip() == replies[0]
        assert result["reward"] == float(replies[0] == str(seed)) + float(replies[1] == str(seed + 1))
        assert all(len(r.completion_ids) > 0 and len(r.logprobs) == len(r.completion_ids) for r in calls)


def test_gem_errors_are_named(gateway):
    with pytest.raises(ValueError, match="cannot make env 'test:Nope-v0'"):
        GemEnv(env_id="test:Nope-v0")
    env = GemEnv(env_id="test:Nan-v0", num_tasks=1)
    with pytest.raises(ValueError, match="non-finite reward"):
        run_episodes(gateway, env, ["gem-0"])


def test_gem_entry_point_registers_the_users_env():
    """A run file names its own GEM env by entry point: registered under the id in the process building the env."""
    env = GemEnv(env_id="test:CountdownByEntryPoint-v0", entry_point=f"{__name__}:CountdownEnv", seeds=[1])
    assert gem.envs.registration.ENV_REGISTRY["test:CountdownByEntryPoint-v0"].entry_point.endswith(
        ":CountdownEnv"
    )
    assert env.query_ids == ["gem-1"]
