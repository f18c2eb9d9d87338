"""Chaos: with a fixed seed, a runner, the learner or the driver is killed at a seeded point, the run completes, and
the trained sample stream equals an uninterrupted run's (``rollout/trained_digest`` per iteration, and
``algo.last_trained_stream``: query ids and policy versions): nothing skipped, nothing trained twice.

- Synchronous and overlap loops (``runner_loss: reask``, the default): a runner's process exits in the middle of
  a rollout (inside its engine's ``generate``); the coordinator waits for Ray to restart it, restores it from before
  the lost rollout and asks it again, so every iteration's digest is the uninterrupted run's.
- Streaming (``max_staleness`` 2): not reproducible run to run by design (arrival order); over the run every query
  is trained exactly once, in its runner's data order, within the staleness bound.
- The learner (one remote learner): its process exits in the middle of an update inside a Tune trial with
  ``max_failures=1`` and a checkpoint every iteration; Tune restarts the trial from the newest complete checkpoint
  and ``progress.csv``'s digests equal the uninterrupted run's (the last row of an iteration that ran twice).
- The driver: a new algorithm restores the checkpoint saved at a seeded iteration and trains on; its digests are
  the uninterrupted run's (the same restore in a new process: test_distributed_and_checkpoint.py).

Every run uses the same small R^3 config (two runners, replay and ranking from the first iteration), so one
uninterrupted run is the baseline of the synchronous, learner and driver cases.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow

#: The seed of the chaos: which iteration, which runner. Written here so that a failure names its case.
SEED = 35
ITERATIONS = 3
CHAOS = random.Random(SEED)
#: (iteration before which the victim is armed, victim runner) for the sync, overlap and streaming cases.
SYNC_KILL = (CHAOS.randint(1, ITERATIONS), CHAOS.choice([1, 2]))
OVERLAP_KILL = (CHAOS.randint(1, ITERATIONS - 1), CHAOS.choice([1, 2]))  # its crash shows one iteration later
STREAM_KILL = (CHAOS.randint(2, 3), CHAOS.choice([1, 2]))
LEARNER_KILL = CHAOS.randint(2, ITERATIONS)  # the update of this iteration dies
DRIVER_RESTORE = CHAOS.randint(1, ITERATIONS - 1)  # the checkpoint after this iteration
REPLAY_KILL = CHAOS.randint(1, ITERATIONS - 1)  # the replay actor dies after this iteration


def chaos_config(model_path: str, **training) -> R3Config:
    """R^3 (replay and ranking on from the first iteration; reflection off: a runner reads the replay buffer for it
    while the driver adds to it, which orders the two only loosely), two runners, the smallest batches."""
    return (
        R3Config.r3_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
        .learners(num_learners=0)
        .r3(replay_start_epoch=0, ranking_start_epoch=0, reflection=False)
        .training(model_path=model_path, group_size=4, queries_per_iteration=8, max_new_tokens=4, lr=1e-3)
        .training(**training)
        .debugging(seed=SEED)
    )


def _kill_in_generate(algo, victim: int) -> None:
    """The victim runner's next ``engine.generate`` exits its process (mid-rollout: after its env drew the
    queries). A runner runs its calls in order, so this lands after the rollout it is on."""

    def arm(runner):
        runner.engine.generate = lambda *args, **kwargs: os._exit(1)

    algo.env_runner_group.foreach_env_runner(arm, remote_worker_ids=[victim], local_env_runner=False)


def _train(algo, iterations: int, kill: tuple[int, int] | None = None) -> tuple[list[dict], list[list]]:
    """(results, the trained stream of each iteration); ``kill`` = (iteration, victim): armed before it."""
    results, streams = [], []
    for it in range(1, iterations + 1):
        if kill is not None and it == kill[0]:
            _kill_in_generate(algo, kill[1])
        results.append(algo.train())
        streams.append(list(algo.last_trained_stream))
    return results, streams


def _digests(results: list[dict]) -> list[int]:
    return [int(r["rollout"]["trained_digest"]) for r in results]


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tiny_random_model, tmp_path_factory) -> dict:
    """The uninterrupted synchronous run: digests, streams and a checkpoint after every iteration (a save changes
    nothing the synchronous loop trains)."""
    root = tmp_path_factory.mktemp("chaos_baseline")
    algo = chaos_config(tiny_random_model).build_algo()
    try:
        results, streams, checkpoints = [], [], []
        for it in range(1, ITERATIONS + 1):
            r, s = _train(algo, 1)
            results += r
            streams += s
            checkpoints.append(algo.save(str(root / f"it{it}")).checkpoint.path)
    finally:
        algo.stop()
    return {"digests": _digests(results), "streams": streams, "checkpoints": checkpoints}


def test_uninterrupted_runs_give_the_same_digests(uninterrupted):
    """The digest is a real fingerprint: every iteration trains something, the streams differ between iterations
    (other queries, newer versions), and each digest is an integer a float metric holds exactly."""
    assert all(uninterrupted["streams"]) and len(set(uninterrupted["digests"])) == ITERATIONS
    assert all(0 < d < 2**32 for d in uninterrupted["digests"])


def test_runner_killed_mid_rollout_sync_trains_the_uninterrupted_stream(uninterrupted, tiny_random_model):
    algo = chaos_config(tiny_random_model).build_algo()
    try:
        results, streams = _train(algo, ITERATIONS, kill=SYNC_KILL)
        assert sum(r["rollout"]["runners_failed"] for r in results) == 1, SYNC_KILL
        assert algo.env_runner_group.healthy_worker_ids() == [1, 2]
    finally:
        algo.stop()
    assert streams == uninterrupted["streams"], SYNC_KILL
    assert _digests(results) == uninterrupted["digests"], SYNC_KILL


def test_runner_killed_mid_rollout_overlap_trains_the_uninterrupted_stream(ray_session, tiny_random_model):
    """Overlap: the lost request was made one update before it is gathered; the runner is asked again with the
    weights of that request (one version back), so the samples carry the versions of the uninterrupted run."""

    def run(kill):
        algo = chaos_config(tiny_random_model, overlap_generation=True).build_algo()
        try:
            results, streams = _train(algo, ITERATIONS, kill=kill)
            return results, streams, algo.env_runner_group.healthy_worker_ids()
        finally:
            algo.stop()

    base_results, base_streams, _ = run(None)
    results, streams, healthy = run(OVERLAP_KILL)
    assert sum(r["rollout"]["runners_failed"] for r in results) == 1, OVERLAP_KILL
    assert healthy == [1, 2]
    assert streams == base_streams, OVERLAP_KILL
    assert _digests(results) == _digests(base_results), OVERLAP_KILL
    assert [r["rollout"]["policy_lag"] for r in results][1:] == [1.0] * (ITERATIONS - 1)


def test_replay_actor_killed_between_iterations_trains_the_uninterrupted_stream(
    uninterrupted, tiny_random_model
):
    """The replay actor is killed after iteration REPLAY_KILL (no checkpoint in this run): Ray restarts it empty,
    the next iteration refills it from the driver's journal (every add and draw since the start), and the replayed
    samples, so the digests, are the uninterrupted run's."""
    import ray
    from test_fault_tolerance import _wait_for_new_incarnation

    algo = chaos_config(tiny_random_model).build_algo()
    try:
        results, streams = _train(algo, REPLAY_KILL)
        handle = algo._replay.client.handle
        before = ray.get(handle.incarnation.remote())
        ray.kill(handle, no_restart=False)
        _wait_for_new_incarnation(handle, before)
        more, more_streams = _train(algo, ITERATIONS - REPLAY_KILL)
    finally:
        algo.stop()
    assert more[-1]["replay"]["actor_restarts"] == 1, REPLAY_KILL
    assert sum(r["r3"]["replay_requests"] for r in results + more) > 0  # draws made (and journaled)
    assert streams + more_streams == uninterrupted["streams"], REPLAY_KILL
    assert _digests(results + more) == uninterrupted["digests"], REPLAY_KILL


def test_driver_restored_from_a_seeded_checkpoint_trains_the_uninterrupted_stream(
    uninterrupted, tiny_random_model
):
    """A new driver (a new algorithm; a new process in test_distributed_and_checkpoint.py) restores the checkpoint
    of iteration DRIVER_RESTORE and trains the iterations after it exactly as the uninterrupted run did."""
    algo = chaos_config(tiny_random_model).build_algo()
    try:
        algo.restore(uninterrupted["checkpoints"][DRIVER_RESTORE - 1])
        results, streams = _train(algo, ITERATIONS - DRIVER_RESTORE)
    finally:
        algo.stop()
    assert [r["training_iteration"] for r in results] == list(range(DRIVER_RESTORE + 1, ITERATIONS + 1))
    assert _digests(results) == uninterrupted["digests"][DRIVER_RESTORE:], DRIVER_RESTORE
    assert streams == uninterrupted["streams"][DRIVER_RESTORE:]


def test_runner_killed_while_streaming_every_query_is_trained_exactly_once(ray_session, tiny_random_model):
    """max_staleness 2: the victim's requests in flight are lost with its process; restored after its last delivered
    request, it draws their queries again. Over the run each runner's fresh queries are trained exactly in its data
    order (none skipped, none twice), never staler than the bound, and no group is dropped as stale."""
    from test_async_training import _data_order, _TrainedQueries

    config = chaos_config(tiny_random_model, max_staleness=2).environment(env_config={"num_queries": 128})
    orders = [_data_order(config, wid, 64) for wid in (1, 2)]  # each runner's shard, first epoch
    algo = config.build_algo()
    try:
        trained = _TrainedQueries(algo)
        results, _ = _train(algo, STREAM_KILL[0] - 1)
        _kill_in_generate(algo, STREAM_KILL[1])
        for _ in range(10):  # Ray reports the dead actor's requests after a moment: the other runner trains
            results.append(algo.train())
            if sum(r["rollout"]["runners_failed"] for r in results):
                break
            time.sleep(0.5)
        for _ in range(120):  # restored at an iteration's start, or here once its actor is back
            if algo.env_runner_group.healthy_worker_ids() == [1, 2]:
                break
            algo.restore_env_runners(algo.env_runner_group)
            time.sleep(0.5)
        results += _train(algo, 2)[0]
    finally:
        algo.stop()
    assert sum(r["rollout"]["runners_failed"] for r in results) == 1, STREAM_KILL
    assert all(r["rollout"]["staleness_max"] <= 2 for r in results)
    assert all(r["rollout"]["stale_groups_dropped"] == 0 for r in results)
    assert len(trained.ids) == len(set(trained.ids)), "a query trained twice"
    for order in orders:
        mine = [q for q in trained.ids if q in set(order)]
        assert mine == order[: len(mine)] and len(mine) >= 8, STREAM_KILL  # nothing skipped, in data order


def _progress_digests(trial_dir) -> dict[int, int]:
    """training_iteration -> trained_digest of the last row for it in a trial's progress.csv (a re-run iteration
    has two rows: the one before the failure and the one after the restore)."""
    import csv

    with open(os.path.join(trial_dir, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    return {int(r["training_iteration"]): int(float(r["rollout/trained_digest"])) for r in rows}


def test_learner_killed_mid_update_tune_restarts_from_the_newest_checkpoint(
    uninterrupted, tiny_random_model, tmp_path
):
    """One remote learner, a Tune trial with max_failures=1 (run.max_failures of `r3 train`) and a checkpoint
    every iteration, started from the uninterrupted run's checkpoint after iteration 1 (resume_from_checkpoint):
    the learner's process exits inside the update of iteration LEARNER_KILL; the trial fails (LearnerDiedError),
    Tune restarts it from its own checkpoint of the iteration before (not from the run's starting checkpoint:
    R3.setup leaves it to Tune), and every iteration's digest in progress.csv is the uninterrupted run's (one
    learner in the driver: the same numbers), each iteration trained once."""
    from ray import tune

    marker = str(tmp_path / "learner_killed")

    def kill_next_update(algorithm, **kwargs):
        # After iteration LEARNER_KILL - 1 (its checkpoint is still saved), once over the restarts.
        if algorithm.weights.version == LEARNER_KILL - 1 and not os.path.exists(marker):
            open(marker, "w").close()
            algorithm.learner_group.foreach_learner(
                lambda lr: setattr(lr, "update_from_samples", lambda *a, **k: os._exit(1))
            )

    config = (
        chaos_config(tiny_random_model, resume_from_checkpoint=uninterrupted["checkpoints"][0])
        .learners(num_learners=1, num_cpus_per_learner=1)
        .callbacks(on_train_result=kill_next_update)
    )
    tuner = tune.Tuner(
        "R3",
        param_space=config,
        run_config=tune.RunConfig(
            name="chaos_learner",
            storage_path=str(tmp_path),
            stop={"training_iteration": ITERATIONS},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, checkpoint_at_end=False),
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    )
    [result] = list(tuner.fit())
    assert result.error is None, result.error
    assert os.path.exists(marker)
    assert (
        LEARNER_KILL > 2
    )  # so the trial has a checkpoint of its own, newer than the starting one, to restart from
    digests = _progress_digests(result.path)
    assert sorted(digests) == list(range(2, ITERATIONS + 1))
    assert [digests[i] for i in range(2, ITERATIONS + 1)] == uninterrupted["digests"][1:], LEARNER_KILL
    import csv

    with open(os.path.join(result.path, "progress.csv")) as f:
        rows = [int(r["training_iteration"]) for r in csv.DictReader(f)]
    assert rows == list(range(2, ITERATIONS + 1))  # each iteration once: none re-run after the restart
