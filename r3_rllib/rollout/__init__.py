"""Ray-free rollouts over a generation engine and an env: one module per rollout kind in ``kinds/`` (the loops,
their training groups, totals, held-out evaluation and config checks), and the per-sample records
(``records.py``). The env runner calls the kinds inside its actor; the gridworld warm start and the env evaluation
call the loops to measure a model."""
