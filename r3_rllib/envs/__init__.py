"""Text environments: the TextEnv API, the registry, and the built-in tasks (arithmetic, chat_arithmetic, math,
gridworld, and reward_fn: a dataset and a reward function of one's own).

Importing this package imports neither transformers nor math-verify: tokenizers load when a MathEnv gets a folder,
and math-verify runs in the grader's worker subprocess.
"""

from r3_rllib.envs.arithmetic import ArithmeticEnv, ArithmeticProblem, generate_arithmetic_problems
from r3_rllib.envs.base import PooledTextEnv, TextEnv
from r3_rllib.envs.data import (
    DataError,
    LoadReport,
    MathProblem,
    load_math_problems,
    load_math_problems_with_report,
)
from r3_rllib.envs.math_env import DEFAULT_PROMPT_TEMPLATE, MathEnv
from r3_rllib.envs.registry import (
    get_text_env_factory,
    load_object,
    make_text_env,
    register_text_env,
    registered_text_envs,
)
from r3_rllib.envs.reward_fn import RewardFnEnv

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "ArithmeticEnv",
    "ArithmeticProblem",
    "DataError",
    "LoadReport",
    "MathEnv",
    "MathProblem",
    "PooledTextEnv",
    "RewardFnEnv",
    "TextEnv",
    "generate_arithmetic_problems",
    "get_text_env_factory",
    "load_math_problems",
    "load_math_problems_with_report",
    "load_object",
    "make_text_env",
    "register_text_env",
    "registered_text_envs",
]
