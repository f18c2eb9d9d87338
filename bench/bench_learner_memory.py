"""Time and peak memory of one learner update on a SmolLM2-135M-shaped model: the full-logits path against the
response-only LM head, with and without gradient checkpointing, in one run.

    python bench/bench_learner_memory.py            # SmolLM2-135M's shape, 12 samples of 350 + 48 tokens, 2 threads
    python bench/bench_learner_memory.py --smoke    # CI: a small model, a few tokens

The model is a randomly initialised Llama with SmolLM2-135M's configuration (30 layers, hidden 576, 9 heads, 3 kv
heads, MLP 1536, vocabulary 49,152, tied embeddings; 134.5 M parameters, fp32), built in memory: no download. One
update is what the learner does for one micro-batch of all 12 samples: the scoring pass (`token_logprobs`), the
clipped policy loss over the response tokens, backward (no optimizer step). Each path runs in its own process, so
its peak resident set size (Linux VmHWM) is its own; the paths run one after the other on the same samples.

- `full logits`: the scoring before this change: the LM head on every position ([12, 397, 49152] fp32 logits),
  log p = logit - logsumexp over all of them.
- `response head`: `token_logprobs` with the response mask: the head on the 12 x 48 response positions only.
- `response head + checkpointing`: the same with gradient checkpointing, the learner's default for a pretrained
  model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

import common

PATHS = {
    "full logits": {"response_head": False, "checkpointing": False},
    "response head": {"response_head": True, "checkpointing": False},
    "response head + checkpointing": {"response_head": True, "checkpointing": True},
}


def _peak_rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def run_child(args: argparse.Namespace) -> dict:
    """One path in this process: build the model and the batch, time one update, report time and memory."""
    common.setup_process(threads=args.threads)
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.core.logprobs import token_logprobs
    from r3_rllib.core.losses import clipped_policy_loss
    from r3_rllib.types.samples import Sample

    path = PATHS[args.child]
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32).train()
    if path["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rng = np.random.default_rng(0)
    samples = [
        Sample(
            query_id=str(i),
            prompt_ids=rng.integers(0, args.vocab, args.prompt).tolist(),
            response_ids=rng.integers(0, args.vocab, args.response).tolist(),
            behavior_logprobs=np.full(args.response, -3.0, dtype=np.float32),
            entropies=np.zeros(args.response, dtype=np.float32),
            reward=float(i % 2),
            correct=bool(i % 2),
            truncated=False,
            policy_version=0,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(args.samples)
    ]
    packed = pack_samples(samples, pad_id=0, device="cpu")
    mask = packed["response_mask"]
    rss_before = _rss_gb()

    t0 = time.perf_counter()
    if path["response_head"]:
        logp, _ = token_logprobs(
            model,
            packed["input_ids"],
            packed["attention_mask"],
            response_mask=mask,
            temperature=args.temperature,
        )
    else:
        logits = model(
            input_ids=packed["input_ids"], attention_mask=packed["attention_mask"], use_cache=False
        ).logits[:, :-1]
        targets = packed["input_ids"][:, 1:, None]
        scaled = logits.float() / args.temperature
        logp = torch.gather(scaled, -1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    loss, _ = clipped_policy_loss(
        logp, logp.detach(), packed["advantages"], mask, clip_low=0.2, clip_high=0.28, agg_mode="token-mean"
    )
    loss.backward()
    elapsed = time.perf_counter() - t0
    grad_norm = float(
        torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    )
    return {
        "path": args.child,
        "update_s": elapsed,
        "peak_rss_gb": _peak_rss_gb(),
        "rss_before_update_gb": rss_before,
        "loss": float(loss),
        "grad_norm": grad_norm,
        "params": sum(p.numel() for p in model.parameters()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=350, help="prompt tokens per sample")
    ap.add_argument("--response", type=int, default=48, help="response tokens per sample")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: a small model, a few tokens")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.hidden, args.intermediate, args.heads, args.kv_heads = 1000, 64, 128, 4, 2
        args.layers, args.samples, args.prompt, args.response, args.threads = 2, 3, 12, 5, 1
    if args.child is not None:
        print(json.dumps(run_child(args)))
        return 0

    common.print_header("bench_learner_memory", args)
    passthrough = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k not in ("json", "smoke", "child", "paths")
    ]
    results = {}
    for name in args.paths.split(","):
        if name not in PATHS:
            raise SystemExit(f"unknown path {name!r}; choose from {list(PATHS)}")
        out = subprocess.run(
            [sys.executable, __file__, *passthrough, "--child", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"path {name!r} failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {name}: {results[name]['update_s']:.1f} s, peak RSS {results[name]['peak_rss_gb']:.2f} GB")

    first = results[next(iter(results))]
    rows = [
        [
            name,
            r["update_s"],
            r["peak_rss_gb"],
            r["peak_rss_gb"] - r["rss_before_update_gb"],
            first["update_s"] / r["update_s"],
            first["peak_rss_gb"] / r["peak_rss_gb"],
        ]
        for name, r in results.items()
    ]
    print(
        f"\nmodel: {first['params'] / 1e6:.1f} M parameters ({args.layers} layers, vocabulary {args.vocab}, tied), "
        f"{args.samples} samples x ({args.prompt} prompt + {args.response} response) tokens, T = {args.temperature}, "
        f"{args.threads} threads, one process per path"
    )
    print(
        common.markdown_table(
            ["path", "update s", "peak RSS GB", "update's own GB", "speed vs first", "memory vs first"], rows
        )
    )
    # Same samples and weights: every path computes the same loss and gradient (checkpointing recomputes, it does
    # not approximate); a mismatch would mean a path scores different tokens.
    losses = {name: round(r["loss"], 4) for name, r in results.items()}
    norms = {name: round(r["grad_norm"], 3) for name, r in results.items()}
    print(f"\nloss per path: {losses}\ngradient norm per path: {norms}")
    ref = results[next(iter(results))]
    same = all(
        abs(r["loss"] - ref["loss"]) <= 1e-4 * max(1.0, abs(ref["loss"]))
        and abs(r["grad_norm"] - ref["grad_norm"]) <= 1e-3 * max(1.0, ref["grad_norm"])
        for r in results.values()
    )
    print(f"same loss and gradient norm in every path: {same}")
    print(f"({common.load_note()})")
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
