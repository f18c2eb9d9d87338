"""A run folder as `r3 train` leaves it, made by hand for the report tests: progress.csv with two health columns,
params.json naming the shipped tiny model, and two iterations of sample records."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from r3_rllib.rollout.records import SampleRecord, records_table, write_iteration


def make_run(root: Path) -> Path:
    trial = root / "run" / "R3_trial_0"
    trial.mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps({"model_path": None}))
    columns = [
        "training_iteration",
        "time_total_s",
        "rollout/accuracy",
        "rollout/reward_mean",
        "health/entropy_collapse",
        "health/zero_advantage",
        "health/zero_advantage_value",
        "health/zero_advantage_threshold",
        "health/firing",
    ]
    with open(trial / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for it in (1, 2, 3):
            writer.writerow(
                [it, 2.0 * it, 0.1 * it, 0.2 * it, 0, int(it == 3), 0.25 * it, 0.95, int(it == 3)]
            )
    for it in (2, 3):
        records = [
            SampleRecord(
                iteration=it,
                group=g,
                sample=s,
                query_id=f"q{g}",
                prompt_text=f"{10 + g}+{s}=",
                response_text=str(10 + g + s),
                prompt_ids=[1, 2, 3],
                response_ids=[20, 21],
                reward=float(s == 0),
                correct=s == 0,
                truncated=False,
                policy_version=it - 1,
                staleness=0,
                behavior_logprobs=[-0.5, -0.1],
                entropies=[0.2, 2.5],
                grade_reason=None if s else "exact",
                is_weights=[1.0, 1.6],
                trained=True,
            )
            for g in range(2)
            for s in range(2)
        ]
        write_iteration(records_table(records), str(trial / "samples"), it)
    return root / "run"
