"""Sweep R^3's parameters with Ray Tune: a grid over replay_k, sampled ranking_r_max and reflection_tau, and ASHA
stopping the trials whose rollout accuracy lags.

    python examples/tune_sweep.py                      # 6 trials x 30 iterations on the tiny arithmetic model
    python examples/tune_sweep.py --quick              # 2 trials x 1 iteration, tiny batches (a smoke test)
    python examples/tune_sweep.py --storage /tmp/sweeps --iterations 50 --address auto

Each trial is one `R3` algorithm (`tune.Tuner("R3", ...)` resolves the name after `import r3_rllib`). The search
space sits inside the config: `tune.grid_search` values multiply the trials, `tune.uniform`/`tune.choice` values are
drawn once per trial (and per repeat with `--num-samples`). ASHA compares trials at iterations grace_period,
grace_period * 4, ... and stops the worst 3/4 of each rung, so the compute goes to promising settings.

Resources: a trial asks for its main process (which holds the learner when num_learners=0) and one CPU per EnvRunner;
Tune runs as many trials at once as the cluster's CPUs allow. The replay actor asks for no CPU, so it fits inside a
trial's placement group.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

METRIC = "rollout/accuracy"


def build_param_space(*, quick: bool, model_path: str | None = None):
    """The R3Config holding the search space (Tune resolves the `tune.*` values per trial)."""
    from ray import tune

    from r3_rllib import R3Config

    if quick:
        # Smallest batches that still exercise the R^3 path: 4 queries x 4 samples, 5-token answers.
        sizes = dict(group_size=4, queries_per_iteration=4, max_new_tokens=5, micro_batch_size=16)
        env_config = {"digits": 2, "num_queries": 8, "seed": 0}  # 8 queries: epoch 1 starts at iteration 3
        grid = {"replay_k": tune.grid_search([1, 2])}  # 2 trials
    else:
        sizes = dict(group_size=8, queries_per_iteration=32, max_new_tokens=6, micro_batch_size=64)
        env_config = {"digits": 2, "num_queries": 256, "seed": 0}  # 8 iterations per dataset epoch
        grid = {"replay_k": tune.grid_search([1, 2, 4])}  # x num_samples draws of the sampled values below

    return (
        R3Config.r3_preset()
        .environment("arithmetic", env_config=env_config)
        # Half a CPU per runner and per main process: two quick trials fit on a 2-core machine (Ray's CPU counts
        # are logical; the tiny model needs little).
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .resources(num_cpus_for_main_process=0.5)
        .learners(num_learners=0)
        .training(model_path=model_path, lr=1e-3, num_epochs=1, **sizes)
        .r3(
            replay=True,
            reflection=True,
            ranking=True,
            # Turn the three parts on from the first iteration (the paper's schedule keeps epoch 0 plain GRPO;
            # a short sweep would otherwise never see them).
            replay_start_epoch=0,
            reflection_start_epoch=0,
            ranking_start_epoch=0,
            # R_max must stay below the correct reward (1): sample it from (0.1, 0.9).
            ranking_r_max=tune.uniform(0.1, 0.9),
            # A query is "hard" (gets a reflection prompt) when its mean past reward is below tau.
            reflection_tau=tune.choice([0.1, 0.3, 0.5]),
            **grid,
        )
    )


def run_sweep(
    *,
    iterations: int,
    quick: bool,
    storage: str,
    num_samples: int = 1,
    model_path: str | None = None,
    name: str = "r3_sweep",
):
    """Run the sweep; return Tune's ResultGrid."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    import r3_rllib  # noqa: F401  (registers the "R3" trainable)
    from r3_rllib.algorithms.r3.tune_output import R3CSVLoggerCallback, trial_name

    scheduler = ASHAScheduler(
        time_attr="training_iteration",
        max_t=max(1, iterations),
        grace_period=1 if quick else min(5, iterations),  # do not judge a trial before it had a few updates
        reduction_factor=4,
    )
    tuner = tune.Tuner(
        "R3",
        param_space=build_param_space(quick=quick, model_path=model_path),
        tune_config=tune.TuneConfig(
            # Tune reads nested results with "/" paths: result["rollout"]["accuracy"] is "rollout/accuracy".
            metric=METRIC,
            mode="max",
            scheduler=scheduler,
            num_samples=num_samples,
            trial_name_creator=trial_name,  # r3_arithmetic_<id>: the trials run R^3
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=os.path.abspath(storage),
            stop={"training_iteration": iterations},
            verbose=0 if quick else 1,
            # progress.csv with every metric from its first iteration on (Tune's writer keeps the first row's columns).
            callbacks=[R3CSVLoggerCallback()],
        ),
    )
    return tuner.fit()


def summarize(results) -> list[dict]:
    """One row per trial: its R^3 parameters, iterations run and last rollout accuracy."""
    rows = []
    for r in results:
        m = r.metrics or {}
        rows.append(
            {
                "replay_k": r.config["replay_k"],
                "ranking_r_max": round(float(r.config["ranking_r_max"]), 3),
                "reflection_tau": r.config["reflection_tau"],
                "iterations": m.get("training_iteration"),
                "accuracy": (m.get("rollout") or {}).get("accuracy"),
                "error": None if r.error is None else type(r.error).__name__,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations", type=int, default=None, help="iterations per trial (default 30; 1 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 trials, tiny batches: a smoke test in ~1 minute"
    )
    parser.add_argument("--storage", default="runs", help="Tune storage folder (default: %(default)s)")
    parser.add_argument(
        "--num-samples", type=int, default=None, help="draws of the sampled values per grid point"
    )
    parser.add_argument(
        "--model", default=None, help="policy folder (default: the shipped tiny arithmetic model)"
    )
    parser.add_argument("--address", default=None, help="Ray cluster to join (default: start a local Ray)")
    parser.add_argument("--num-cpus", type=float, default=None, help="logical CPUs of a local Ray")
    args = parser.parse_args(argv)
    iterations = args.iterations or (1 if args.quick else 30)
    num_samples = args.num_samples or (1 if args.quick else 2)

    from r3_rllib.ray_session import init_ray

    # A private Ray (no --address) keeps token authentication on; a no-op when this
    # process already runs Ray.
    init_ray(
        args.address,
        num_cpus=args.num_cpus,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    results = run_sweep(
        iterations=iterations,
        quick=args.quick,
        storage=args.storage,
        num_samples=num_samples,
        model_path=args.model,
    )
    rows = summarize(results)
    for row in rows:
        print("trial", " ".join(f"{k}={v}" for k, v in row.items()))
    best = results.get_best_result(metric=METRIC, mode="max", filter_nan_and_inf=True)
    print(
        f"best: replay_k={best.config['replay_k']} accuracy={(best.metrics.get('rollout') or {}).get('accuracy')}"
    )
    print(f"results in {Path(args.storage).resolve() / 'r3_sweep'}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
