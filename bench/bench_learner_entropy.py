"""The learner's optional entropy pass (`learner_entropy`): one scoring step with it against one without, one run.

    python bench/bench_learner_entropy.py               # Qwen2.5-1.5B's widths and 151,936-token vocabulary, 2 layers
    python bench/bench_learner_entropy.py --layers 4 --tokens 1024
    python bench/bench_learner_entropy.py --smoke        # CI: a small model, one round

A step is what the learner does per micro-batch: `token_logprobs` (forward, fp32 log-probs of the sampled tokens,
optionally the no-grad entropies), a loss, backward. The model is randomly initialised in memory with the
1.5B model's hidden size, MLP width, heads and vocabulary, and fewer layers so that a CPU step takes seconds. The
entropy pass works on the logits only, so its cost does not grow with depth: the measured difference is what a
step of the full-depth model pays too, while the ratio printed is for the depth measured. Rounds alternate
between the two settings so a shared machine slows both alike; medians are reported.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import common


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--intermediate", type=int, default=8960)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="sequence length of the one-sequence micro-batch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CI: a small model, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.hidden, args.intermediate, args.heads, args.kv_heads = 1000, 64, 128, 4, 2
        args.layers, args.tokens, args.rounds = 1, 32, 1
    common.setup_process()
    common.print_header("bench_learner_entropy", args)

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from r3_rllib.core.logprobs import token_logprobs

    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, args.tokens),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32).train()
    input_ids = torch.randint(0, args.vocab, (1, args.tokens))
    attention_mask = torch.ones_like(input_ids)

    def step(with_entropy: bool) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logp, entropy = token_logprobs(model, input_ids, attention_mask, with_entropy=with_entropy)
        (-logp.mean()).backward()
        if entropy is not None:
            float(entropy.mean())  # the learner reads it as a metric
        return time.perf_counter() - t0

    settings = {"with entropy": True, "without": False}
    paths = {name: (lambda flag=flag: step(flag)) for name, flag in settings.items()}
    med = common.alternating_medians(paths, args.rounds, warmup=not args.smoke)
    params = sum(p.numel() for p in model.parameters())
    rows = [[name, med[name], args.tokens / med[name]] for name in settings]
    print(
        f"model: {params / 1e6:.1f} M parameters ({args.layers} layers), vocabulary {args.vocab}, {args.tokens} tokens"
    )
    print(common.markdown_table(["learner step", "s (median)", "tokens/s"], rows))
    extra = med["with entropy"] - med["without"]
    ratio = med["with entropy"] / med["without"]
    print(
        f"\nwithout / with entropy pass, tokens/s: {ratio:.2f}  (the pass: {extra:.3f} s per {args.tokens} tokens)"
    )
    print(f"({common.load_note()})")
    common.write_json(
        args.json, {"median_s": med, "params": params, "speedup": ratio, "entropy_pass_s": extra}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
