"""Generation with a Hugging Face transformers model: the CPU engine and the reference for every other engine.

A hand-written decode loop instead of ``model.generate``: the loop sees the logits of each step, so it returns the
sampled tokens' log-probabilities under the tempered distribution softmax(logits / T) *before* top-k/top-p (what the
learner recomputes) and the exact entropy of that distribution at no extra cost, and it prefills each distinct prompt
once before fanning out to its ``n`` samples.

Batches are left-padded; position ids count only real tokens, so a padded prompt produces the same numbers as the
same prompt alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.engines.base import (
    Completion,
    GenerationEngine,
    SamplingParams,
    checked_prompts,
    resolve_eos_ids,
)
from r3_rllib.engines.kv_cache import preallocated_cache
from r3_rllib.engines.lora import adapter_pairs, lora_scale, merged_state
from r3_rllib.models.dtypes import resolve_dtype, warn_if_emulated_bf16

KV_CACHES = ("preallocated", "dynamic")


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p (nucleus) to ``[B, V]`` logits; removed entries become ``-inf``.

    Top-p keeps the smallest set of most likely tokens whose probability reaches ``top_p`` (always at least one).
    """
    x = logits / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Mass strictly before each token: a token is dropped once the tokens ahead of it already reach top_p.
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """Draw one token per row from ``[B, V]`` raw logits under ``params`` (temperature 0: argmax)."""
    if params.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, params.temperature, params.top_p, params.top_k), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def logprobs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``tokens`` and the entropy of the full distribution softmax(logits / temperature), from
    ``[B, V]`` logits before top-k/top-p. Temperature 0 (greedy) reports the untempered distribution: its limit is
    a point mass that says nothing, and greedy samples are for evaluation, never trained on."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1), entropy


class HFEngine(GenerationEngine):
    """Sample with a ``transformers`` causal LM (KV cache, left padding, chunked batches). Supports partial
    rollouts: ``between_steps`` runs between decoding steps (see :class:`GenerationEngine`).

    Args:
        model: a model folder or a loaded ``PreTrainedModel`` (used as is, not copied).
        tokenizer: decodes completions into ``Completion.text``; by default loaded from a model folder with
            :func:`r3_rllib.models.tiny.load_tokenizer`. ``None`` with a model object leaves ``text`` empty.
        dtype: dtype for a model loaded from a folder (fp32 on CPU).
        device: where the model runs.
        max_batch_size: most sequences decoded together; larger requests are split into chunks.
        eos_token_ids: tokens that end a completion besides ``SamplingParams.stop_token_ids``; by default the
            tokenizer's eos and the model's ``generation_config.eos_token_id``.
        kv_cache: ``"preallocated"`` (buffers sized once per batch, see :mod:`r3_rllib.engines.kv_cache`; models
            with sliding-window or linear-attention layers fall back to transformers' cache) or ``"dynamic"``
            (transformers' ``DynamicCache``, grown by concatenation every step).
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        dtype: torch.dtype | str = torch.float32,
        device: str | torch.device = "cpu",
        max_batch_size: int = 256,
        eos_token_ids: Sequence[int] | None = None,
        kv_cache: str = "preallocated",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
        self.kv_cache = kv_cache
        self.device = torch.device(device)
        if isinstance(model, (str, Path)):
            from r3_rllib.models.progress_bars import no_progress_bars
            from r3_rllib.models.tiny import load_tokenizer

            path = Path(model)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"no model folder (config.json) at {path}")
            with no_progress_bars():
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
            warn_if_emulated_bf16(model.dtype, self.device.type, "the HF engine")
            if tokenizer is None:
                tokenizer = load_tokenizer(path)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids = self._default_eos(eos_token_ids)
        self.pad_token_id = self._default_pad()
        self._version = 0
        self.supports_partial_rollouts = True
        # CPU copies of the base weights the LoRA adapters modify (filled on first use, see update_adapter).
        self._lora_base: dict[str, torch.Tensor] = {}

    # -- setup helpers ------------------------------------------------------------------------------------------
    def _default_eos(self, eos_token_ids: Sequence[int] | None) -> tuple[int, ...]:
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return resolve_eos_ids(eos_token_ids, self.tokenizer, gen_eos)

    def _default_pad(self) -> int:
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        pad = getattr(self.model.config, "pad_token_id", None)
        return int(pad) if pad is not None else self.eos_token_ids[0]

    # -- GenerationEngine -----------------------------------------------------------------------------------------
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = checked_prompts(prompt_ids, self.model.config.vocab_size)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        stop_ids = torch.tensor(
            sorted(set(self.eos_token_ids) | set(params.stop_token_ids)), device=self.device
        )

        # Rows are (prompt, sample) pairs in output order; chunks of at most max_batch_size rows.
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        results: list[list[Completion]] = [[] for _ in prompts]
        for start in range(0, len(rows), self.max_batch_size):
            chunk = rows[start : start + self.max_batch_size]
            for (i, _), completion in zip(
                chunk, self._generate_rows(prompts, chunk, params, stop_ids, generator), strict=True
            ):
                results[i].append(completion)
        return results

    @torch.inference_mode()
    def _generate_rows(
        self,
        prompts: list[list[int]],
        rows: list[tuple[int, int]],
        params: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator | None,
    ) -> list[Completion]:
        """Sample one completion per ``(prompt index, sample index)`` row: prefill, decode, then cut at the stops."""
        cache, logits, mask = self._prefill(prompts, rows, params)
        next_pos = torch.tensor([len(prompts[i]) for i, _ in rows], device=self.device)
        tok, lps, ents, vers = self._decode_rows(cache, logits, mask, next_pos, params, stop_ids, generator)
        return self._completions(prompts, rows, (tok, lps, ents, vers), set(stop_ids.tolist()))

    def _prefill(
        self, prompts: list[list[int]], rows: list[tuple[int, int]], params: SamplingParams
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill each distinct prompt of ``rows`` once, then copy its KV cache to its sample rows.

        Returns the cache, the last-position logits and the attention mask, one row per element of ``rows``."""
        unique = sorted({i for i, _ in rows})
        slot = {i: k for k, i in enumerate(unique)}
        lengths = [len(prompts[i]) for i in unique]
        width = max(lengths)
        input_ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for k, i in enumerate(unique):
            input_ids[k, width - lengths[k] :] = torch.tensor(prompts[i])
            mask[k, width - lengths[k] :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if self.kv_cache == "preallocated":
            cache = preallocated_cache(self.model.config, width + params.max_new_tokens)
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        fan_out = torch.tensor([slot[i] for i, _ in rows], device=self.device)
        cache.reorder_cache(fan_out)
        logits = out.logits[:, -1].float().index_select(0, fan_out)
        return cache, logits, mask.index_select(0, fan_out)

    def _decode_rows(
        self,
        cache: Any,
        logits: torch.Tensor,
        mask: torch.Tensor,
        next_pos: torch.Tensor,
        params: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The decode loop from prefilled rows: ``[rows, max_new_tokens]`` tokens (pad after a stop), their
        log-probs, entropies and policy versions, as numpy arrays. ``between_steps`` (partial rollouts) runs every
        ``between_steps_every`` steps and may load newer weights: the next tokens are sampled with them."""
        batch, steps = logits.shape[0], params.max_new_tokens
        tok = torch.full((batch, steps), self.pad_token_id, dtype=torch.long, device=self.device)
        lps = torch.zeros((batch, steps), dtype=torch.float32, device=self.device)
        ents = torch.zeros((batch, steps), dtype=torch.float32, device=self.device)
        vers = np.full((batch, steps), self._version, dtype=np.int64)
        # `active` maps the rows still decoding to their output rows; finished rows are dropped from the batch
        # (and from the KV cache) so long-tail completions do not pay for the finished ones.
        active = torch.arange(batch, device=self.device)
        for step in range(steps):
            tokens = sample_next(logits, params, generator)
            lp, ent = logprobs_and_entropy(logits, tokens, params.temperature)
            tok[active, step] = tokens
            lps[active, step] = lp
            ents[active, step] = ent
            vers[active.cpu().numpy(), step] = self._version
            done = torch.isin(tokens, stop_ids)
            if bool(done.all()) or step == steps - 1:
                break
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(-1)
                active, tokens, mask, next_pos = active[keep], tokens[keep], mask[keep], next_pos[keep]
                cache.reorder_cache(keep)
            if self.between_steps is not None and (step + 1) % self.between_steps_every == 0:
                self.between_steps()  # may load newer weights: the next logits come from them
            ones = torch.ones((len(active), 1), dtype=mask.dtype, device=self.device)
            mask = torch.cat([mask, ones], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1
        return tok.cpu().numpy(), lps.cpu().numpy(), ents.cpu().numpy(), vers

    def _completions(
        self,
        prompts: list[list[int]],
        rows: list[tuple[int, int]],
        decoded: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        stop_set: set[int],
    ) -> list[Completion]:
        """One :class:`Completion` per row of ``decoded`` (tokens, log-probs, entropies, versions), cut after its
        first stop token (``"length"`` when it has none)."""
        tok, lps, ents, vers = decoded
        completions = []
        for r, (i, _) in enumerate(rows):
            ids = tok[r].tolist()
            end = next((t + 1 for t, x in enumerate(ids) if x in stop_set), None)
            reason = "stop" if end is not None else "length"
            end = end if end is not None else len(ids)
            ids = ids[:end]
            completions.append(
                Completion(
                    prompt_ids=list(prompts[i]),
                    token_ids=ids,
                    logprobs=lps[r, :end].copy(),
                    entropies=ents[r, :end].copy(),
                    finish_reason=reason,
                    text=self._decode(ids),
                    token_versions=vers[r, :end].copy(),
                )
            )
        return completions

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        # The eos marks the end of the response; it is not part of the text. Other stop tokens stay.
        while ids and ids[-1] in self.eos_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy tensors into the model's parameters and buffers in place (names as in ``model.state_dict()``)."""
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in state:
                    raise KeyError(f"update_weights: the model has no parameter or buffer named {name!r}")
                target = state[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects "
                        f"{tuple(target.shape)}"
                    )
                target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
        # Full weights replace any merged adapter: the kept base copies are stale now.
        self._lora_base = {}
        self._version = int(version)

    def update_adapter(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        rank: int,
        alpha: float,
        target_modules: Sequence[str],
        version: int,
    ) -> None:
        """Merge the LoRA adapter into the adapted modules' weights: ``W = W_base + (alpha / rank) * B @ A``.

        Merging instead of wrapping the model with peft keeps generation as fast as without LoRA (a peft wrapper
        adds two small matmuls per adapted layer at every decode step) and needs no peft on the runners. A CPU copy
        of each adapted module's base weight is kept from its first adapter on, so every adapter is merged into
        the base and replaces the previous one instead of adding to it; a module the previous adapter covered and
        this one does not goes back to its base weight."""
        del target_modules  # the adapter's tensor names say which modules it covers
        pairs = adapter_pairs(named_tensors)
        params = dict(self.model.named_parameters())
        for module in pairs:
            name = f"{module}.weight"
            if name not in params:
                raise KeyError(f"update_adapter: the model has no weight {name!r} to adapt")
            if name not in self._lora_base:
                self._lora_base[name] = params[name].detach().to("cpu", copy=True)
        with torch.no_grad():
            for name, tensor in merged_state(self._lora_base, pairs, lora_scale(rank, alpha)).items():
                params[name].copy_(tensor.to(params[name].device))
        self._version = int(version)
