"""Weight sync learner -> EnvRunner per update: through the algorithm's timer and step by step, HF and vLLM engines.

    python bench/bench_weight_sync.py                   # tiny (0.8 M) and gen (~19 M) models, HF and vLLM
    python bench/bench_weight_sync.py --engines hf
    python bench/bench_weight_sync.py --smoke           # CI: tiny model, HF engine, one repetition

Two measurements per (model, engine):

1. **algorithm**: ``result["timers_s"]["weight_sync_s"]`` of ``algo.train()`` (learner ``full_state_dict`` ->
   ``ray.put`` -> every runner ``ray.get`` + ``engine.update_weights``), warm-up iteration excluded;
2. **direct**: the same steps by hand, each timed: take the state dict, ``ray.put``, ``ray.get`` inside an
   actor that holds the engine, ``engine.update_weights`` there; plus ``update_weights`` on an engine in this
   process (no Ray). Two ways to ship the weights, in the same run: ``tensors`` (a dict of torch tensors, pickled:
   the baseline) and ``arrays`` (``PackedWeights``: numpy arrays, out of band, which the algorithm uses).

From the two model sizes a line ``t = t0 + bytes / bandwidth`` is fitted per engine and extrapolated to a 1.5 B
parameter policy in bf16 (3.09 GB). That number is a projection from this CPU machine's object-store path, not a
measurement; on GPUs the transfer path (CUDA IPC / NCCL into vLLM) is a different one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import common

BYTES_1P5B_BF16 = 1.544e9 * 2  # Qwen2-1.5B-class policy (1.54 B parameters) in bf16
# Pickled torch tensors (the baseline) and PackedWeights (numpy arrays: what the algorithm ships).
TRANSFERS = ("tensors", "arrays")


def engine_holder_class():
    import ray

    @ray.remote(num_cpus=0)
    class EngineHolder:
        """A Ray actor with one engine: what an EnvRunner holds, without the rest of the runner."""

        def __init__(self, kind: str, model_path: str) -> None:
            import torch

            from r3_rllib.engines import make_engine

            torch.set_num_threads(1)
            self.engine = make_engine(kind, model_path, dtype="float32")

        def update(self, ref_holder: list, version: int) -> tuple[float, float]:
            from r3_rllib.algorithms.r3.weight_sync import named_tensors

            t0 = time.perf_counter()
            weights = ray.get(ref_holder[0])
            t1 = time.perf_counter()
            self.engine.update_weights(named_tensors(weights), version)
            return t1 - t0, time.perf_counter() - t1

        def shutdown(self) -> None:
            self.engine.shutdown()

    return EngineHolder


def measure(model_name: str, model_path: str, engine: str, args) -> dict[str, Any]:
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from r3_rllib.engines import make_engine

    # 1. through the algorithm (small batches: only the sync matters here)
    # Ranking from iteration 0 keeps every group informative, so every iteration updates and syncs (an iteration
    # without an update does not sync, and its timer would repeat the previous value).
    config = common.grpo_config(
        model_path,
        engine=engine,
        group_size=4,
        queries=2,
        max_new_tokens=8,
        seed=args.seed,
        rank_all_wrong=True,
    )
    algo = config.build_algo()
    algo_sync = []
    try:
        version = 0.0
        for i in range(1 + args.repeats):
            result = algo.train()
            synced = result["rollout"]["policy_version"] > version  # else no update, no sync this iteration
            version = result["rollout"]["policy_version"]
            if synced and (i >= 1 or args.smoke):
                algo_sync.append(result["timers_s"]["weight_sync_s"])
    finally:
        algo.stop()

    # 2. step by step, both transfer formats alternating
    from r3_rllib.algorithms.r3.weight_sync import named_tensors, pack_weights

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    holder = engine_holder_class().remote(engine, model_path)
    ray.get(holder.update.remote([ray.put(model.state_dict())], 0))  # warm-up
    local = make_engine(engine, model_path, dtype="float32")
    names = ("state_dict", "ray_put", "ray_get", "update", "total", "local_update")
    steps: dict[str, dict[str, list[float]]] = {fmt: {k: [] for k in names} for fmt in TRANSFERS}
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    try:
        for v in range(1, args.repeats + 1):
            for fmt in TRANSFERS:
                t0 = time.perf_counter()
                if fmt == "tensors":
                    weights: Any = {k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items()}
                else:
                    weights = pack_weights(model.state_dict())
                t1 = time.perf_counter()
                ref = ray.put(weights)
                t2 = time.perf_counter()
                get_s, update_s = ray.get(holder.update.remote([ref], v))
                t3 = time.perf_counter()
                for k, x in zip(names, (t1 - t0, t2 - t1, get_s, update_s, t3 - t0), strict=False):
                    steps[fmt][k].append(x)
                t4 = time.perf_counter()
                local.update_weights(named_tensors(weights), v)
                steps[fmt]["local_update"].append(time.perf_counter() - t4)
                del ref
    finally:
        ray.get(holder.shutdown.remote())
        ray.kill(holder)
        local.shutdown()
    med = {fmt: {k: common.median(v) for k, v in steps[fmt].items()} for fmt in TRANSFERS}
    return {
        "model": model_name,
        "engine": engine,
        "params": sum(p.numel() for p in model.parameters()),
        "bytes": nbytes,
        "algo_sync_s": common.median(algo_sync),  # nan if no iteration synced
        **{f"{fmt}_{k}_s": v for fmt in TRANSFERS for k, v in med[fmt].items()},
        "speedup": med["tensors"]["total"] / med["arrays"]["total"],
        "bytes_per_s": nbytes / med["arrays"]["total"],
    }


def project(results: list[dict[str, Any]]) -> list[list[Any]]:
    """Per engine: line through (bytes, seconds) of the smallest and largest model -> seconds for 1.5 B bf16."""
    rows = []
    for engine in sorted({r["engine"] for r in results}):
        pts = sorted((r for r in results if r["engine"] == engine), key=lambda r: r["bytes"])
        for key, label in (
            ("tensors_total_s", "direct, tensors"),
            ("arrays_total_s", "direct, arrays"),
            ("algo_sync_s", "algorithm timer"),
        ):
            if len(pts) >= 2 and pts[-1]["bytes"] > pts[0]["bytes"]:
                slope = (pts[-1][key] - pts[0][key]) / (pts[-1]["bytes"] - pts[0]["bytes"])
                t0 = pts[0][key] - slope * pts[0]["bytes"]
                proj = t0 + slope * BYTES_1P5B_BF16
                bw = 1.0 / slope if slope > 0 else float("inf")
            else:  # one point: bytes/s of that point
                bw = pts[-1]["bytes"] / pts[-1][key] if pts[-1][key] > 0 else float("nan")
                t0, proj = 0.0, BYTES_1P5B_BF16 / bw
            rows.append([f"{engine} ({label})", t0, bw / 1e6, proj])
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--models", default="tiny,gen")
    ap.add_argument("--model", default=None, help="folder for the 'tiny' entry (default: the shipped model)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.engines, args.models, args.repeats = "hf", "tiny", 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common)
    common.print_header("bench_weight_sync", args)
    started = common.start_ray()
    results = []
    try:
        for model_name in args.models.split(","):
            path = (
                (args.model or common.tiny_model_path())
                if model_name == "tiny"
                else common.long_response_model()
            )
            for engine in args.engines.split(","):
                print(f"measuring {model_name} / {engine} ...", flush=True)
                results.append(measure(model_name, path, engine, args))
                print(f"  {results[-1]}  ({common.load_note()})", flush=True)
    finally:
        common.stop_ray(started)
    print()
    print(
        common.markdown_table(
            [
                "model / engine",
                "params",
                "MB (fp32)",
                "algorithm timer (s)",
                "direct, tensors (s)",
                "direct, arrays (s)",
                "tensors / arrays",
                "arrays: ray.put",
                "arrays: ray.get in actor",
                "arrays: update_weights",
                "tensors: ray.put",
                "tensors: ray.get in actor",
                "MB/s (arrays)",
            ],
            [
                [
                    f"{r['model']} / {r['engine']}",
                    f"{r['params'] / 1e6:.2f} M",
                    r["bytes"] / 1e6,
                    r["algo_sync_s"],
                    r["tensors_total_s"],
                    r["arrays_total_s"],
                    r["speedup"],
                    r["arrays_ray_put_s"],
                    r["arrays_ray_get_s"],
                    r["arrays_update_s"],
                    r["tensors_ray_put_s"],
                    r["tensors_ray_get_s"],
                    r["bytes_per_s"] / 1e6,
                ]
                for r in results
            ],
        )
    )
    print(
        "\nPROJECTION (not measured): seconds to sync a 1.5 B-parameter policy in bf16 (3.09 GB) over this path,"
    )
    print("from a line t = t0 + bytes / bandwidth through the measured model sizes:")
    print(
        common.markdown_table(
            ["engine (measurement)", "t0 (s)", "bandwidth (MB/s)", "projected 1.5B bf16 (s)"],
            project(results),
        )
    )
    print(f"({common.load_note()})")
    common.write_json(
        args.json,
        {
            "machine": common.machine(),
            "versions": common.versions(),
            "results": results,
            "projection": project(results),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
