"""Tools a model may call during a rollout (multi-turn tool use): a sandbox for model-written Python."""

from r3_rllib.tools.sandbox import SandboxResult, run_python

__all__ = ["SandboxResult", "run_python"]
