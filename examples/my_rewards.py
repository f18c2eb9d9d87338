"""Reward functions for examples/reward_fn_task.py, named in a config as "my_rewards:exact_match" (a module:function
path: the EnvRunners import it by name, so it must be importable where they run; Ray adds the current directory and
the script's folder to its workers' paths).

A reward function takes the prompt, the completion (its end-of-sequence token removed) and the row's other columns
as keywords, and returns a number, or a dict of parts (see r3_rllib/envs/reward_fn.py).
"""

from __future__ import annotations


def exact_match(prompt: str, completion: str, answer: str, **row) -> float:
    """1 when the completion is the row's answer, else 0."""
    return float(completion.strip() == str(answer))


def graded(prompt: str, completion: str, answer: str, **row) -> dict:
    """The same reward with its parts: the answer, and a small bonus for answering with digits only. The reward is
    the sum of the parts; "correct" says which samples count as correct (accuracy, replay, reflection) and "reason"
    is the grade reason counted in the metrics (rollout/grade_reason/<reason>_frac)."""
    text = completion.strip()
    right = text == str(answer)
    digits = 0.1 if text.isdigit() else 0.0
    reason = "correct" if right else "not_a_number" if not text.isdigit() else "wrong"
    return {"answer": float(right), "digits": digits, "correct": right, "reason": reason}
