"""A partially observed text gridworld: the multi-step task where HGPO's context inconsistency really happens.

A *layout* (one query) is a square maze of ``size x size`` cells inside a border of walls, with a start and a goal.
At every step the agent sees only its 3x3 neighbourhood (``#`` wall, ``.`` free, ``G`` goal, ``@`` itself) and the
goal's offset from its own cell; it answers with a move. Walls beyond the view are hidden, so the greedy move
towards the goal can lead into a dead end, and the memory window (the last ``memory`` observations and moves in the
prompt) is what lets a policy avoid walking back into one.

The observation is a function of the cell only, so the G trajectories of a query that reach a cell by different
routes share its observation key with different histories: the case HGPO's deeper groups separate.

Prompt of one step (``memory=2``), one line per remembered step then the current observation::

    #../.@#/... +2,-1:right
    .../.@./#.# +1,-1:up
    #../.@./... +1,0:

Each observation is ``row0/row1/row2 dx,dy`` (``dx`` columns to the right, ``dy`` rows down to the goal) followed by
``:``; the model writes a move. Moves are parsed leniently (case and surrounding text ignored): the first word of
the response among ``up down left right``, ``north south west east``, or a single letter ``u d l r`` / ``n s w e``.
Anything else is *invalid*: the agent stays, the step counts towards the horizon, and the memory shows ``?``. A
move into a wall also leaves the agent in place (``info["bumped"]``). Every character is printable ASCII or
``"\\n"``, so the tiny character tokenizer encodes prompts exactly.

Reward: 1 on reaching the goal (``terminated``), 0 for every other step; ``truncated`` after ``max_steps`` steps.

Layouts are deterministic given their seed; the splits draw seeds from disjoint ranges (``train`` from 0,
``test`` from 1,000,000, ``sft`` from 2,000,000, each offset by ``pool_seed * 100,000``), and a test or sft layout
identical to a train layout is skipped, so held-out layouts are new.

Named presets (:data:`PRESETS`, ``GridWorldEnv(preset=...)``) fix the maze and horizon settings of an experiment;
explicit arguments override a preset's values. ``"hgpo"`` (6x6 mazes, shortest paths of 5..10 moves, a 20-step
horizon) is the setting where the warm start of :mod:`r3_rllib.warmstart.gridworld` succeeds on part of the
episodes only, so RL has room to improve (the measured rates are in that module's docstring).

Besides the one-episode ``TextEnv`` API, :meth:`GridWorldEnv.episode` returns independent
:class:`GridEpisode` objects, so a rollout loop can step the G trajectories of a query in lockstep.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from r3_rllib.envs.base import EpisodicTextEnv
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import QueryOrder, Shard
from r3_rllib.envs.math_env import load_tokenizer

WALL, FREE, GOAL, AGENT = "#", ".", "G", "@"
#: Move name -> (row delta, column delta); the order is the expert's tie-break among equally good moves.
MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ALIASES = {
    **{m: m for m in MOVES},
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
    "u": "up",
    "d": "down",
    "l": "left",
    "r": "right",
    "n": "up",
    "s": "down",
    "w": "left",
    "e": "right",
}
_WORD = re.compile(r"[a-z]+")
INVALID_MARK = "?"
SPLIT_SEED_OFFSETS = {"train": 0, "test": 1_000_000, "sft": 2_000_000}
_POOL_STRIDE = 100_000
# Layout draws per seed before giving up (a seed whose walls leave no start/goal pair at a valid distance redraws).
_MAX_DRAWS = 200

Cell = tuple[int, int]

#: The settings of a plain ``GridWorldEnv()`` (each may be overridden by a preset, then by an explicit argument).
DEFAULTS: dict[str, Any] = {
    "size": 5,
    "wall_prob": 0.3,
    "min_distance": 3,
    "max_distance": 8,
    "max_steps": 12,
    "memory": 2,
}
#: Named settings. ``"hgpo"``: longer mazes than the defaults, where the short warm start of
#: :func:`r3_rllib.warmstart.gridworld.build_warm_start` leaves most of the task to RL (the default 5x5 mazes with
#: 3..8-move paths are solved ~95 % of the time after a longer SFT run: too little left to learn). The 20-step
#: horizon is twice the longest shortest path, so a detour can still end in the goal.
PRESETS: dict[str, dict[str, Any]] = {
    "hgpo": {
        "size": 6,
        "wall_prob": 0.3,
        "min_distance": 5,
        "max_distance": 10,
        "max_steps": 20,
        "memory": 2,
    },
}


def resolve_settings(preset: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The maze settings of ``GridWorldEnv(preset=preset, **overrides)``: defaults, then the preset, then every
    override that is not None (None means "not given", so a preset value stays)."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown gridworld preset {preset!r}; known: {sorted(PRESETS)}")
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"not maze settings: {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **(PRESETS[preset] if preset is not None else {})}
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings


def parse_move(text: str) -> str | None:
    """The move named by ``text`` (see the module docstring), or None when it names none."""
    for word in _WORD.findall(text.lower()):
        if word in _ALIASES:
            return _ALIASES[word]
        # A word that is no move ("go", "eos" leftovers) is skipped; the first move word wins.
    return None


@dataclass(frozen=True)
class GridLayout:
    """One maze: ``rows`` (strings, border included), start and goal cells as (row, column)."""

    seed: int
    rows: tuple[str, ...]
    start: Cell
    goal: Cell

    @property
    def query_id(self) -> str:
        return f"grid:{len(self.rows) - 2}:{self.seed}"

    def is_free(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < len(self.rows) and 0 <= c < len(self.rows[r]) and self.rows[r][c] != WALL

    def moved(self, cell: Cell, move: str) -> Cell:
        """The cell a move leads to (the same cell when a wall is in the way)."""
        dr, dc = MOVES[move]
        nxt = (cell[0] + dr, cell[1] + dc)
        return nxt if self.is_free(nxt) else cell

    def distances_to_goal(self) -> dict[Cell, int]:
        """BFS distance from every reachable free cell to the goal (moves are symmetric)."""
        dist = {self.goal: 0}
        queue = deque([self.goal])
        while queue:
            cell = queue.popleft()
            for dr, dc in MOVES.values():
                nxt = (cell[0] + dr, cell[1] + dc)
                if nxt not in dist and self.is_free(nxt):
                    dist[nxt] = dist[cell] + 1
                    queue.append(nxt)
        return dist

    def observation(self, cell: Cell) -> str:
        """The 3x3 view around ``cell`` and the goal offset: ``"#../.@#/... +2,-1"``."""
        r, c = cell
        view = []
        for dr in (-1, 0, 1):
            row = []
            for dc in (-1, 0, 1):
                here = (r + dr, c + dc)
                if here == cell:
                    row.append(AGENT)
                elif here == self.goal:
                    row.append(GOAL)
                else:
                    row.append(FREE if self.is_free(here) else WALL)
            view.append("".join(row))
        return f"{'/'.join(view)} {_signed(self.goal[1] - c)},{_signed(self.goal[0] - r)}"

    def render(self, cell: Cell | None = None) -> str:
        """The whole map (for humans and tests), the agent at ``cell`` when given."""
        out = []
        for r, row in enumerate(self.rows):
            chars = list(row)
            if r == self.goal[0]:
                chars[self.goal[1]] = GOAL
            if cell is not None and r == cell[0]:
                chars[cell[1]] = AGENT
            out.append("".join(chars))
        return "\n".join(out)


def _signed(n: int) -> str:
    """``+2``, ``-1``, ``0``: a sign only where it carries information."""
    return f"{n:+d}" if n else "0"


def generate_layout(
    seed: int, *, size: int = 5, wall_prob: float = 0.3, min_distance: int = 3, max_distance: int = 8
) -> GridLayout:
    """A deterministic layout for ``seed``: random interior walls, then a start and a goal whose shortest path has
    ``min_distance .. max_distance`` moves (redrawn from the same generator until one fits)."""
    rng = random.Random(seed)
    for _ in range(_MAX_DRAWS):
        grid = [[WALL] * (size + 2)] + [
            [WALL] + [WALL if rng.random() < wall_prob else FREE for _ in range(size)] + [WALL]
            for _ in range(size)
        ]
        grid.append([WALL] * (size + 2))
        free = [(r, c) for r in range(1, size + 1) for c in range(1, size + 1) if grid[r][c] == FREE]
        if len(free) < 2:
            continue
        goal = rng.choice(free)
        layout = GridLayout(seed, tuple("".join(row) for row in grid), goal, goal)
        dist = layout.distances_to_goal()
        starts = sorted(cell for cell, d in dist.items() if min_distance <= d <= max_distance)
        if not starts:
            continue
        return GridLayout(seed, layout.rows, rng.choice(starts), goal)
    raise ValueError(
        f"no layout with a start {min_distance}..{max_distance} moves from the goal after {_MAX_DRAWS} draws "
        f"(seed {seed}, size {size}, wall_prob {wall_prob})"
    )


def expert_move(layout: GridLayout, cell: Cell, distances: dict[Cell, int] | None = None) -> str:
    """A shortest-path move from ``cell`` on the true map (the expert may see what the agent cannot).

    Among the moves that shorten the path it prefers one that also shrinks the goal offset along the axis where the
    offset is larger, then the order of :data:`MOVES`: the choice most predictable from the agent's own view.
    """
    dist = layout.distances_to_goal() if distances is None else distances
    if cell == layout.goal:
        raise ValueError("the agent is already at the goal")
    if cell not in dist:
        raise ValueError(f"cell {cell} cannot reach the goal")
    best = [m for m in MOVES if dist.get(layout.moved(cell, m), 1 << 30) == dist[cell] - 1]
    dy, dx = layout.goal[0] - cell[0], layout.goal[1] - cell[1]

    def preference(move: str) -> tuple[int, int]:
        dr, dc = MOVES[move]
        along_larger = (dc != 0) if abs(dx) >= abs(dy) else (dr != 0)
        shrinks = dr * dy > 0 or dc * dx > 0
        return (0 if shrinks and along_larger else 1 if shrinks else 2, list(MOVES).index(move))

    return min(best, key=preference)


def solve(layout: GridLayout) -> list[str]:
    """The expert's moves from the start to the goal (a shortest path)."""
    dist = layout.distances_to_goal()
    cell, moves = layout.start, []
    while cell != layout.goal:
        move = expert_move(layout, cell, dist)
        moves.append(move)
        cell = layout.moved(cell, move)
    return moves


@dataclass
class GridEpisode:
    """One trajectory on a layout: position, step count and the memory window that the prompts show."""

    layout: GridLayout
    memory: int
    max_steps: int
    instruction: str = ""
    cell: Cell | None = None  # None: the layout's start
    steps: int = 0
    done: bool = False
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation, move or "?") per past step

    def __post_init__(self) -> None:
        if self.cell is None:
            self.cell = self.layout.start

    @property
    def obs_key(self) -> str:
        """The observation the next move acts on (HGPO's grouping key)."""
        return self.layout.observation(self.cell)

    @property
    def prompt(self) -> str:
        lines = [self.instruction] if self.instruction else []
        window = self.history[-self.memory :] if self.memory > 0 else []
        lines += [f"{obs}:{move}" for obs, move in window]
        lines.append(f"{self.obs_key}:")
        return "\n".join(lines)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one response; returns ``(next_prompt or "", reward, terminated, truncated, info)``."""
        if self.done:
            raise RuntimeError("the episode is over; start a new one")
        move = parse_move(action)
        obs_before = self.obs_key
        nxt = self.cell if move is None else self.layout.moved(self.cell, move)
        bumped = move is not None and nxt == self.cell
        self.history.append((obs_before, INVALID_MARK if move is None else move))
        self.cell, self.steps = nxt, self.steps + 1
        reached = nxt == self.layout.goal
        truncated = not reached and self.steps >= self.max_steps
        self.done = reached or truncated
        reward = 1.0 if reached else 0.0
        info = {
            "query_id": self.layout.query_id,
            "correct": reached,
            "reward_components": {"goal": reward},
            "move": move,
            "invalid": move is None,
            "bumped": bumped,
            "step": self.steps - 1,
            "acted_obs_key": obs_before,
            "obs_key": None if self.done else self.obs_key,
        }
        return ("" if self.done else self.prompt), reward, reached, truncated, info

    def state(self) -> dict[str, Any]:
        return {
            "query_id": self.layout.query_id,
            "cell": list(self.cell),
            "steps": self.steps,
            "done": self.done,
            "history": [list(h) for h in self.history],
        }


def _check_settings(
    settings: dict[str, Any], *, split: str, num_queries: int, pool_seed: int, instruction: str
) -> None:
    """Refuse an unknown split and out-of-range maze settings (``settings``: resolved, see resolve_settings)."""
    size, wall_prob = settings["size"], settings["wall_prob"]
    min_distance, max_distance = settings["min_distance"], settings["max_distance"]
    max_steps, memory = settings["max_steps"], settings["memory"]
    if split not in SPLIT_SEED_OFFSETS:
        raise ValueError(f"split must be one of {sorted(SPLIT_SEED_OFFSETS)}, got {split!r}")
    for name, value, low in (
        ("size", size, 2),
        ("min_distance", min_distance, 1),
        ("max_steps", max_steps, 1),
        ("memory", memory, 0),
        ("num_queries", num_queries, 1),
        ("pool_seed", pool_seed, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not isinstance(max_distance, int) or max_distance < min_distance:
        raise ValueError(f"max_distance must be an int >= min_distance={min_distance}, got {max_distance!r}")
    if isinstance(wall_prob, bool) or not isinstance(wall_prob, (int, float)) or not 0.0 <= wall_prob < 1.0:
        raise ValueError(f"wall_prob must be in [0, 1), got {wall_prob}")
    if num_queries >= _POOL_STRIDE:
        raise ValueError(f"num_queries must be < {_POOL_STRIDE} (the seed range of one pool)")
    bad = sorted({ch for ch in instruction if not (32 <= ord(ch) < 127)})
    if bad:
        raise ValueError(f"instruction must be printable ASCII on one line; bad characters {bad}")


class GridWorldEnv(EpisodicTextEnv):
    """Multi-step text gridworld (see the module docstring).

    Config:
        preset: a name in :data:`PRESETS` whose settings replace the defaults below; an argument given explicitly
            (not None) still wins.
        size: interior side of the square maze (cells), >= 2.
        wall_prob: probability of a wall in each interior cell.
        min_distance, max_distance: shortest-path length (moves) from start to goal.
        max_steps: horizon; the episode is truncated after this many moves.
        memory: H, the past observations and moves shown in each prompt.
        instruction: an optional first line of every prompt (printable ASCII).
        num_queries: layouts per split.
        pool_seed: which layouts form the pools (offsets every split's seed range).
        seed: the per-epoch shuffle of the layouts (see ``QueryOrder``); shuffle: reshuffle every epoch.
        shard: serve only this part of each epoch's order (a :class:`~r3_rllib.envs.data.Shard` or a mapping
            ``{batch_size, start, count}``); the EnvRunners set it so that together they walk one global order per
            epoch. None: the whole pool.
        split: ``"train"``, ``"test"`` (held-out layouts) or ``"sft"`` (layouts for warm-start data).
        tokenizer, eos_text: accepted for the runner's uniform env construction; eos texts in responses are
            ignored by the lenient move parser anyway. The tokenizer counts the prompts' tokens for the context
            check.
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills
            them in); a layout whose first prompt is too long for them raises ``DataError`` naming it
            (:mod:`r3_rllib.envs.context`). None: no check.
    """

    def __init__(
        self,
        *,
        preset: str | None = None,
        size: int | None = None,
        wall_prob: float | None = None,
        min_distance: int | None = None,
        max_distance: int | None = None,
        max_steps: int | None = None,
        memory: int | None = None,
        instruction: str = "",
        num_queries: int = 500,
        pool_seed: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        split: Literal["train", "test", "sft"] = "train",
        tokenizer: Any = None,
        eos_text: str | Sequence[str] | None = None,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
    ) -> None:
        super().__init__()
        del eos_text
        # None stands for "not given" (DEFAULTS, or the preset's value); see resolve_settings.
        settings = resolve_settings(
            preset,
            size=size,
            wall_prob=wall_prob,
            min_distance=min_distance,
            max_distance=max_distance,
            max_steps=max_steps,
            memory=memory,
        )
        size, wall_prob = settings["size"], settings["wall_prob"]
        min_distance, max_distance = settings["min_distance"], settings["max_distance"]
        max_steps, memory = settings["max_steps"], settings["memory"]
        _check_settings(
            settings, split=split, num_queries=num_queries, pool_seed=pool_seed, instruction=instruction
        )
        self.preset = preset
        self.size, self.wall_prob = size, float(wall_prob)
        self.min_distance, self.max_distance = min_distance, max_distance
        self.max_steps, self.memory, self.instruction = max_steps, memory, instruction
        self.split, self.pool_seed = split, pool_seed
        self.layouts = self._pool(split, num_queries)
        self._by_id = {lay.query_id: lay for lay in self.layouts}
        self._order = QueryOrder(len(self.layouts), seed=seed, shuffle=shuffle, shard=shard)
        self._episode: GridEpisode | None = None
        prompts = ((qid, self.episode(qid).prompt) for qid in self._by_id)
        counter = (
            None if model_max_positions is None else load_tokenizer(tokenizer)
        )  # a folder loads only here
        check_prompts_fit(prompts, counter, model_max_positions, max_new_tokens, env_name="gridworld")

    @property
    def settings(self) -> dict[str, Any]:
        """The resolved maze settings (the keys of :data:`DEFAULTS`), e.g. for a warm start's metadata."""
        return {
            "size": self.size,
            "wall_prob": self.wall_prob,
            "min_distance": self.min_distance,
            "max_distance": self.max_distance,
            "max_steps": self.max_steps,
            "memory": self.memory,
        }

    # -- layouts -------------------------------------------------------------------------------------------------
    def _seeds(self, split: str) -> Iterator[int]:
        start = SPLIT_SEED_OFFSETS[split] + self.pool_seed * _POOL_STRIDE
        return iter(range(start, start + _POOL_STRIDE))

    def _layout(self, seed: int) -> GridLayout:
        return generate_layout(
            seed,
            size=self.size,
            wall_prob=self.wall_prob,
            min_distance=self.min_distance,
            max_distance=self.max_distance,
        )

    def _pool(self, split: str, n: int) -> list[GridLayout]:
        """``n`` layouts of ``split``; held-out splits skip any layout (walls, start, goal) equal to a train one."""
        exclude: set[tuple[Any, ...]] = set()
        if split != "train":
            exclude = {(lay.rows, lay.start, lay.goal) for lay in self._pool("train", n)}
        out: list[GridLayout] = []
        for seed in self._seeds(split):
            if len(out) == n:
                break
            layout = self._layout(seed)
            if (layout.rows, layout.start, layout.goal) not in exclude:
                out.append(layout)
        return out

    def layout(self, query_id: str) -> GridLayout:
        try:
            return self._by_id[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not in this environment's {self.split} pool of "
                f"{len(self.layouts)} layouts"
            ) from None

    @property
    def query_ids(self) -> list[str]:
        return [lay.query_id for lay in self.layouts]

    def episode(self, query_id: str) -> GridEpisode:
        """A fresh, independent episode on that layout (for lockstep rollouts of a query's G trajectories)."""
        return GridEpisode(self.layout(query_id), self.memory, self.max_steps, self.instruction)

    # -- TextEnv -------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.layouts)

    def reset_info(self, query_id: str) -> dict[str, Any]:
        return {"step": 0, "optimal_steps": len(solve(self.layout(query_id)))}

    def state(self) -> dict[str, Any]:
        """The layout order and the episode in progress (so a restore continues it move for move)."""
        return {
            "order": self._order.state(),
            "episode": None if self._episode is None else self._episode.state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._order.set_state(state["order"])
        ep = state.get("episode")
        if ep is None:
            self._episode = None
            return
        episode = self.episode(ep["query_id"])
        cell = (int(ep["cell"][0]), int(ep["cell"][1]))
        if not episode.layout.is_free(cell):
            raise ValueError(f"saved cell {cell} is a wall of layout {ep['query_id']}")
        episode.cell, episode.steps, episode.done = cell, int(ep["steps"]), bool(ep["done"])
        episode.history = [(str(o), str(m)) for o, m in ep["history"]]
        self._episode = episode


def expert_sft_pairs(
    env: GridWorldEnv, *, episodes: int, noise: float = 0.0, seed: int = 0
) -> list[tuple[str, str]]:
    """(prompt, move) pairs from expert rollouts on ``env``'s layouts, for warm-start fine-tuning.

    ``episodes`` episodes cycle over the pool; with probability ``noise`` the rollout takes a random move instead of
    the expert's (the pair still records the expert's move from the cell reached), so the data also covers
    histories with detours and bumps, as a sampling policy produces. Deterministic for ``seed``.
    """
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise must be in [0, 1), got {noise}")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    ids = env.query_ids
    for i in range(episodes):
        ep = env.episode(ids[i % len(ids)])
        dist = ep.layout.distances_to_goal()
        while not ep.done:
            label = expert_move(ep.layout, ep.cell, dist)
            pairs.append((ep.prompt, label))
            taken = rng.choice(list(MOVES)) if rng.random() < noise else label
            ep.step(taken)
    return pairs
