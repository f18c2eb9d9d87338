"""Reward functions and an env class named by "module:attribute" paths in tests/unit/envs/test_reward_fn_env.py and
tests/unit/eval/test_env_eval.py (this folder is put on sys.path there)."""

from __future__ import annotations

import threading

from r3_rllib.envs.arithmetic import ArithmeticEnv

CALLS: list[dict] = []
#: What `sleeps` waits for (30 s at most): a test sets it once it has its answer, so the call ends then.
RELEASE = threading.Event()


def exact_match(prompt, completion, answer, **row):
    """1.0 when the completion is the row's answer, else 0.0."""
    return float(completion.strip() == str(answer))


def recording(prompt, completion, **row):
    """Records its arguments; the reward is the completion's length."""
    CALLS.append({"prompt": prompt, "completion": completion, **row})
    return len(completion)


def parts(prompt, completion, answer, **row):
    """A dict of parts: correctness and a format bonus, no total (the reward is their sum)."""
    right = completion.strip() == str(answer)
    return {"correct_part": float(right), "format": 0.25 if completion.strip().isdigit() else 0.0}


def with_total(prompt, completion, answer, **row):
    """A dict with its own total, a correct flag and a reason."""
    right = completion.strip() == str(answer)
    return {
        "reward": 2.0 if right else -1.0,
        "length": float(len(completion)),
        "correct": right,
        "reason": "judged",
    }


def raises(prompt, completion, **row):
    raise ZeroDivisionError("the reward function divided by zero")


def returns_text(prompt, completion, **row):
    return "yes"


def sleeps(prompt, completion, **row):
    """A reward function that hangs until RELEASE is set (30 s at most), then gives 1.0."""
    RELEASE.wait(30)
    return 1.0


def trl_style(prompts, completions, answer, **kwargs):
    """TRL's GRPOTrainer form: lists in, a list of rewards out."""
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer, strict=True)]


class SmallArithmetic(ArithmeticEnv):
    """An env of one's own module, named as "reward_fns:SmallArithmetic"."""

    def __init__(self, **config):
        super().__init__(num_queries=3, digits=1, **config)


NOT_AN_ENV = 42


class NotATextEnv:
    pass
