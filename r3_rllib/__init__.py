"""r3-rllib: R^3 and GRPO for large reasoning models as a Ray RLlib plugin algorithm."""
