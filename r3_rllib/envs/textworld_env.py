"""TextWorld games as a multi-step text environment (optional extra: ``pip install r3-rllib[envs]``).

`TextWorld <https://github.com/microsoft/TextWorld>`_ (the engine ALFWorld is built on) generates text games
offline. This env serves games of one of its challenges (``tw-coin_collector``, ``tw-treasure_hunter``,
``tw-cooking``, ``tw-simple``) at a set level, one game per query:

- **Games by seed, built once**: game ``i`` of a pool is generated with its own seed and compiled by TextWorld into
  ``cache_dir`` (default ``~/.cache/r3_rllib/textworld``) the first time it is needed (a few seconds each, under a
  file lock, so runners sharing a machine build it once); later runs load it.
- **Held-out games**: the ``test`` split draws from another seed range and skips every game whose world and
  walkthrough equal a training game's.
- **Prompts**: the objective, a memory window of the last ``memory`` observations and commands, the current
  observation, the inventory and the admissible commands, asking for one command inside ``<action>...</action>``
  (rendered through the tokenizer's chat template under ``apply_chat_template``: "auto", "required" or "none", as
  for every text env, see :mod:`r3_rllib.envs.chat`), in the style of verl-agent's ALFWorld prompt. Each game's
  first prompt + ``max_new_tokens`` must fit ``model_max_positions`` (both filled in by the EnvRunner): a longer
  one is refused when the env is built, naming the game (:mod:`r3_rllib.envs.context`).
- **Actions**: the last ``<action>`` block of a response (else its first non-empty line) is sent to the game as
  typed; a command the game does not understand is answered by the game ("That's not a verb I recognise.") and
  counted in ``info["invalid"]`` when it is not among the admissible commands.
- **Reward**: the game's score gained at the step, divided by the game's maximum score (an episode's rewards sum to
  its final normalised score); ``correct`` when the game is won. ``obs_key`` (what HGPO groups steps by) is the game
  state: the room description and the inventory.
- **A game that hangs**: each command runs with a time limit (``step_timeout_s``, default 30 s,
  :func:`r3_rllib.rewards.bounded_call`); past it the episode ends, truncated, with reward 0 and
  ``info["grade_reason"] == "timeout"``, instead of hanging the runner.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from r3_rllib.envs.base import EpisodicTextEnv
from r3_rllib.envs.chat import use_chat_template
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import QueryOrder, Shard
from r3_rllib.envs.math_env import load_tokenizer
from r3_rllib.rewards.bounded import DEFAULT_REWARD_TIMEOUT_S, bounded_call

CHALLENGES = ("tw-coin_collector", "tw-treasure_hunter", "tw-cooking", "tw-simple")
#: Seeds of game i: SPLIT_SEED_OFFSETS[split] + pool_seed * _POOL_STRIDE + i.
SPLIT_SEED_OFFSETS = {"train": 0, "test": 500_000}
_POOL_STRIDE = 10_000
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def _import_textworld():
    try:
        import textworld
        import textworld.challenges
    except ImportError as e:
        raise ImportError(
            "the textworld env needs the textworld package: pip install 'r3-rllib[envs]'"
        ) from e
    return textworld


def default_cache_dir() -> Path:
    return Path(os.environ.get("R3_TEXTWORLD_CACHE", Path.home() / ".cache" / "r3_rllib" / "textworld"))


def parse_command(response: str) -> str:
    """The command a response gives: its last ``<action>`` block, else its first non-empty line (stripped)."""
    found = _ACTION.findall(response)
    text = found[-1] if found else next((line for line in response.splitlines() if line.strip()), "")
    return " ".join(text.split())


@dataclass(frozen=True)
class GameFile:
    """A compiled game of the pool: its query id, the file Jericho plays, the key that identifies its world and
    TextWorld's walkthrough (a winning command sequence)."""

    query_id: str
    path: Path
    key: str
    walkthrough: tuple[str, ...]


def build_game(challenge: str, settings: dict[str, Any], seed: int, cache_dir: Path) -> GameFile:
    """The game of `challenge` at `settings` generated with `seed`, compiled into `cache_dir` once (file lock)."""
    tw = _import_textworld()
    folder = cache_dir / f"{challenge}-{_settings_tag(settings)}"
    folder.mkdir(parents=True, exist_ok=True)
    path, meta = folder / f"seed{seed}.z8", folder / f"seed{seed}.meta.json"
    query_id = f"{challenge}/{_settings_tag(settings)}/seed{seed}"
    with open(folder / f"seed{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path.is_file() and meta.is_file()):
            from textworld.generator import compile_game

            options = tw.GameOptions()
            options.seeds = seed
            options.path = str(path)
            options.file_ext = ".z8"
            options.force_recompile = True
            try:
                game = tw.challenges.CHALLENGES[challenge][1](dict(settings), options)
                with warnings.catch_warnings():  # Jericho's score-table warning, see TextWorldEpisode
                    warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                    compile_game(game, options)
            except Exception as e:  # a bad level/settings, a compiler failure: say which game
                raise RuntimeError(f"TextWorld could not build {query_id}: {type(e).__name__}: {e}") from e
            meta.write_text(
                json.dumps({"key": _world_key(game), "walkthrough": list(game.walkthrough or [])})
            )
    saved = json.loads(meta.read_text())
    return GameFile(query_id, path, saved["key"], tuple(saved["walkthrough"]))


def _settings_tag(settings: dict[str, Any]) -> str:
    return "-".join(f"{k}{v}" for k, v in sorted(settings.items()))


def _world_key(game: Any) -> str:
    # Two seeds can give the same game with different wording of the objective: compare what the player meets,
    # the facts of the world, the names of its rooms and objects, and the walkthrough.
    facts = sorted(str(f) for f in game.world.facts)
    names = sorted(str(info.name) for info in game.infos.values())
    return hashlib.sha256(json.dumps([facts, names, list(game.walkthrough or [])]).encode()).hexdigest()


@dataclass
class TextWorldEpisode:
    """One trajectory on one game (an independent Jericho process per episode)."""

    game: GameFile
    memory: int
    max_steps: int
    render: Any  # user text -> prompt
    step_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S  # per command: the game computes the reward
    steps: int = 0
    done: bool = False
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation, command) per past step
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tw = _import_textworld()
        infos = tw.EnvInfos(
            admissible_commands=True,
            inventory=True,
            description=True,
            objective=True,
            won=True,
            lost=True,
            score=True,
            max_score=True,
        )
        with warnings.catch_warnings():
            # Jericho plays TextWorld's games without its per-game score tables; TextWorld reports the score.
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            self._env = tw.start(str(self.game.path), request_infos=infos)
            self._state = self._env.reset()
        self._observation = _clean(self._state.description)
        self.objective = _clean(self._state.objective)

    @property
    def obs_key(self) -> str:
        """The game state the next command acts on: room description and inventory."""
        return f"{_clean(self._state.description)}\n{_clean(self._state.inventory)}"

    @property
    def admissible(self) -> list[str]:
        return sorted(self._state.admissible_commands or [])

    @property
    def prompt(self) -> str:
        return self.render(self.user_text())

    def user_text(self) -> str:
        lines = [f"You are playing a text adventure game. Your goal: {self.objective}"]
        window = self.history[-self.memory :] if self.memory > 0 else []
        if window:
            lines.append(f"Your last {len(window)} observation(s) and command(s):")
            lines += [f"Observation: {obs}\nCommand: {cmd}" for obs, cmd in window]
        lines.append(f"Step {self.steps + 1}. Current observation: {self._observation}")
        lines.append(f"Inventory: {_clean(self._state.inventory)}")
        lines.append(f"Admissible commands: {', '.join(self.admissible)}")
        lines.append("Reply with exactly one admissible command inside <action></action>.")
        return "\n".join(lines)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send the response's command to the game; ``(next_prompt or "", reward, terminated, truncated, info)``."""
        if self.done:
            raise RuntimeError("the episode is over; start a new one")
        command, acted_key = parse_command(action), self.obs_key
        invalid = command not in self.admissible
        before = self._state.score or 0
        self.history.append((self._observation, command or "(none)"))
        self.commands.append(command)
        played = bounded_call(self._env.step, command or "look", timeout_s=self.step_timeout_s)
        self.steps += 1
        if not played.ok:
            return self._timed_out(command, invalid, acted_key)
        self._state, _, game_over = played.value
        self._observation = _clean(self._state.feedback)
        won = bool(self._state.won)
        terminated = bool(game_over or won or self._state.lost)
        truncated = not terminated and self.steps >= self.max_steps
        self.done = terminated or truncated
        reward = ((self._state.score or 0) - before) / max(self._state.max_score or 1, 1)
        if self.done:
            self._env.close()
        info = {
            "query_id": self.game.query_id,
            "correct": won,
            "reward_components": {"score": reward},
            "command": command,
            "invalid": invalid,
            "step": self.steps - 1,
            "acted_obs_key": acted_key,
            "obs_key": None if self.done else self.obs_key,
        }
        return ("" if self.done else self.prompt), float(reward), terminated, truncated, info

    def _timed_out(self, command: str, invalid: bool, acted_key: str) -> tuple[str, float, bool, bool, dict]:
        """The step of a command the game did not answer within ``step_timeout_s``: the episode ends, truncated,
        with reward 0. The game is left to its abandoned call (closing it under that call could crash Jericho)."""
        self.done = True
        info = {
            "query_id": self.game.query_id,
            "correct": False,
            "reward_components": {"score": 0.0},
            "grade_reason": "timeout",
            "command": command,
            "invalid": invalid,
            "step": self.steps - 1,
            "acted_obs_key": acted_key,
            "obs_key": None,
        }
        return "", 0.0, False, True, info

    def close(self) -> None:
        """End the game's process (an episode that ran to its end has closed it already)."""
        if not self.done:
            self.done = True
            self._env.close()


def _clean(text: str | None) -> str:
    # The game's text carries a prompt marker ('>' alone at the start or end of a line) and runs of blank lines;
    # a '>' inside a sentence is the game's own text and stays.
    text = re.sub(r"(?m)^[ \t]*>[ \t]*|[ \t]*>[ \t]*$", " ", text or "").strip()
    return re.sub(r"\s*\n\s*", " ", text)


class TextWorldEnv(EpisodicTextEnv):
    """TextWorld games of one challenge as a multi-step env (see the module docstring).

    Config:
        challenge: one of :data:`CHALLENGES`.
        level: the challenge's difficulty level (coin collector / treasure hunter: 1-300; cooking: use
            ``settings``), or None to give every setting in ``settings``.
        settings: extra challenge settings (e.g. cooking's ``{"recipe": 1, "take": 1, "go": 1}``).
        num_games: games per split. pool_seed: which seed range the pools come from.
        max_steps: horizon (commands per episode). memory: past observations and commands shown in each prompt.
        split: ``"train"`` or ``"test"`` (held-out games).
        seed, shuffle, shard: the per-epoch order of the games and this env's shard of it, as in the other envs.
        tokenizer: renders prompts (see ``apply_chat_template``) and counts tokens. cache_dir: where compiled games
            live.
        apply_chat_template: ``"auto"`` (default), ``"required"`` or ``"none"`` (see :mod:`r3_rllib.envs.chat`).
        step_timeout_s: seconds one command may take in the game (default 30); past it the episode ends with
            reason ``timeout``.
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills
            them in); a game whose first prompt is too long for them raises ``DataError`` naming it. None: no check.
    """

    def __init__(
        self,
        *,
        challenge: str = "tw-coin_collector",
        level: int | None = 1,
        settings: dict[str, Any] | None = None,
        num_games: int = 16,
        pool_seed: int = 0,
        max_steps: int = 8,
        memory: int = 2,
        split: Literal["train", "test"] = "train",
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        tokenizer: Any = None,
        cache_dir: str | os.PathLike | None = None,
        eos_text: Any = None,
        apply_chat_template: bool | str = "auto",
        step_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
    ) -> None:
        super().__init__()
        del eos_text  # accepted for the runner's uniform env construction
        _check(challenge, split, num_games, max_steps, memory)
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s!r}")
        self.step_timeout_s = float(step_timeout_s)
        self.challenge, self.split, self.memory, self.max_steps = challenge, split, memory, max_steps
        self.settings = ({"level": level} if level is not None else {}) | dict(settings or {})
        self.pool_seed = pool_seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.tokenizer = load_tokenizer(tokenizer)
        self.use_chat_template = use_chat_template(self.tokenizer, apply_chat_template)
        self.games = self._pool(split, num_games)
        self._by_id = {g.query_id: g for g in self.games}
        self._order = QueryOrder(len(self.games), seed=seed, shuffle=shuffle, shard=shard)
        self._episode: TextWorldEpisode | None = None
        check_prompts_fit(
            self._first_prompts(), self.tokenizer, model_max_positions, max_new_tokens, env_name="textworld"
        )

    def _first_prompts(self) -> Iterator[tuple[str, str]]:
        """``(query_id, first prompt)`` of every game (a game process started and closed each)."""
        for game in self.games:
            episode = self.episode(game.query_id)
            try:
                yield game.query_id, episode.prompt
            finally:
                episode.close()

    def _seeds(self, split: str) -> Iterator[int]:
        start = SPLIT_SEED_OFFSETS[split] + self.pool_seed * _POOL_STRIDE
        return iter(range(start, start + _POOL_STRIDE))

    def _pool(self, split: str, n: int) -> list[GameFile]:
        """`n` distinct games of `split`; the test split skips games equal to a training game. Gives up with a
        clear error after ``2 n + 8`` seeds (a level with fewer distinct games than asked for)."""
        exclude = {g.key for g in self._pool("train", n)} if split != "train" else set()
        games: list[GameFile] = []
        seen: set[str] = set()
        for _, seed in zip(range(2 * n + 8), self._seeds(split), strict=False):
            game = build_game(self.challenge, self.settings, seed, self.cache_dir)
            if game.key not in exclude and game.key not in seen:
                games.append(game)
                seen.add(game.key)
            if len(games) == n:
                return games
        raise ValueError(
            f"{self.challenge} {self.settings}: fewer than {n} distinct {split} games in {2 * n + 8} seeds"
        )

    def render(self, user_text: str) -> str:
        """The chat template with the generation prompt (``apply_chat_template``), else plain text."""
        if self.use_chat_template:
            messages = [{"role": "user", "content": user_text}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return user_text + "\n"

    @property
    def query_ids(self) -> list[str]:
        return [g.query_id for g in self.games]

    def episode(self, query_id: str) -> TextWorldEpisode:
        """A fresh, independent episode on that game (for lockstep rollouts of a query's G trajectories)."""
        if query_id not in self._by_id:
            raise ValueError(f"unknown query_id {query_id!r}: not in this env's {self.split} pool")
        return TextWorldEpisode(
            self._by_id[query_id], self.memory, self.max_steps, self.render, self.step_timeout_s
        )

    # -- TextEnv ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.games)

    def state(self) -> dict[str, Any]:
        """The game order and the commands of the episode in progress (a restore replays them: games are
        deterministic)."""
        episode = self._episode
        return {
            "order": self._order.state(),
            "episode": None
            if episode is None
            else {"query_id": episode.game.query_id, "commands": episode.commands},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._order.set_state(state["order"])
        saved = state.get("episode")
        self._episode = None if saved is None else self.episode(saved["query_id"])
        for command in [] if saved is None else saved["commands"]:
            self._episode.step(f"<action>{command}</action>")


def _check(challenge: str, split: str, num_games: int, max_steps: int, memory: int) -> None:
    if challenge not in CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; known: {', '.join(CHALLENGES)}")
    if split not in SPLIT_SEED_OFFSETS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if num_games < 1 or max_steps < 1 or memory < 0:
        raise ValueError(
            f"need num_games >= 1, max_steps >= 1, memory >= 0; got {num_games}, {max_steps}, {memory}"
        )
