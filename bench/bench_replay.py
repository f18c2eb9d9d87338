"""Throughput of the R^3 replay buffer: in-process vs. behind its Ray actor, in one run.

    python bench/bench_replay.py                 # 100k samples over 10k queries
    python bench/bench_replay.py --samples 200000 --queries 20000
    python bench/bench_replay.py --quick         # CI smoke: tiny sizes, a few seconds plus Ray start

Fills the buffer to ``--samples`` stored samples (batched ``add`` of ``--chunk`` samples), then times ``--calls``
opposite-outcome sample calls (random query, random outcome, ``k`` each) at that size. The actor path is timed with
batched calls: ``add`` of a whole chunk per round trip and ``sample_batch`` of ``--batch`` requests per round trip,
both with plain lists and with the packed (columnar) transport of ``ReplayBufferClient``. Prints a markdown table;
the last column is the actor rate divided by the in-process rate.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from r3_rllib.replay.buffer import QueryReplayBuffer, ReplayConfig, SampleRequest
from r3_rllib.types.samples import ReplaySample


def make_samples(n: int, n_queries: int, max_len: int, seed: int) -> list[ReplaySample]:
    """``n`` random samples: query ``i % n_queries``, random outcome, response length in [16, max_len]."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 32000, int(rng.integers(32, 128)), dtype=np.int32) for _ in range(n_queries)]
    lens = rng.integers(16, max_len + 1, n)
    correct = rng.random(n) < 0.5
    out = []
    for i in range(n):
        q = i % n_queries
        length = int(lens[i])
        out.append(
            ReplaySample(
                query_id=f"q{q}",
                prompt_ids=prompts[q],
                response_ids=rng.integers(0, 32000, length, dtype=np.int32),
                behavior_logprobs=-rng.random(length, dtype=np.float32),
                reward=float(correct[i]),
                correct=bool(correct[i]),
                policy_version=i * 10 // n,
                truncated=length == max_len,
                response_text="x" * (length * 3),
            )
        )
    return out


def make_requests(n: int, n_queries: int, k: int, version: int, seed: int) -> list[SampleRequest]:
    rng = np.random.default_rng(seed + 1)
    qs = rng.integers(0, n_queries, n)
    want = rng.random(n) < 0.5
    return [SampleRequest(f"q{q}", bool(w), k, version) for q, w in zip(qs, want, strict=True)]


def chunks(xs: list, size: int) -> list[list]:
    return [xs[i : i + size] for i in range(0, len(xs), size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=20_000, help="sample calls to time")
    ap.add_argument("--chunk", type=int, default=1000, help="samples per add call")
    ap.add_argument("--batch", type=int, default=256, help="requests per actor sample_batch call")
    ap.add_argument("--k", type=int, default=2, help="samples per request")
    ap.add_argument("--max-len", type=int, default=256, help="longest response (tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CI smoke run")
    ap.add_argument("--no-actor", action="store_true", help="skip the Ray actor part")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.queries, args.calls, args.chunk, args.batch = 2000, 200, 2000, 500, 128

    config = ReplayConfig(
        max_per_query=max(16, 4 * args.samples // args.queries),  # large enough to keep every sample
        max_total_samples=args.samples,
        max_age=None,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    samples = make_samples(args.samples, args.queries, args.max_len, args.seed)
    version = 10
    requests = make_requests(args.calls, args.queries, args.k, version, args.seed)
    print(f"built {len(samples)} samples over {args.queries} queries in {time.perf_counter() - t0:.1f}s")

    rows: list[tuple[str, float, float]] = []

    buf = QueryReplayBuffer(config)
    t0 = time.perf_counter()
    for c in chunks(samples, args.chunk):
        buf.add(c)
    insert_s = time.perf_counter() - t0
    assert len(buf) == args.samples, (len(buf), args.samples)
    t0 = time.perf_counter()
    hits = 0
    for qid, want, k, v in requests:
        hits += len(buf.sample_opposite(qid, want_correct=want, k=k, current_version=v))
    sample_s = time.perf_counter() - t0
    local = (args.samples / insert_s, args.calls / sample_s)
    rows.append(("in-process QueryReplayBuffer", *local))
    print(
        f"in-process: {len(buf)} stored, {buf.nbytes() / 2**20:.0f} MiB approx., {hits / args.calls:.2f} hits/call"
    )

    if not args.no_actor:
        import ray

        from r3_rllib.ray_session import init_ray
        from r3_rllib.replay.actor import ReplayBufferClient, create_replay_actor

        t0 = time.perf_counter()
        init_ray("local", num_cpus=1, log_to_driver=False)
        print(f"ray.init {time.perf_counter() - t0:.1f}s")
        try:
            for packed in (False, True):
                handle = create_replay_actor(config)
                ray.get(handle.ping.remote())
                client = ReplayBufferClient(handle)
                t0 = time.perf_counter()
                for c in chunks(samples, args.chunk):
                    if packed:
                        client.add(c)
                    else:
                        ray.get(handle.add.remote(c))
                insert_s = time.perf_counter() - t0
                assert ray.get(handle.size.remote()) == args.samples
                t0 = time.perf_counter()
                for c in chunks(requests, args.batch):
                    if packed:
                        client.sample_batch(c)
                    else:
                        ray.get(handle.sample_batch.remote(c))
                sample_s = time.perf_counter() - t0
                label = (
                    "Ray actor, packed (ReplayBufferClient)" if packed else "Ray actor, lists of ReplaySample"
                )
                rows.append((label, args.samples / insert_s, args.calls / sample_s))
                ray.kill(handle)
        finally:
            ray.shutdown()

    print()
    print(
        f"samples={args.samples} queries={args.queries} k={args.k} add chunk={args.chunk} "
        f"actor batch={args.batch} max_len={args.max_len}"
    )
    print()
    print("| path | insert samples/s | sample calls/s | actor / in-process (insert, sample) |")
    print("|---|---:|---:|---:|")
    for label, ins, smp in rows:
        ratio = f"{ins / local[0]:.2f}, {smp / local[1]:.2f}" if label != rows[0][0] else "1, 1"
        print(f"| {label} | {ins:,.0f} | {smp:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
