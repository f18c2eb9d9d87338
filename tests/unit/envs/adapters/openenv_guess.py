"""An OpenEnv Environment for the adapter tests: guess the seed's number in up to 3 tries. Its own module so that
collecting the tests does not import openenv (~6 CPU-s here, gradio with it); the tests import it when they run."""

from __future__ import annotations

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from r3_rllib.envs import make_text_env


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


def guess_env():
    return make_text_env(
        "openenv",
        environment=GuessEnvironment,
        action=GuessAction,
        action_field="guess",
        tasks=[{"seed": 4, "hint": "even"}, {"seed": 5}],
        shuffle=False,
    )
