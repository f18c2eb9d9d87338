"""The text environment API: gymnasium conventions with text observations and text actions.

An episode is a conversation about one *query* (a problem with a verifiable answer). ``reset()`` returns the prompt
the policy sees and an info dict with a stable ``query_id``; ``step(response)`` returns the reward and whether the
episode ended. Single-step tasks (math, arithmetic) terminate after the first response; multi-step tasks return the
next prompt as the observation and ``terminated=False`` until the last turn, so multi-turn algorithms use the same API.

Two ``reset`` options let a rollout worker build groups and reflection prompts without knowing the task:

- ``options={"query_id": qid}`` resets to that query again (the G samples of a GRPO group share one query);
- ``options={"query_id": qid, "user_content": text}`` renders ``text`` as the user turn instead of the query's own
  content but keeps its gold answer (R^3's in-context self-reflection prompts).

Two optional interfaces make an env multi-step or multi-turn tool use (what the rollout kinds of
``r3_rllib.rollout.kinds`` check): :class:`MultiStepEnv` (``episode(query_id)``, independent :class:`Episode` objects
stepped in lockstep) and :class:`ToolUseEnv` (``tool_episode(query_id, user_content=None)``, :class:`ToolEpisode`
objects). They are protocols: an env that defines the method is of that kind without subclassing anything.
"""

from __future__ import annotations

import functools
import string
from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import gymnasium as gym

if TYPE_CHECKING:
    from r3_rllib.envs.data import QueryOrder

# Long enough for an 8k-token prompt; gymnasium's Text space needs a bound.
MAX_TEXT_CHARS = 1 << 20


class TextEnv(gym.Env):
    """Base class for verifiable text tasks.

    Subclasses implement :meth:`reset` and :meth:`step`. ``info`` from ``reset`` carries at least ``query_id`` (str,
    stable across processes and runs) and ``query_text`` (the user-turn content before any chat template). ``info``
    from ``step`` carries at least ``correct`` (bool) and ``reward_components`` (dict of float).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each ``reset`` a subclass defines counts the fresh queries it serves (a reset without a ``query_id``
        option), for the default :attr:`epoch`; a reset another counted one calls (``super().reset``) is not
        counted twice."""
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _counting_reset(cls.__dict__["reset"])

    def __init__(self) -> None:
        # gymnasium's Text space needs a character set; it only matters for space.sample()/contains(), which the
        # rollout path never calls (prompts and responses may hold any Unicode text).
        charset = string.printable
        self.observation_space = gym.spaces.Text(max_length=MAX_TEXT_CHARS, min_length=0, charset=charset)
        self.action_space = gym.spaces.Text(max_length=MAX_TEXT_CHARS, min_length=0, charset=charset)

    @abstractmethod
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; return ``(prompt_text, info)``."""

    @abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score ``action``; return ``(next_prompt_or_empty, reward, terminated, truncated, info)``."""

    # -- optional hooks ---------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Serializable position in the task's data stream (for checkpoints). Default: nothing to save."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned."""

    def __len__(self) -> int:  # number of distinct queries, when finite
        raise TypeError(f"{type(self).__name__} has no finite length")

    @property
    def epoch(self) -> int:
        """Completed passes over the data: what the runner reports as ``rollout/dataset_epoch``, which switches
        R^3's parts on (``replay_start_epoch`` etc.). Default: fresh queries served (resets without a ``query_id``
        option) over ``len(self)``; 0 for an env without a finite length. An env with its own data order
        (:class:`PooledTextEnv`) overrides it. The default count starts at 0 again when a run resumes from a
        checkpoint (it is not part of :meth:`state`)."""
        if "_epoch" in self.__dict__:  # an env that keeps its own count (self.epoch = ...)
            return self.__dict__["_epoch"]
        try:
            size = len(self)
        except TypeError:
            return 0
        return self.__dict__.get("_fresh_queries", 0) // size if size > 0 else 0

    @epoch.setter
    def epoch(self, value: int) -> None:
        # Envs written before `epoch` was a property assign their own count; that count wins over the default.
        self.__dict__["_epoch"] = value


def _counting_reset(reset: Any) -> Any:
    """``reset`` wrapped to count fresh queries on the instance (see :meth:`TextEnv.__init_subclass__`)."""

    @functools.wraps(reset)
    def counted(self: TextEnv, *args: Any, **kwargs: Any) -> Any:
        outer = not self.__dict__.get("_in_reset", False)
        if outer:
            options = kwargs.get("options") or {}
            if "query_id" not in options:
                self.__dict__["_fresh_queries"] = self.__dict__.get("_fresh_queries", 0) + 1
            self.__dict__["_in_reset"] = True
        try:
            return reset(self, *args, **kwargs)
        finally:
            if outer:
                self.__dict__["_in_reset"] = False

    return counted


class PooledTextEnv(TextEnv):
    """A text env serving a fixed pool of queries in the per-epoch order of its
    :class:`~r3_rllib.envs.data.QueryOrder` (``self._order``, set by the subclass): the epoch and the checkpointed
    position come from that order."""

    _order: QueryOrder

    @property
    def epoch(self) -> int:
        """Completed passes over the pool (over this env's shard of each epoch's order when sharded)."""
        return self._order.epoch

    def state(self) -> dict[str, Any]:
        return self._order.state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._order.set_state(state)


class Episode(Protocol):
    """One episode of a multi-step env: what the lockstep rollout loop needs."""

    @property
    def prompt(self) -> str:
        """The text of the next step's prompt."""

    @property
    def obs_key(self) -> Any:
        """The hashable observation step-level estimators (HGPO) group by."""

    @property
    def done(self) -> bool:
        """Whether the episode has ended."""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one response: ``(next_prompt, reward, terminated, truncated, info)``."""


class ToolEpisode(Protocol):
    """One trajectory's task in a multi-turn tool env: what the tool-use loop needs."""

    @property
    def prompt(self) -> str:
        """The rendered prompt (chat template applied), the start of the token sequence."""

    def tool_reply(self, turn_text: str) -> str | None:
        """The text to append after a model turn: the tool's output rendered as the next message (ending where the
        model's next turn starts), or None when the turn calls no tool (the trajectory ends). Never raises: a failed
        tool call comes back as its error text."""

    def finish(self, model_text: str) -> tuple[float, bool, dict[str, Any]]:
        """``(reward, correct, info)`` of the whole trajectory from the text of its model turns."""


@runtime_checkable
class MultiStepEnv(Protocol):
    """A multi-step env: it hands out fresh, independent episodes of a query (rolled out in lockstep, trained as
    step samples). :class:`EpisodicTextEnv` is one; any env defining ``episode`` is one."""

    def episode(self, query_id: str) -> Episode:
        """A new episode on query ``query_id``."""


@runtime_checkable
class ToolUseEnv(Protocol):
    """A multi-turn tool env: it hands out tool episodes of a query (one trajectory, one training sample, tool
    tokens masked out of the loss)."""

    def tool_episode(self, query_id: str, user_content: str | None = None) -> ToolEpisode:
        """A new tool episode on query ``query_id``; ``user_content`` replaces the query's own user turn but keeps
        its gold answer (R^3's reflection prompts), as the ``user_content`` reset option does."""


@runtime_checkable
class AgentEnv(Protocol):
    """An agent env: each rollout is an agent program that calls the policy through an OpenAI-compatible client
    (the EnvRunner's rollout gateway, :mod:`r3_rllib.gateway`); trajectories are assembled from the calls the
    gateway recorded, token for token."""

    def agent_task(self, query_id: str) -> dict[str, Any]:
        """The task the agent program gets for query ``query_id`` (JSON-like: what its dataset row holds)."""

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> float | Mapping[str, Any]:
        """Run one episode on ``task`` with ``client`` (an ``openai.AsyncOpenAI`` bound to one gateway session) and
        model name ``model``; return its reward, or a mapping with ``reward`` and optionally ``correct`` and more
        info."""


def supports_episodes(env: Any) -> bool:
    """Whether ``env`` is a :class:`MultiStepEnv` (it defines a callable ``episode``)."""
    return isinstance(env, MultiStepEnv) and callable(env.episode)


def supports_agent_runs(env: Any) -> bool:
    """Whether ``env`` is an :class:`AgentEnv` (it defines a callable ``run_agent``)."""
    return isinstance(env, AgentEnv) and callable(env.run_agent)


def supports_tool_episodes(env: Any) -> bool:
    """Whether ``env`` is a :class:`ToolUseEnv` (it defines a callable ``tool_episode``)."""
    return isinstance(env, ToolUseEnv) and callable(env.tool_episode)


class EpisodicTextEnv(PooledTextEnv):
    """A pooled multi-step env (a :class:`MultiStepEnv`): ``reset`` starts :meth:`episode` on the next query of the
    order (or on ``options["query_id"]``) and ``step`` advances it. Subclasses give ``query_ids``, :meth:`episode`
    (fresh, independent episodes, what lockstep rollouts use) and, optionally, :meth:`reset_info`."""

    _episode: Any = None

    @property
    def query_ids(self) -> list[str]:
        raise NotImplementedError

    def episode(self, query_id: str) -> Episode:
        raise NotImplementedError

    def reset_info(self, query_id: str) -> dict[str, Any]:
        """Extra entries of ``reset``'s info for the episode just started on `query_id`."""
        return {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on the next query of the order (``seed`` restarts the order with it), or on
        ``options["query_id"]``'s. Multi-step envs build their own prompts: ``user_content`` is refused."""
        from r3_rllib.envs.data import parse_reset_options  # data's loaders are not needed to import the API

        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        if user_content is not None:
            raise ValueError(
                f"{type(self).__name__} builds its own prompts; reset option 'user_content' is not supported"
            )
        if query_id is None:
            query_id = self.query_ids[self._order.next()]
        self._episode = self.episode(query_id)
        prompt = self._episode.prompt
        info = {"query_id": query_id, "query_text": prompt, "obs_key": self._episode.obs_key}
        return prompt, info | self.reset_info(query_id)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._episode is None or self._episode.done:
            raise RuntimeError("call reset() before step(); the last episode is over")
        return self._episode.step(action)
