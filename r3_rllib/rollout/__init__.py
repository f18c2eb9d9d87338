"""Ray-free rollout loops over a generation engine and an env (the multi-step lockstep loop in ``multistep.py``):
the env runner calls them inside its actor, and the gridworld warm start calls them to measure a model."""
