"""vLLM generation driven step by step, so that new weights can be loaded between decoding steps (partial rollouts).

``LLM.generate`` runs its requests to the end. Partial rollouts instead drive the engine's own loop
(``LLMEngine.add_request`` / ``step``): requests stream their tokens so far (``RequestOutputKind.CUMULATIVE``), and
every ``every`` steps ``between_steps()`` may load newer weights (``collective_rpc("reload_weights")``, the engine's
ordinary update). The requests in flight are neither aborted nor recomputed: they go on under the new weights with
their KV cache (the entries of the tokens before the update stay as the old weights computed them, as in the HF
engine). Each token is tagged with the version loaded when its step ran: the tag names the weights that sampled
the token, not those that computed the keys and values it attends to (a request still waiting for a slot when the
weights change may also reuse prompt entries cached before, like the responses in flight).

This needs the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the engine's default): a
multiprocess core keeps stepping while the driver loads weights, so the tag of the tokens around a load would not be
known. :class:`~r3_rllib.engines.vllm_engine.VLLMEngine` reports ``supports_partial_rollouts`` accordingly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Request ids of stepped calls: unique within the process, apart from ``LLM``'s own numeric ids.
_REQUEST_IDS = itertools.count()


def generate_between_steps(
    llm: Any,
    prompts: Sequence[Any],
    sampling: Sequence[Any],
    *,
    between_steps: Callable[[], None],
    every: int,
    version: Callable[[], int],
    lora_request: Any = None,
) -> list[list[tuple[Any, np.ndarray]]]:
    """Run ``prompts`` (``vllm.TokensPrompt``) with ``sampling`` (one ``vllm.SamplingParams`` each, ``n`` samples)
    to completion, calling ``between_steps()`` every ``every`` engine steps while requests are unfinished.

    Returns, per prompt, its ``n`` final ``CompletionOutput`` in sample order, each with the policy version of every
    token (``version()`` when the step that sampled it ran). On an error the call's requests are aborted, so the
    engine is left idle for the next call.
    """
    from vllm.sampling_params import RequestOutputKind

    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise RuntimeError(
            "generate_between_steps needs an idle engine: requests of another call are unfinished"
        )
    call = next(_REQUEST_IDS)
    request_ids = [f"r3-step-{call}-{i}" for i in range(len(prompts))]
    index_of = {rid: i for i, rid in enumerate(request_ids)}
    latest: dict[tuple[int, int], Any] = {}
    tags: dict[tuple[int, int], list[int]] = {}
    start_version = current = version()
    try:
        for rid, prompt, params in zip(request_ids, prompts, sampling, strict=True):
            params.output_kind = RequestOutputKind.CUMULATIVE  # tokens so far, every step: what the tags need
            engine.add_request(rid, prompt, params, lora_request=lora_request)
        for step in itertools.count(1):
            if not engine.has_unfinished_requests():
                break
            for request in engine.step():
                i = index_of[request.request_id]
                for out in request.outputs:
                    seen = tags.setdefault((i, out.index), [])
                    seen.extend([current] * (len(out.token_ids) - len(seen)))
                    latest[(i, out.index)] = out
            if step % every == 0 and engine.has_unfinished_requests():
                between_steps()  # may load newer weights: the next step samples with them
                current = version()
    except BaseException:
        engine.abort_request(request_ids)
        raise
    if current != start_version:
        # The reload could not clear the prefix cache while requests ran: clear it now, so that no later request
        # reuses KV entries computed with older weights.
        llm.reset_prefix_cache()
    return [
        [(latest[(i, j)], np.asarray(tags[(i, j)], dtype=np.int64)) for j in range(params.n)]
        for i, params in enumerate(sampling)
    ]
