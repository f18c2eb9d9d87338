"""RLlib algorithms of r3-rllib (each a package: config, algorithm, env runner, learner)."""
