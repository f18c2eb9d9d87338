"""CPU simulation of the paper's R^3 schedule: examples/deepscaler_r1_distill_1p5b.yaml, orchestration unchanged.

Everything that decides *when* things happen comes from the shipped 1.5B run file as it is: 4 EnvRunners, 128
queries x 8 samples per iteration (1,024 samples), replay/reflection/ranking and their start epochs, the replay
staleness, the reflection caps, the eval and checkpoint cadence. Only what a CPU cannot run is overridden (with
the run file's own ``--set`` mechanism): the model (the shipped 0.8M-parameter tiny model), the engine (HF), the
response length (8 tokens), the learners (one local learner instead of 4 FSDP2 GPUs) and the data: a synthetic
arithmetic pool shaped like DeepScaleR (``--num-queries`` rows, 40,315 for DeepScaleR-40k's size; 2-digit sums,
plus 3-digit operands above 8,100 rows, graded by an exact integer match), so the tiny model gets some right and
some wrong.

Per iteration it prints the data epoch of the batch, which R^3 parts were active in it, replay requests and hits,
reflection prompts, ranked groups, replay buffer size and memory, and the driver's time per iteration
(``algo.train()``) and its parts. Before that it prints what ``algorithms/r3/r3_schedule.py`` computes for the real
40,315-row data set and for the simulated pool.

The full first epoch of the real size is 314 iterations; on 2 CPU cores an iteration takes seconds, so the default
run uses a smaller pool with the same per-runner batch, sized so that the epoch boundary falls inside the budget
(``--num-queries 5243``: 40 iterations per epoch and, like 40,315, 123 queries sitting out each epoch).

    python bench/bench_schedule.py                         # 5,243 queries, 43 iterations (~15 min here)
    python bench/bench_schedule.py --num-queries 40315 --iterations 320   # the real size (hours on 2 cores)
    python bench/bench_schedule.py --smoke                 # CI: a tiny pool, 3 iterations
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

RUN_FILE = common.REPO_ROOT / "examples" / "deepscaler_r1_distill_1p5b.yaml"
DEEPSCALER_ROWS = 40_315  # agentica-org/DeepScaleR-Preview-Dataset, train split


def overrides(args: argparse.Namespace, model: str) -> list[str]:
    """``--set`` overrides: model, engine, lengths, resources and data only (nothing that sets the schedule)."""
    # 2-digit sums (8,100 distinct), which the tiny model gets right about half the time, when the pool fits;
    # a 40k pool needs 3-digit operands too (the tiny model rarely gets those right: fewer replay hits).
    digits = "2" if args.num_queries <= 8100 else "[2, 3]"
    env_config = f"{{num_queries: {args.num_queries}, digits: {digits}, operators: '+', pool_seed: 1}}"
    return [
        # data: a DeepScaleR-sized pool that is cheap to grade
        "environment.env=arithmetic",
        f"environment.env_config={env_config}",
        "training.eval_env_config={split: test, num_queries: 500}",  # a disjoint held-out pool
        # model, engine and lengths
        f"training.model_path={model}",
        "training.engine=hf",
        "training.engine_kwargs={}",
        "training.attn_implementation=null",
        "training.dtype=float32",
        f"training.max_new_tokens={args.max_new_tokens}",
        "training.gradient_checkpointing=false",
        f"training.lr={args.lr}",
        # resources: CPU only, one local learner
        "env_runners.num_gpus_per_env_runner=0",
        f"env_runners.num_cpus_per_env_runner={args.cpus_per_runner}",
        "learners.num_learners=0",
        "learners.num_gpus_per_learner=0",
        "learners.num_cpus_per_learner=1",
        "resources.num_cpus_for_main_process=1",
    ]


def active_parts(algo) -> str:
    """The R^3 parts training_step will use in the next iteration (read as it reads them)."""
    return "+".join(algo.iteration_settings().active_parts) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-queries", type=int, default=5243, help="size of the synthetic pool")
    parser.add_argument("--iterations", type=int, default=43)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--cpus-per-runner", type=float, default=0.25)
    parser.add_argument("--model", default=None, help="policy folder (default: the shipped tiny model)")
    parser.add_argument("--json", default=None, help="write the per-iteration rows here")
    parser.add_argument("--smoke", action="store_true", help="CI: 520 queries, 3 iterations, no eval")
    args = parser.parse_args(argv)
    extra = []
    if args.smoke:
        # 520 = 4 x 128 + 8: 4 iterations per epoch; the parts switch on in iteration 5 (outside 3 iterations).
        args.num_queries, args.iterations = 520, 3
        extra = ["training.eval_interval=0", "training.eval_before_train=false"]

    common.setup_process()
    common.print_header("R^3 schedule of the 1.5B run file, simulated on CPU", args)
    from r3_rllib.algorithms.r3.r3_schedule import schedule_for_config
    from r3_rllib.train_config import load_run_file

    model = args.model or common.tiny_model_path()
    spec = load_run_file(RUN_FILE, overrides(args, model) + extra)
    config = spec.config
    stop = int(spec.stop.get("training_iteration"))
    real = schedule_for_config(config, DEEPSCALER_ROWS, stop_iteration=stop)
    print(f"schedule.py, the run file with DeepScaleR-40k ({DEEPSCALER_ROWS} rows): {real.summary()}")
    for warning in real.warnings:
        print(f"  warning: {warning}")
    sim = schedule_for_config(config, args.num_queries, stop_iteration=args.iterations)
    print(
        f"schedule.py, this simulation ({args.num_queries} queries, {args.iterations} iterations): {sim.summary()}"
    )
    for warning in sim.warnings:
        print(f"  warning: {warning}")
    checkpoint_every = int(spec.run.get("checkpoint_frequency", 0))
    print(
        f"orchestration from the run file: {config.num_env_runners} runners, {config.queries_per_iteration} "
        f"queries x {config.group_size} samples, replay_max_age {config.replay_max_age} (None: derived), "
        f"reflection_max_per_batch {config.reflection_max_per_batch}, eval every {config.eval_interval}, "
        f"checkpoint every {checkpoint_every}"
    )
    print(flush=True)

    started = common.start_ray(num_cpus=4)
    ckpt_root = Path(tempfile.mkdtemp(prefix="r3_bench_schedule_"))
    rows = []
    try:
        t0 = time.perf_counter()
        algo = config.build_algo()
        print(
            f"build_algo: {time.perf_counter() - t0:.1f} s; replay_max_age in effect {algo.schedule.max_age}"
        )
        header = (
            "iter | epoch | parts | replay req | hits | refl prompts | ranked | buffer | buffer MiB | "
            "train s | sample s | r3 batch s | learner s | ckpt s | acc"
        )
        print(header)
        for j in range(1, args.iterations + 1):
            # The epoch the switches are computed from (see schedule.py).
            epoch_of_batch = algo.coordinator.epoch.value
            parts = active_parts(algo)
            t_iter = time.perf_counter()
            result = algo.train()
            train_s = time.perf_counter() - t_iter
            ckpt_s = 0.0
            if checkpoint_every and j % checkpoint_every == 0:
                t_ck = time.perf_counter()
                path = algo.save(str(ckpt_root / f"iter_{j}")).checkpoint.path
                ckpt_s = time.perf_counter() - t_ck
                shutil.rmtree(path, ignore_errors=True)
            r3, replay, timers = result["r3"], result.get("replay", {}), result["timers_s"]
            row = {
                "iteration": j,
                "epoch": epoch_of_batch,
                "expected_epoch": sim.epoch_trained_in(j),
                "parts": parts,
                "replay_requests": r3["replay_requests"],
                "replay_hits": r3["replay_hits"],
                "reflection_prompts": r3["reflection_prompts"],
                "ranked_groups": r3["ranked_groups"],
                "buffer_size": replay.get("size", 0),
                "buffer_mib": replay.get("bytes", 0) / 2**20,
                "train_s": train_s,
                "sample_s": timers["sample_s"],
                "r3_batch_s": timers["r3_batch_s"],
                "learner_s": timers["learner_update_s"],
                "checkpoint_s": ckpt_s,
                "accuracy": result["rollout"]["accuracy"],
                "eval_accuracy": result.get("eval", {}).get("accuracy"),
            }
            rows.append(row)
            print(
                f"{j} | {row['epoch']} | {parts} | {row['replay_requests']:.0f} | {row['replay_hits']:.0f} | "
                f"{row['reflection_prompts']:.0f} | {row['ranked_groups']:.0f} | {row['buffer_size']:.0f} | "
                f"{row['buffer_mib']:.1f} | {train_s:.2f} | {row['sample_s']:.2f} | {row['r3_batch_s']:.3f} | "
                f"{row['learner_s']:.2f} | {ckpt_s:.2f} | {row['accuracy']:.2f}"
                + (
                    f" | eval {row['eval_accuracy']:.3f}"
                    if config.eval_interval and j % config.eval_interval == 0
                    else ""
                ),
                flush=True,
            )
        algo.stop()
    finally:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        common.stop_ray(started)

    mismatched = [r["iteration"] for r in rows if r["epoch"] != r["expected_epoch"]]
    print()
    print(
        f"epochs as computed by schedule.py in every iteration: {not mismatched}"
        + (f" (not in {mismatched})" if mismatched else "")
    )
    first = sim.parts["replay"].first_iteration if config.replay else None
    if first is not None and first <= len(rows):
        after = rows[first - 1 :]
        requests = sum(r["replay_requests"] for r in after)
        hits = sum(r["replay_hits"] for r in after)
        before = sum(
            r["replay_requests"] + r["reflection_prompts"] + r["ranked_groups"] for r in rows[: first - 1]
        )
        print(
            f"before iteration {first}: replay requests + reflection prompts + ranked groups = {before:.0f}; "
            f"from iteration {first} (revisited queries): replay hits {hits:.0f} / requests {requests:.0f}"
            + (f" = {hits / requests:.1%}" if requests else "")
        )
    steady = [r["train_s"] for r in rows[1:] if r["checkpoint_s"] == 0.0] or [r["train_s"] for r in rows]
    print(
        f"driver time per iteration at {config.queries_per_iteration * config.group_size} samples: "
        f"median {common.median(steady):.2f} s over {len(steady)} iterations; {common.load_note()}"
    )
    common.write_json(args.json, {"args": vars(args), "rows": rows})
    if mismatched:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
