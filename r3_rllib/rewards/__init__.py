"""Verifiable rewards: rule-based math grading (last ``\\boxed{}`` vs gold, math-verify in a worker process)."""

from r3_rllib.rewards.math_grader import (
    GradeResult,
    MathGrader,
    extract_boxed,
    grade_math,
    grade_math_detailed,
    shared_grader,
)

__all__ = ["GradeResult", "MathGrader", "extract_boxed", "grade_math", "grade_math_detailed", "shared_grader"]
