"""Verifiable rewards: rule-based math grading (last ``\\boxed{}`` vs gold, math-verify in a worker process), and a
time limit for reward code the package does not own (:func:`bounded_call`)."""

from r3_rllib.rewards.bounded import DEFAULT_REWARD_TIMEOUT_S, Bounded, bounded_call
from r3_rllib.rewards.math_grader import (
    GradeResult,
    MathGrader,
    extract_boxed,
    grade_math,
    grade_math_detailed,
    shared_grader,
)

__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "Bounded",
    "GradeResult",
    "MathGrader",
    "bounded_call",
    "extract_boxed",
    "grade_math",
    "grade_math_detailed",
    "shared_grader",
]
