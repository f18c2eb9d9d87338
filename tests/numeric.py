"""What the numeric tests share: the torch thread count they run with, and float tolerances made of the quantity's
scale and its precision (not of the noise one CPU showed).

Why tolerances from ulps: a float32 result that sums N terms in an order that depends on the kernels (AVX2 or
AVX-512 vector widths, 1 or 2 threads, the batch's shape) differs between two such orders by up to ~N ulps of the
largest term (|a + b| rounding error <= eps/2 * |a + b|; a naive sum of N terms errs by <= (N - 1) eps * sum |x|).
So a comparison of two float32 results gets `atol = k * eps32 * scale`, where `scale` is the largest magnitude
involved and `k` covers the number and depth of the sums; an entry near zero is held to the error of its largest
neighbours, not to its own size. Comparisons against values worked out by hand on a few numbers get a few ulps.
"""

from __future__ import annotations

import os

import numpy as np

#: float32 and float64 machine epsilons (the gap between 1 and the next float).
EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7
EPS64 = float(np.finfo(np.float64).eps)  # 2.22e-16

#: torch threads of the test process: R3_TEST_TORCH_THREADS (default 1; scripts/test.sh also runs the numeric tests
#: with 2). Read by tests/conftest.py (an autouse fixture sets it before every test) and by the files that set it at
#: import or that build a learner (R3Learner.build sets the threads to num_cpus_per_learner).
TORCH_THREADS = int(os.environ.get("R3_TEST_TORCH_THREADS", "1"))


def f32_tol(scale: float, ulps: float) -> float:
    """An absolute tolerance of `ulps` float32 ulps of `scale` (the largest magnitude the result is made of)."""
    return ulps * EPS32 * float(scale)


def f64_tol(scale: float, ulps: float) -> float:
    """The same in float64: for results computed in float64 on both sides."""
    return ulps * EPS64 * float(scale)


def max_abs(*arrays) -> float:
    """The largest magnitude over arrays / tensors / floats (the `scale` of a comparison)."""
    out = 0.0
    for a in arrays:
        if hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        a = np.asarray(a, dtype=np.float64)
        if a.size:
            out = max(out, float(np.nanmax(np.abs(a))))
    return out


#: Two float32 forward passes of a small model over the same tokens that differ in batch shape, padding, cache or
#: kernels (AVX2 / AVX-512, threads) sum each dot product in other orders. A log-prob (logit) is a chain of
#: hidden-size dot products (128 terms for the tiny model) through the layers and a vocabulary-wide log-sum-exp; a
#: sum of n terms in another order moves by up to ~n ulps of its largest terms: 2 x 128 = 2**8 float32 ulps
#: (~3e-5 relative) of the largest magnitude compared. The bugs these comparisons catch (a wrong temperature,
#: position, token or weight) move values by 1e-2 and more.
#: For log-probs the largest |log p| compared is the right scale even where every token is confident: to first order
#: a log-prob's error is sum_j p_j (dz_i - dz_j) over the logits' errors dz, so |d log p_i| <= 2 (1 - p_i) max|dz|
#: <= 2 |log p_i| max|dz|, in proportion to its own size. Only the final log of a sum of exps near 1 (p near 1) is
#: rounded to ulps of 1 whatever its size: ~log2 V roundings of partial sums in each of the two passes, LOG_ULPS =
#: 2**5 ulps of 1 on top (4e-6; the same for an entropy near 0).
FORWARD_ULPS = 2**8
LOG_ULPS = 2**5
#: The tiny models' hidden size, the n of FORWARD_ULPS = 2 n. A larger model's passes sum proportionally more terms
#: (its MLP's inner sums are ~3x its hidden size, as the tiny model's): `hidden_size=` scales the tolerances below.
TINY_HIDDEN = 128


def forward_atol(*arrays, hidden_size: int = TINY_HIDDEN) -> float:
    """`FORWARD_ULPS` float32 ulps of the largest magnitude in `arrays` (see above), times hidden_size / 128 for
    a model of another hidden size (SmolLM2-135M: 576, so 2 x 576 ulps), plus LOG_ULPS ulps of 1."""
    return f32_tol(max_abs(*arrays), FORWARD_ULPS * hidden_size / TINY_HIDDEN) + f32_tol(1.0, LOG_ULPS)


#: The same comparison across two engines' implementations (vLLM's fused CPU attention and linear kernels against HF
#: transformers): other reduction trees, other exp/log code, in every layer. 2**11 float32 ulps (~2.4e-4 relative) of
#: the largest magnitude compared, 8x FORWARD_ULPS; still well under the 1e-2 and more a real bug moves a log-prob.
ENGINE_ULPS = 2**11


def engine_atol(*arrays, hidden_size: int = TINY_HIDDEN) -> float:
    """`ENGINE_ULPS` float32 ulps of the largest magnitude in `arrays` (see above), times hidden_size / 128, plus
    LOG_ULPS ulps of 1 (as forward_atol)."""
    return f32_tol(max_abs(*arrays), ENGINE_ULPS * hidden_size / TINY_HIDDEN) + f32_tol(1.0, LOG_ULPS)


#: Gradients of a loss summed over ~1e3 per-token terms (the tiny model's batches), in orders that change with
#: micro-batches, chunks and kernels: each entry errs by up to ~1e3 ulps of the largest terms, not of its own size
#: (an entry near zero can differ by 100 % of itself). 2**10 float32 ulps (~1.2e-4) of the largest gradient entry.
GRAD_ULPS = 2**10


def grad_atol(*grads) -> float:
    """`GRAD_ULPS` float32 ulps of the largest entry of `grads` (see above)."""
    return f32_tol(max_abs(*grads), GRAD_ULPS)


def logprob_bound(model, temperature: float = 1.0) -> float:
    """The largest magnitude a log-prob of a Llama / Qwen2 causal LM can have, from its weights: the scale of the
    comparisons that see only a metric over log-probs (a mean importance weight, a KL estimate, an entropy gap), not
    the log-probs themselves. The logits are `W n`, where `n = g * h / rms(h)` is the final RMSNorm's output, so
    ||n||_2 <= max|g| sqrt(d) and |z_i| <= ||w_i||_2 max|g| sqrt(d) =: B (Cauchy-Schwarz); then
    |log p_i| = logsumexp(z / T) - z_i / T <= 2 B / T + log V (V: the vocabulary): an upper bound of the largest
    magnitude such a comparison would have seen (see FORWARD_ULPS for why that is the scale)."""
    import math

    norm = model.get_decoder().norm.weight.detach().float()
    head = model.get_output_embeddings().weight.detach().float()
    vocab, d = head.shape
    logit = float(head.norm(dim=-1).max()) * float(norm.abs().max()) * math.sqrt(d)
    return 2 * logit / temperature + math.log(vocab)
