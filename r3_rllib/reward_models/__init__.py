"""Reward terms beyond the env's rule grader: scalar reward models, generative judges (one response at a time, or a
whole group at once), rule functions, all behind :class:`~r3_rllib.rewards.scoring.RewardScorer`; and the reward
server, a Ray actor pool the driver grades each rollout with (:mod:`r3_rllib.reward_models.server`)."""
