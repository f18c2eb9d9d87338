"""The multi-step text gridworld (r3_rllib/envs/gridworld.py)."""

import itertools

import pytest

from r3_rllib.envs.gridworld import (
    DEFAULTS,
    MOVES,
    PRESETS,
    GridLayout,
    GridWorldEnv,
    expert_move,
    expert_sft_pairs,
    generate_layout,
    parse_move,
    resolve_settings,
    solve,
)
from r3_rllib.models.tiny import CHARACTERS

# Hand-made 3x3 maze (border included): start bottom-left, goal top-right, a wall in the middle.
#   #####
#   #..G#     row 1
#   #.#.#     row 2
#   #@..#     row 3
#   #####
SMALL = GridLayout(seed=-1, rows=("#####", "#...#", "#.#.#", "#...#", "#####"), start=(3, 1), goal=(1, 3))


def _brute_force_shortest(layout: GridLayout, limit: int = 8) -> int:
    """Shortest number of moves by trying every move sequence (independent of the BFS)."""
    for n in range(limit + 1):
        for seq in itertools.product(MOVES, repeat=n):
            cell = layout.start
            for m in seq:
                cell = layout.moved(cell, m)
            if cell == layout.goal:
                return n
    raise AssertionError("no path within the limit")


def test_parse_move_lenient():
    assert parse_move("up") == "up"
    assert parse_move("  Right<eos>") == "right"
    assert parse_move("I go north") == "up"
    assert parse_move("w") == "left"
    assert parse_move("go  down then up") == "down"
    assert parse_move("jump") is None
    assert parse_move("") is None
    assert parse_move("upward") is None  # not a move word


def test_observation_view_and_offset():
    assert SMALL.observation((3, 1)) == "#.#/#@./### +2,-2"
    assert SMALL.observation((1, 2)) == "###/.@G/.#. +1,0"
    assert SMALL.render((3, 1)).splitlines()[1] == "#..G#"


def test_walls_bump_and_goal_terminates():
    ep = GridWorldEnv(num_queries=1).episode("grid:5:0")
    ep.layout = SMALL
    ep.cell = SMALL.start
    prompt, reward, term, trunc, info = ep.step("left")  # wall
    assert info["bumped"] and ep.cell == (3, 1) and reward == 0.0 and not term and not trunc
    assert prompt.splitlines()[0] == "#.#/#@./### +2,-2:left"
    for move in ("right", "right", "up"):
        prompt, reward, term, trunc, info = ep.step(move)
        assert reward == 0.0 and not term
    prompt, reward, term, trunc, info = ep.step("up")
    assert (reward, term, trunc, prompt, info["correct"], info["obs_key"]) == (
        1.0,
        True,
        False,
        "",
        True,
        None,
    )
    with pytest.raises(RuntimeError, match="over"):
        ep.step("up")


def test_invalid_action_stays_counts_and_truncates():
    env = GridWorldEnv(num_queries=3, max_steps=2)
    prompt, info = env.reset(options={"query_id": env.query_ids[0]})
    key = info["obs_key"]
    nxt, reward, term, trunc, info = env.step("dance")
    assert info["invalid"] and info["move"] is None and info["obs_key"] == key and reward == 0.0
    assert not term and not trunc
    assert nxt.splitlines()[0] == f"{key}:?"
    _, _, term, trunc, info = env.step("???")
    assert trunc and not term and not info["correct"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("up")


def test_memory_window_and_instruction():
    env = GridWorldEnv(num_queries=1, memory=1, instruction="reach G", max_steps=20)
    prompt, _ = env.reset()
    assert prompt.splitlines()[0] == "reach G" and len(prompt.splitlines()) == 2
    for move in ("up", "left", "down"):
        prompt, *_ = env.step(move)
    lines = prompt.splitlines()
    assert len(lines) == 3 and lines[1].endswith(":down") and lines[2].endswith(":")
    env0 = GridWorldEnv(num_queries=1, memory=0)
    p0, _ = env0.reset()
    p0, *_ = env0.step("up")
    assert len(p0.splitlines()) == 1


def test_prompts_use_only_tiny_tokenizer_characters():
    env = GridWorldEnv(num_queries=20)
    chars = set(CHARACTERS)
    for prompt, move in expert_sft_pairs(env, episodes=20, noise=0.3, seed=1):
        assert set(prompt) <= chars and set(move) <= chars


def test_layouts_deterministic_and_splits_disjoint():
    a, b = GridWorldEnv(num_queries=50), GridWorldEnv(num_queries=50, seed=9)
    assert [lay.rows for lay in a.layouts] == [lay.rows for lay in b.layouts]
    assert generate_layout(123) == generate_layout(123)
    test = GridWorldEnv(num_queries=50, split="test")
    train_set = {(lay.rows, lay.start, lay.goal) for lay in a.layouts}
    assert not train_set & {(lay.rows, lay.start, lay.goal) for lay in test.layouts}
    assert not set(a.query_ids) & set(test.query_ids)
    assert len(set(a.query_ids)) == 50
    other_pool = GridWorldEnv(num_queries=50, pool_seed=1)
    assert not set(a.query_ids) & set(other_pool.query_ids)


def test_layout_distances_in_range():
    env = GridWorldEnv(num_queries=100, min_distance=4, max_distance=6)
    for lay in env.layouts:
        assert 4 <= len(solve(lay)) <= 6
        assert lay.rows[0] == "#" * 7 and all(row[0] == row[-1] == "#" for row in lay.rows)


def test_same_rollout_given_seed_and_actions():
    def run(seed):
        env = GridWorldEnv(num_queries=30, seed=seed)
        out = []
        for _ in range(5):
            prompt, info = env.reset()
            out.append((info["query_id"], prompt))
            for move in ("up", "right", "down"):
                out.append(env.step(move)[:4])
        return out

    assert run(3) == run(3)
    assert run(3) != run(4)  # another shuffle of the same pool


def test_solver_optimal_on_small_maps():
    assert solve(SMALL) == ["right", "right", "up", "up"]
    assert len(solve(SMALL)) == _brute_force_shortest(SMALL) == 4
    env = GridWorldEnv(size=3, num_queries=25, min_distance=1, max_distance=6)
    for lay in env.layouts:
        moves = solve(lay)
        assert len(moves) == _brute_force_shortest(lay)
        cell = lay.start
        for m in moves:
            cell = lay.moved(cell, m)
        assert cell == lay.goal
    with pytest.raises(ValueError, match="already at the goal"):
        expert_move(SMALL, SMALL.goal)


def test_expert_prefers_the_larger_offset_axis():
    # from (3, 1) the goal is 2 right and 2 up: both 'up' and 'right' are shortest; ties on the axis size go to
    # the horizontal axis (|dx| >= |dy|)
    assert expert_move(SMALL, (3, 1)) == "right"
    # from (3, 2): goal 1 right, 2 up, but 'up' hits the wall: 'right' is the only shortest move
    assert expert_move(SMALL, (3, 2)) == "right"


def test_same_observation_reached_by_different_histories():
    # Two trajectories of one query reach the same cell by different routes: equal obs keys, different prompts.
    env = GridWorldEnv(num_queries=200)
    found = 0
    for qid in env.query_ids:
        for route_a, route_b in ((("up", "right"), ("right", "up")), (("down", "left"), ("left", "down"))):
            a, b = env.episode(qid), env.episode(qid)
            infos_a = [a.step(m) for m in route_a]
            infos_b = [b.step(m) for m in route_b]
            if a.done or b.done or any(i[4]["bumped"] for i in infos_a + infos_b):
                continue
            assert a.cell == b.cell and a.obs_key == b.obs_key
            assert a.prompt != b.prompt  # the memory window differs
            found += 1
    assert found > 20


def test_expert_rollouts_reach_the_goal_and_sft_pairs():
    env = GridWorldEnv(num_queries=40)
    pairs = expert_sft_pairs(env, episodes=40)
    assert len(pairs) == sum(len(solve(lay)) for lay in env.layouts)
    for qid in env.query_ids:
        prompt, info = env.reset(options={"query_id": qid})
        for move in solve(env.layout(qid)):
            prompt, reward, term, trunc, info = env.step(move)
        assert term and reward == 1.0
    noisy = expert_sft_pairs(env, episodes=40, noise=0.5, seed=2)
    assert noisy == expert_sft_pairs(env, episodes=40, noise=0.5, seed=2)
    assert len(noisy) > len(pairs)
    with pytest.raises(ValueError, match="noise"):
        expert_sft_pairs(env, episodes=1, noise=1.0)


def test_state_round_trip_mid_episode():
    env = GridWorldEnv(num_queries=10, seed=5)
    env.reset()
    env.reset()
    env.step("up")
    env.step("left")
    saved = env.state()
    other = GridWorldEnv(num_queries=10, seed=0)
    other.set_state(saved)
    assert other.state() == saved
    for move in ("down", "right", "xyz"):
        assert other.step(move) == env.step(move)
    assert [other.reset()[0] for _ in range(12)] == [env.reset()[0] for _ in range(12)]
    with pytest.raises(ValueError, match="unknown query_id"):
        other.set_state({**saved, "episode": {**saved["episode"], "query_id": "grid:5:999999"}})


def test_bad_config_and_options():
    with pytest.raises(ValueError, match="split"):
        GridWorldEnv(split="dev")
    with pytest.raises(ValueError, match="size"):
        GridWorldEnv(size=1)
    with pytest.raises(ValueError, match="max_distance"):
        GridWorldEnv(min_distance=5, max_distance=3)
    with pytest.raises(ValueError, match="instruction"):
        GridWorldEnv(instruction="two\nlines")
    with pytest.raises(ValueError, match="no layout"):
        generate_layout(0, size=2, min_distance=5, max_distance=6)
    env = GridWorldEnv(num_queries=2)
    with pytest.raises(ValueError, match="unknown query_id"):
        env.reset(options={"query_id": "grid:5:424242"})
    with pytest.raises(ValueError, match="user_content"):
        env.reset(options={"query_id": env.query_ids[0], "user_content": "hi"})


def test_registered_as_text_env():
    from r3_rllib.envs.registry import make_text_env

    env = make_text_env("gridworld", num_queries=3)
    assert isinstance(env, GridWorldEnv) and len(env) == 3


def test_sft_pairs_encoding_masks_the_move_and_eos():
    from r3_rllib.models.tiny import build_tiny_tokenizer
    from r3_rllib.warmstart.gridworld import encode_pairs

    tok = build_tiny_tokenizer()
    ids, attn, mask = encode_pairs([("ab:", "up"), ("a:", "left")], tok)
    assert tok.decode(ids[0, :6].tolist()) == "ab:up" + tok.eos_token
    assert attn[1].tolist() == [1] * 7 and attn[0].tolist() == [1] * 6 + [0]
    # position t predicts token t + 1: targets are "u", "p", eos (positions 2..4 of row 0)
    assert mask[0].tolist() == [0, 0, 1, 1, 1, 0]
    assert mask[1].tolist() == [0, 1, 1, 1, 1, 1]


def test_plain_defaults_unchanged():
    env = GridWorldEnv(num_queries=1)
    assert env.settings == DEFAULTS == resolve_settings()
    assert env.preset is None and env.query_ids == ["grid:5:0"]


def test_hgpo_preset_settings_and_overrides():
    env = GridWorldEnv(preset="hgpo", num_queries=60)
    assert env.settings == {**DEFAULTS, **PRESETS["hgpo"]} and env.preset == "hgpo"
    lengths = [len(solve(lay)) for lay in env.layouts]
    # multi-step: every optimal path has 5..10 moves, well inside the 20-step horizon
    assert min(lengths) >= 5 and max(lengths) <= 10 and env.max_steps == 20
    assert all(len(lay.rows) == 8 for lay in env.layouts)  # 6x6 interior plus the border
    # an explicit argument beats the preset; None means "not given"
    override = GridWorldEnv(preset="hgpo", num_queries=1, max_steps=7, memory=None)
    assert override.max_steps == 7 and override.memory == PRESETS["hgpo"]["memory"]
    assert resolve_settings("hgpo", size=4)["size"] == 4
    from r3_rllib.envs.registry import make_text_env

    assert make_text_env("gridworld", preset="hgpo", num_queries=2).settings == env.settings


def test_hgpo_preset_prompts_fit_the_tiny_tokenizer():
    env = GridWorldEnv(preset="hgpo", num_queries=20, split="sft")
    pairs = expert_sft_pairs(env, episodes=20, noise=0.3, seed=0)
    assert set("".join(p + m for p, m in pairs)) <= set(CHARACTERS)


def test_bad_preset():
    with pytest.raises(ValueError, match="unknown gridworld preset"):
        GridWorldEnv(preset="huge")
    with pytest.raises(ValueError, match="not maze settings"):
        resolve_settings(num_queries=3)
    with pytest.raises(ValueError, match="wall_prob"):
        GridWorldEnv(preset="hgpo", wall_prob=1.0)


def test_warm_start_config_is_cheap_and_checked():
    # The builder's config (no training here): settings resolved from the preset, unknown env keys refused.
    from r3_rllib.warmstart.cached import config_hash as _config_hash
    from r3_rllib.warmstart.gridworld import WARM_START_PRESET, warm_start_config

    cfg = warm_start_config(seed=3)
    assert cfg["preset"] == WARM_START_PRESET and cfg["env"]["size"] == PRESETS[WARM_START_PRESET]["size"]
    assert cfg["seed"] == 3 and 1 <= cfg["warmup_steps"] <= cfg["steps"]
    assert _config_hash(cfg) == _config_hash(warm_start_config(seed=3))
    assert _config_hash(cfg) != _config_hash(warm_start_config(seed=4))
    assert warm_start_config(env_config={"max_steps": 9})["env"]["max_steps"] == 9
    with pytest.raises(ValueError, match="do not shape the prompts"):
        warm_start_config(env_config={"num_queries": 5})


def test_runner_shards_split_one_global_layout_order():
    """Two runners' shards of one 8-layout batch serve disjoint layouts that together are the whole batch, and
    the EnvRunner config gives the gridworld a shard as it gives the arithmetic env one."""
    from r3_rllib.algorithms.r3.config import R3Config
    from r3_rllib.algorithms.r3.runner_setup import env_accepts_shard, runner_env_config

    cfg = R3Config().environment("gridworld", env_config={"num_queries": 16}).env_runners(num_env_runners=2)
    cfg.training(queries_per_iteration=8)
    assert env_accepts_shard("gridworld")
    envs = [GridWorldEnv(**runner_env_config(cfg, i)) for i in (1, 2)]
    served = [[env.reset()[1]["query_id"] for _ in range(4)] for env in envs]
    assert not set(served[0]) & set(served[1])
    whole = GridWorldEnv(num_queries=16, seed=cfg.seed)
    assert sorted(served[0] + served[1]) == sorted(whole.reset()[1]["query_id"] for _ in range(8))
