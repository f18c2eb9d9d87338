"""Text environments: the TextEnv API, the registry, and the built-in tasks (arithmetic, math)."""

from r3_rllib.envs.base import TextEnv
from r3_rllib.envs.registry import (
    get_text_env_factory,
    make_text_env,
    register_text_env,
    registered_text_envs,
)

__all__ = ["TextEnv", "get_text_env_factory", "make_text_env", "register_text_env", "registered_text_envs"]
