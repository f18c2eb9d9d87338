"""Child process of the checkpoint test: rebuild the algorithm from an R3 checkpoint alone (``R3.from_checkpoint``:
the config saved in it, then its state) in a fresh process, and report its state."""

import json
import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "token")

#: RLlib's lr schedule over the samples so far: each of the first iterations trains at its own rate.
LR_SCHEDULE = [[0, 1e-3], [512, 1e-4]]


def make_config(model_path: str):
    """GRPO + all R^3 parts from epoch 0 (so the replay actor's state is part of the checkpoint), `lr` scheduled
    (the samples counted so far are part of the checkpoint too)."""
    from r3_rllib import R3Config

    return (
        R3Config.r3_preset()
        .environment("arithmetic", env_config={"num_queries": 16})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .r3(replay_start_epoch=0, reflection_start_epoch=0, ranking_start_epoch=0)
        .training(
            model_path=model_path, group_size=4, queries_per_iteration=8, max_new_tokens=5, lr=LR_SCHEDULE
        )
    )


if __name__ == "__main__":
    import ray
    import torch
    from algo_checks import checkpoint_fingerprint  # beside this file (the parent sets PYTHONPATH)

    from r3_rllib import R3

    torch.set_num_threads(1)
    checkpoint = sys.argv[1]
    ray.init(num_cpus=2, address="local", include_dashboard=False, log_to_driver=False)
    algo = R3.from_checkpoint(checkpoint)
    out = {"iteration": algo.iteration, **checkpoint_fingerprint(algo)}
    out["config"] = {
        k: v for k, v in algo.config.to_dict().items() if k in ("lr", "env_config", "model_path")
    }
    result = algo.train()
    out["next_iteration"] = result["training_iteration"]
    out["policy_version"] = float(result["rollout"]["policy_version"])
    out["lr"] = result["learner"]["lr"]
    algo.stop()
    print("RESULT " + json.dumps(out))
