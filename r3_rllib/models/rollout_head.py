"""R^2PO's rollout head: a small residual on a causal LM's next-token logits, used only to sample training rollouts.

The head maps the LM's last hidden state ``h`` to a vocabulary-sized correction,
``head(h) = W2 relu(W1 h)`` (``W1: hidden x hidden``, ``W2: hidden x vocab``, no biases), and

- rollout logits   = ``lm_head(h) + head(h)``  (training rollouts explore through the head),
- inference logits = ``lm_head(h)``             (evaluation and the exported policy never see it).

Both weight matrices start as ``N(0, init_std^2)`` with ``init_std = 1e-6``: the correction is then ~1e-10 of a
logit, so a fresh head samples what the base policy samples. The init is small but not zero on purpose: with both
matrices at zero, the gradient of each one is a product with the other, so a zero head would stay zero forever.

Attaching (:func:`attach_rollout_head`) makes the head a submodule ``rollout_head`` of the HF model, so the model's
``state_dict()``, its parameters (optimizers, FSDP) and weight sync carry it under the ``rollout_head.`` prefix, and
installs a forward hook on the model's output embedding that adds the head when rollout logits are switched on
(:func:`rollout_logits_enabled`); switched off (the default) the model's logits are exactly the base ones. Every
caller of ``model(...)`` (``generate``, the HF engine's decode loop, the learner's log-probs) then gets rollout
logits without a code change. :func:`export_policy` writes the HF folder *without* the head (it loads with
``AutoModelForCausalLM`` as any other policy) and, if asked, the head's files beside it.

Supported models: those whose logits are exactly ``lm_head(last_hidden_state)`` (Qwen2, Llama, Mistral, ...); models
that rescale or soft-cap their logits are refused.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from r3_rllib.core.logprobs import LOGIT_TRANSFORMS, token_logprobs

#: Attribute (and ``state_dict`` prefix without the dot) of an attached head on the HF model.
ROLLOUT_HEAD_ATTR = "rollout_head"
ROLLOUT_HEAD_PREFIX = ROLLOUT_HEAD_ATTR + "."
#: Files of a saved head, beside (or instead of) an HF model folder.
HEAD_WEIGHTS_FILE = "rollout_head.safetensors"
HEAD_CONFIG_FILE = "rollout_head.json"
HEAD_FORMAT = "r3-rollout-head-v1"
DEFAULT_INIT_STD = 1e-6


class RolloutHead(nn.Module):
    """``Linear(hidden, hidden, bias=False) -> ReLU -> Linear(hidden, vocab, bias=False)``, initialised near zero.

    Args:
        hidden_size: width of the LM's last hidden state.
        vocab_size: number of logits of the LM (its ``lm_head`` output size, which may exceed the tokenizer's).
        init_std: std of the normal init of both matrices (> 0; see the module docstring for why not 0).
        seed: seed of the init (None: the global torch RNG). A seeded init leaves the global RNG untouched.
        dtype, device: of the parameters.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        init_std: float = DEFAULT_INIT_STD,
        *,
        seed: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        # skip_init: nn.Linear's own (Kaiming) init would draw from the global RNG for nothing, as
        # reset_parameters overwrites it; a seeded head then leaves the caller's RNG exactly as it was.
        factory = dict(bias=False, dtype=dtype, device=device if device is not None else "cpu")
        self.hidden_proj = nn.utils.skip_init(nn.Linear, hidden_size, hidden_size, **factory)
        self.vocab_proj = nn.utils.skip_init(nn.Linear, hidden_size, vocab_size, **factory)
        self.reset_parameters(init_std, seed=seed)  # sets self.init_std
        #: Whether the attached hook adds this head to the model's logits (see :func:`rollout_logits_enabled`).
        self.enabled = False

    def reset_parameters(self, init_std: float = DEFAULT_INIT_STD, *, seed: int | None = None) -> None:
        """Re-draw both matrices from ``N(0, init_std^2)``."""
        if not (isinstance(init_std, (int, float)) and 0 < init_std < float("inf")):
            raise ValueError(
                f"init_std must be finite and > 0, got {init_std!r} (an all-zero head gets zero gradients and never "
                "learns)"
            )
        with contextlib.ExitStack() as stack:
            if seed is not None:
                devices = [self.vocab_proj.weight.device] if self.vocab_proj.weight.is_cuda else []
                stack.enter_context(torch.random.fork_rng(devices=devices))
                torch.manual_seed(seed)
            with torch.no_grad():
                nn.init.normal_(self.hidden_proj.weight, mean=0.0, std=init_std)
                nn.init.normal_(self.vocab_proj.weight, mean=0.0, std=init_std)
        self.init_std = float(init_std)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logit correction ``[..., vocab]`` for hidden states ``[..., hidden]`` (computed in the head's dtype)."""
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden states have width {hidden.shape[-1]}, the head expects {self.hidden_size}"
            )
        return self.vocab_proj(torch.relu(self.hidden_proj(hidden.to(self.hidden_proj.weight.dtype))))

    def lm_head_hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        """Forward hook for the LM head: its input hidden states (already cut by ``logits_to_keep``) and its output
        give the rollout logits exactly where the model forms its logits, for every caller of ``model(...)``.

        A bound method rather than a closure: ``copy.deepcopy`` of the model then hooks the copy's head, not this one.
        """
        if not self.enabled:
            return None
        hidden = args[0]
        if output.shape[:-1] != hidden.shape[:-1] or output.shape[-1] != self.vocab_size:
            raise RuntimeError(
                f"rollout logits are on but the LM head returned {tuple(output.shape)} for hidden states "
                f"{tuple(hidden.shape)}, not logits (was its forward replaced, e.g. by response-only scoring?); "
                "compute head-on log-probs with rollout_token_logprobs, or switch rollout logits off"
            )
        return rollout_logits(output, hidden, self)

    def config_dict(self) -> dict:
        """What :func:`load_rollout_head` needs to rebuild the module (saved as ``rollout_head.json``)."""
        return {
            "format": HEAD_FORMAT,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "init_std": self.init_std,
            "dtype": str(self.vocab_proj.weight.dtype).removeprefix("torch."),
        }

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        init_std: float = DEFAULT_INIT_STD,
        *,
        seed: int | None = None,
    ) -> RolloutHead:
        """A head sized, typed and placed for ``model`` (a HF causal LM) from its output embedding."""
        _check_plain_logits(model)
        weight = _output_embedding(model).weight
        vocab, hidden = weight.shape
        return cls(int(hidden), int(vocab), init_std, seed=seed, dtype=weight.dtype, device=weight.device)


def rollout_logits(lm_logits: torch.Tensor, hidden: torch.Tensor, head: RolloutHead) -> torch.Tensor:
    """``lm_logits + head(hidden)``: the distribution rollouts sample from (``[..., vocab]``, lm_logits' dtype).

    ``hidden`` are the hidden states that produced ``lm_logits`` (same leading shape).
    """
    if lm_logits.shape[:-1] != hidden.shape[:-1]:
        raise ValueError(
            f"lm_logits {tuple(lm_logits.shape)} and hidden {tuple(hidden.shape)} must share their leading shape"
        )
    if lm_logits.shape[-1] != head.vocab_size:
        raise ValueError(
            f"lm_logits have {lm_logits.shape[-1]} entries per position, the head {head.vocab_size}"
        )
    return lm_logits + head(hidden).to(lm_logits.dtype)


# -- attaching to a HF causal LM ----------------------------------------------------------------------------------
def _output_embedding(model: nn.Module) -> nn.Linear:
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    if not isinstance(out, nn.Linear):
        raise TypeError(
            f"{type(model).__name__} has no linear output embedding (get_output_embeddings()); a rollout head needs "
            "a causal LM whose logits are lm_head(hidden)"
        )
    return out


def _check_plain_logits(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for field in LOGIT_TRANSFORMS:
        value = getattr(config, field, None)
        if value not in (None, 1, 1.0):
            raise ValueError(
                f"{type(model).__name__} transforms its logits ({field}={value!r}); the rollout head supports models "
                "whose logits are exactly lm_head(hidden)"
            )


def get_rollout_head(model: nn.Module) -> RolloutHead | None:
    """The head attached to ``model``, or None."""
    head = getattr(model, ROLLOUT_HEAD_ATTR, None)
    return head if isinstance(head, RolloutHead) else None


def attach_rollout_head(
    model: nn.Module, head: RolloutHead | None = None, *, seed: int | None = None
) -> RolloutHead:
    """Attach ``head`` (default: a fresh near-zero one, :meth:`RolloutHead.for_model`) to a HF causal LM.

    After this, ``model.state_dict()`` holds the head under ``rollout_head.*``, ``model.parameters()`` include it,
    and ``model(...)`` returns rollout logits while :func:`rollout_logits_enabled` is on (off after attaching).
    Returns the attached head.
    """
    if get_rollout_head(model) is not None:
        raise ValueError("the model already has a rollout head; detach_rollout_head() it first")
    if hasattr(model, ROLLOUT_HEAD_ATTR):
        raise ValueError(
            f"the model already has an attribute {ROLLOUT_HEAD_ATTR!r} that is not a rollout head"
        )
    _check_plain_logits(model)
    lm_head = _output_embedding(model)
    if head is None:
        head = RolloutHead.for_model(model, seed=seed)
    vocab, hidden = lm_head.weight.shape
    if (head.hidden_size, head.vocab_size) != (hidden, vocab):
        raise ValueError(
            f"the head maps {head.hidden_size} -> {head.vocab_size}, the model's lm_head {hidden} -> {vocab}"
        )
    head.enabled = False
    model.add_module(ROLLOUT_HEAD_ATTR, head)
    head._hook_handle = lm_head.register_forward_hook(head.lm_head_hook)
    return head


def detach_rollout_head(model: nn.Module) -> RolloutHead:
    """Remove the attached head (module and hook) and return it; the model is a plain HF model again."""
    head = get_rollout_head(model)
    if head is None:
        raise ValueError("the model has no rollout head attached")
    head._hook_handle.remove()
    del head._hook_handle
    delattr(model, ROLLOUT_HEAD_ATTR)
    head.enabled = False
    return head


def set_rollout_logits(model: nn.Module, enabled: bool) -> None:
    """Switch the model's logits between rollout (``True``) and inference (``False``) logits."""
    head = get_rollout_head(model)
    if head is None:
        raise ValueError("the model has no rollout head attached (attach_rollout_head)")
    head.enabled = bool(enabled)


@contextlib.contextmanager
def rollout_logits_enabled(model: nn.Module, enabled: bool = True) -> Iterator[RolloutHead]:
    """Within the block ``model(...)`` returns rollout logits (``enabled=True``) or base logits; restored after."""
    head = get_rollout_head(model)
    if head is None:
        raise ValueError("the model has no rollout head attached (attach_rollout_head)")
    before = head.enabled
    head.enabled = bool(enabled)
    try:
        yield head
    finally:
        head.enabled = before


def split_rollout_head_state(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split a state dict of a model with an attached head into (base policy's, head's without the prefix)."""
    base = {k: v for k, v in state.items() if not k.startswith(ROLLOUT_HEAD_PREFIX)}
    head = {k[len(ROLLOUT_HEAD_PREFIX) :]: v for k, v in state.items() if k.startswith(ROLLOUT_HEAD_PREFIX)}
    return base, head


# -- log-probs of given tokens ----------------------------------------------------------------------------------------
def rollout_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    *,
    head: RolloutHead | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each next token under rollout logits and under base logits, from one forward pass (fp32).

    Returns ``(rollout, base)``, both ``[B, L-1]``: entry ``t`` scores ``input_ids[:, t + 1]`` given the prefix, as
    the learner's scoring (:func:`r3_rllib.core.logprobs.token_logprobs`, which this calls). With ``temperature`` T
    the distributions are ``softmax((lm + head) / T)`` and ``softmax(lm / T)``: the sum is divided, not its parts,
    because that is what a sampler at temperature T draws from.

    ``response_mask`` (``[B, L-1]`` bool, default the real next tokens) selects the positions to score; the LM head,
    the rollout head and the softmax then run on those positions only (the decoder still sees every token) and the
    other entries are 0. ``attention_mask`` marks real tokens; position ids count real tokens only, so left- and
    right-padded rows give the numbers of the unpadded sequence.

    ``head``: default the attached one. The result does not depend on :func:`rollout_logits_enabled` (the hook is
    off during the call). Gradients flow to both the base and the head through both results;
    ``requires_grad`` decides which of them get any (R^2PO's stages: :func:`r3_rllib.r2po.method.set_stage_trainable`).
    """
    if not (isinstance(temperature, (int, float)) and 0 < temperature < float("inf")):
        raise ValueError(
            f"temperature must be finite and > 0 (greedy decoding has no log-probs), got {temperature!r}"
        )
    head = head if head is not None else get_rollout_head(model)
    if head is None:
        raise ValueError("no rollout head: pass head= or attach one to the model (attach_rollout_head)")
    _check_plain_logits(model)
    if input_ids.ndim != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be [B, L] with L >= 2, got {tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must match input_ids {tuple(input_ids.shape)}"
        )
    if response_mask is None:
        response_mask = attention_mask[:, 1:].bool()
    if response_mask.shape != (batch, length - 1):
        raise ValueError(
            f"response_mask must be [B, L-1] = {(batch, length - 1)}, got {tuple(response_mask.shape)}"
        )
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    enabled, head.enabled = head.enabled, False  # the hook must not add the head a second time
    try:
        rollout, _, base = token_logprobs(
            model,
            input_ids,
            attention_mask,
            response_mask=response_mask,
            temperature=temperature,
            rollout_head=head,
            with_base=True,
            base_grad=True,
            position_ids=positions,
        )
    finally:
        head.enabled = enabled
    return rollout, base


# -- files: the head beside an HF folder --------------------------------------------------------------------------
def has_rollout_head(path: str | Path) -> bool:
    """True when ``path`` holds a saved head (:func:`save_rollout_head`)."""
    path = Path(path)
    return (path / HEAD_WEIGHTS_FILE).is_file() and (path / HEAD_CONFIG_FILE).is_file()


def save_rollout_head(head: RolloutHead, path: str | Path) -> Path:
    """Write ``rollout_head.safetensors`` and ``rollout_head.json`` into folder ``path`` (created if needed).

    Only these two files are written, so ``path`` may be an HF model folder: ``from_pretrained`` ignores them.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(path / HEAD_WEIGHTS_FILE), metadata={"format": HEAD_FORMAT})
    (path / HEAD_CONFIG_FILE).write_text(json.dumps(head.config_dict(), indent=2) + "\n")
    return path


def load_rollout_head(
    path: str | Path, *, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> RolloutHead:
    """Rebuild a head saved by :func:`save_rollout_head` (``dtype`` None: the saved one)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not has_rollout_head(path):
        raise FileNotFoundError(
            f"no rollout head in {path} (expected {HEAD_WEIGHTS_FILE} and {HEAD_CONFIG_FILE})"
        )
    config = json.loads((path / HEAD_CONFIG_FILE).read_text())
    if config.get("format") != HEAD_FORMAT:
        raise ValueError(
            f"{path / HEAD_CONFIG_FILE}: format {config.get('format')!r}, expected {HEAD_FORMAT!r}"
        )
    tensors = load_file(str(path / HEAD_WEIGHTS_FILE))
    if dtype is None:
        dtype = getattr(torch, str(config.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{path / HEAD_CONFIG_FILE}: unknown dtype {config.get('dtype')!r}")
    # The saved weights overwrite the init: any positive std will do, the saved one is kept for the record.
    head = RolloutHead(
        int(config["hidden_size"]),
        int(config["vocab_size"]),
        float(config["init_std"]),
        dtype=dtype,
        device=device,
    )
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != found:
        raise ValueError(f"{path / HEAD_WEIGHTS_FILE}: tensors {found} do not match the config's {expected}")
    head.load_state_dict(tensors)
    return head


def export_policy(model: nn.Module, path: str | Path, *, with_head: bool = False, tokenizer=None) -> Path:
    """Save ``model`` as an HF folder WITHOUT its head (loadable by ``AutoModelForCausalLM``); the head's files
    beside it when ``with_head`` (and a head is attached). ``tokenizer``: saved too when given. A peft LoRA model:
    the adapter merged into the weights in ``path`` and the adapter alone in ``path/lora_adapter``
    (r3_rllib/models/lora.py)."""
    path = Path(path)
    # A LoRA PeftModel: the merged model here, the adapter in lora_adapter/.
    if hasattr(model, "merge_and_unload"):
        from r3_rllib.models.lora import save_lora_export

        if with_head:
            raise ValueError("with_head=True for a LoRA model: LoRA and the rollout head do not combine")
        save_lora_export(model, path)
        if tokenizer is not None:
            from r3_rllib.models.tiny import save_tokenizer

            save_tokenizer(tokenizer, path)
        return path
    head = get_rollout_head(model)
    if with_head and head is None:
        raise ValueError("with_head=True but the model has no rollout head attached")
    # Taking the submodule off for the save keeps rollout_head.* out of model.safetensors (the hook stays, and is
    # off anyway unless enabled; save_pretrained does not run the model).
    if head is not None:
        delattr(model, ROLLOUT_HEAD_ATTR)
    try:
        model.save_pretrained(str(path), safe_serialization=True)
    finally:
        if head is not None:
            model.add_module(ROLLOUT_HEAD_ATTR, head)
    if tokenizer is not None:
        from r3_rllib.models.tiny import save_tokenizer

        save_tokenizer(tokenizer, path)
    if with_head:
        save_rollout_head(head, path)
    return path


def load_policy_with_head(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    head_path: str | Path | None = None,
    require_head: bool = False,
    seed: int | None = None,
):
    """Load an HF causal LM from ``path`` and attach its head: the one saved in ``head_path`` (default ``path``) when
    present, else a fresh near-zero head (``seed``), unless ``require_head``. Rollout logits start switched off."""
    from transformers import AutoModelForCausalLM

    from r3_rllib.models.progress_bars import no_progress_bars

    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    head_dir = Path(head_path) if head_path is not None else Path(path)
    if has_rollout_head(head_dir):
        head = load_rollout_head(head_dir, dtype=dtype, device=_output_embedding(model).weight.device)
    elif require_head:
        raise FileNotFoundError(f"no rollout head in {head_dir} (require_head=True)")
    else:
        head = None
    attach_rollout_head(model, head, seed=seed)
    return model
