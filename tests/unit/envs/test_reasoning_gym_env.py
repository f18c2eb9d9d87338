"""The reasoning-gym env: task specs, disjoint splits, data order, grading by the task's verifier, failures."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from r3_rllib.envs.reasoning_gym import ReasoningGymEnv, task_specs  # noqa: E402


def _answer(env: ReasoningGymEnv, info) -> str:
    return f"<answer>{info['gold']}</answer>"


def test_correct_wrong_and_missing_answers_are_graded_by_the_task_verifier():
    env = ReasoningGymEnv(tasks="basic_arithmetic", size=20, test_size=5, seed=1)
    prompt, info = env.reset()
    assert (
        info["query_text"] in prompt and "<answer>" in prompt
    )  # reasoning-gym's system prompt states the format
    _, reward, terminated, _, step_info = env.step("thinking... " + _answer(env, info))
    assert (reward, terminated, step_info["correct"], step_info["grade_reason"]) == (
        1.0,
        True,
        True,
        "correct",
    )
    env.reset(options={"query_id": info["query_id"]})
    _, reward, _, _, step_info = env.step("<answer>not a number</answer>")
    assert reward == 0.0 and not step_info["correct"] and step_info["grade_reason"] == "wrong"
    env.reset(options={"query_id": info["query_id"]})
    _, reward, _, _, step_info = env.step(str(info["gold"]))
    assert reward == 0.0 and step_info["grade_reason"] == "no_answer"


def test_train_and_test_splits_are_disjoint_and_reproducible():
    train = ReasoningGymEnv(tasks="basic_arithmetic", size=300, test_size=100, seed=0)
    test = ReasoningGymEnv(tasks="basic_arithmetic", split="test", size=300, test_size=100, seed=0)
    train_q = {e["question"] for e in train.entries}
    test_q = {e["question"] for e in test.entries}
    assert len(test) == 100 and not train_q & test_q
    assert len(train) + train.data_report["dropped_in_test_split"] == 300
    again = ReasoningGymEnv(tasks="basic_arithmetic", size=300, test_size=100, seed=0)
    assert [e["question"] for e in again.entries] == [e["question"] for e in train.entries]


def test_weighted_mix_of_tasks_and_sharded_order():
    kwargs = dict(tasks={"basic_arithmetic": 1.0, "leg_counting": 1.0}, size=40, test_size=8, seed=2)
    env = ReasoningGymEnv(**kwargs)
    tasks = set()
    for _ in range(len(env)):
        _, info = env.reset()
        _, _, _, _, step_info = env.step(_answer(env, info))
        assert step_info["correct"]  # the composite dataset dispatches to each task's verifier
        tasks.add(step_info["task"])
    assert tasks == {"basic_arithmetic", "leg_counting"}
    # Two shards of the same global order see disjoint queries.
    shards = [ReasoningGymEnv(**kwargs, shard={"batch_size": 2, "start": i, "count": 1}) for i in range(2)]
    seen = [{s.reset()[1]["query_id"] for _ in range(len(s) // 2)} for s in shards]
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 2 * (len(env) // 2)


def test_checkpointed_order_resumes():
    env = ReasoningGymEnv(tasks="basic_arithmetic", size=30, test_size=5, seed=3)
    for _ in range(7):
        env.reset()
    state = env.state()
    expected = [env.reset()[1]["query_id"] for _ in range(5)]
    fresh = ReasoningGymEnv(tasks="basic_arithmetic", size=30, test_size=5, seed=3)
    fresh.set_state(state)
    assert [fresh.reset()[1]["query_id"] for _ in range(5)] == expected


def test_verifier_exception_scores_zero_with_its_reason():
    env = ReasoningGymEnv(tasks="basic_arithmetic", size=10, test_size=2, seed=4)

    def broken(answer, entry):
        raise RuntimeError("verifier bug")

    env.dataset.score_answer = broken
    env.reset()
    _, reward, _, _, info = env.step("<answer>3</answer>")
    assert (
        reward == 0.0 and info["grade_reason"] == "verifier_error" and "verifier bug" in info["grade_detail"]
    )


def test_bad_tasks_get_clear_errors():
    with pytest.raises(ValueError, match="unknown reasoning-gym task 'basic_arithmetik'.*basic_arithmetic"):
        task_specs("basic_arithmetik")
    with pytest.raises(ValueError, match="could not be built.*max_terms"):
        ReasoningGymEnv(tasks={"basic_arithmetic": {"config": {"min_terms": 5, "max_terms": 2}}}, size=5)
    with pytest.raises(ValueError, match="weight must be > 0"):
        task_specs({"basic_arithmetic": 0.0})


def test_plain_prompt_without_system_prompt_and_binary_reward():
    env = ReasoningGymEnv(tasks="leg_counting", size=10, test_size=2, reward="binary", system_prompt=None)
    prompt, info = env.reset()
    assert prompt == info["query_text"]  # no chat template, no system prompt: the question as is
    _, reward, _, _, _ = env.step(f"<answer>{info['gold']}</answer>")
    assert reward == 1.0


def test_reachable_by_name_through_the_env_registry():
    from r3_rllib.envs.registry import make_text_env, registered_text_envs

    assert "reasoning_gym" in registered_text_envs()
    env = make_text_env("reasoning_gym", tasks="leg_counting", size=5, test_size=2)
    assert isinstance(env, ReasoningGymEnv) and len(env) >= 1


def test_few_shot_examples_come_before_the_problem_and_are_never_graded_problems():
    kwargs = dict(tasks="chain_sum", size=30, test_size=10, seed=3, system_prompt=None, few_shot=2)
    train, test = ReasoningGymEnv(**kwargs), ReasoningGymEnv(**kwargs, split="test")
    assert len(train.examples) == len(test.examples) == 2
    shown = {e["question"] for e in train.examples} | {e["question"] for e in test.examples}
    assert not shown & {e["question"] for e in test.entries}  # a held-out answer is never in a prompt
    assert not {e["question"] for e in train.examples} & {e["question"] for e in train.entries}
    prompt, info = train.reset()
    first, second = train.examples
    # plain text (no chat template): each example's question and tagged answer, then the problem
    assert prompt == (
        f"{first['question']}\n<answer>{first['answer']}</answer>\n\n"
        f"{second['question']}\n<answer>{second['answer']}</answer>\n\n{info['query_text']}"
    )
    _, reward, _, _, _ = train.step(f"<answer>{info['gold']}</answer>")
    assert reward == 1.0
    with pytest.raises(ValueError, match="few_shot must be >= 0"):
        ReasoningGymEnv(tasks="chain_sum", size=5, test_size=2, few_shot=-1)


class _RecordingChatTokenizer:
    chat_template = "<chat template>"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        self.messages = messages
        return "<rendered>"


def test_few_shot_examples_of_a_small_task_avoid_test_problems():
    # sums of two one-digit numbers: 100 distinct problems, all drawn for training or test here
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    kwargs = dict(tasks={"chain_sum": {"config": config}}, size=400, test_size=40, seed=0, few_shot=3)
    env, test = ReasoningGymEnv(**kwargs), ReasoningGymEnv(**kwargs, split="test")
    assert len(env.examples) == 3
    assert not {e["question"] for e in env.examples} & {e["question"] for e in test.entries}


def test_few_shot_examples_are_earlier_chat_turns_with_a_chat_template():
    tokenizer = _RecordingChatTokenizer()
    env = ReasoningGymEnv(tasks="gcd", size=10, test_size=2, seed=0, tokenizer=tokenizer, few_shot=1)
    prompt, info = env.reset(options={"query_id": "train/0", "user_content": "reflect on this"})
    (example,) = env.examples
    assert prompt == "<rendered>"
    assert [m["role"] for m in tokenizer.messages] == ["system", "user", "assistant", "user"]
    assert tokenizer.messages[1:] == [
        {"role": "user", "content": example["question"]},
        {"role": "assistant", "content": f"<answer>{example['answer']}</answer>"},
        {"role": "user", "content": "reflect on this"},  # R^3's reflection prompt keeps the examples
    ]


def test_run_seeds_draw_different_problems_and_seed_0_keeps_reasoning_gyms_own():
    """reasoning-gym draws problem i with ``seed + i``: taken as generator seeds, run seeds 0 and 1 would share all
    but one problem of each split (seed 1's problem i is seed 0's problem i + 1). The env spreads run seeds apart."""
    import reasoning_gym as rg

    def questions(env: ReasoningGymEnv) -> list[str]:
        return [e["question"] for e in env.dataset]

    kwargs = dict(tasks="basic_arithmetic", size=40, test_size=40, system_prompt=None)
    seed0, seed1 = ReasoningGymEnv(seed=0, **kwargs), ReasoningGymEnv(seed=1, **kwargs)
    shifted = [e["question"] for e in rg.create_dataset("basic_arithmetic", size=41, seed=0)][1:]
    assert questions(seed1) != shifted and len(set(questions(seed1)) & set(questions(seed0))) <= 2
    assert questions(seed0) == [e["question"] for e in rg.create_dataset("basic_arithmetic", size=40, seed=0)]
    test0, test1 = (ReasoningGymEnv(seed=s, split="test", **kwargs) for s in (0, 1))
    assert len(set(questions(test0)) & set(questions(test1))) <= 2
    with pytest.raises(ValueError, match="seed must be >= 0"):
        ReasoningGymEnv(seed=-1, **kwargs)
    # A train split longer than the distance to the test split's seeds would reach into them: refused up front.
    with pytest.raises(ValueError, match=r"size and test_size must be in \[1, 1,000,003\]"):
        ReasoningGymEnv(seed=0, **{**kwargs, "size": 1_000_004})
    with pytest.raises(ValueError, match=r"size and test_size must be in"):
        ReasoningGymEnv(seed=0, **{**kwargs, "test_size": 1_000_004})
