"""Tiny models that train in minutes on a CPU: a character tokenizer and a small Qwen2 decoder.

The character tokenizer maps every printable ASCII character (32..126) and ``"\\n"`` to exactly one token, so
arithmetic answers are digit sequences the model can learn quickly. It is built in code (no hub download) and saved
with a marker file; :func:`load_tokenizer` must be used to reload it, because ``AutoTokenizer`` resolves a Qwen2
``config.json`` to ``Qwen2Tokenizer``, which silently drops characters of a custom vocabulary.

The models are ordinary ``Qwen2ForCausalLM`` instances, so every backend that serves Qwen2 (transformers, vLLM)
serves them too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)

# Written next to the tokenizer files; its presence tells load_tokenizer to bypass AutoTokenizer.
MARKER_FILE = "r3_tokenizer.json"
CHAR_TOKENIZER_KIND = "r3-char-v1"


def _fast_tokenizer(core: Tokenizer) -> PreTrainedTokenizerFast:
    """`core` with the tiny models' special tokens, left padding and no clean-up of spaces."""
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: ids 0..3 are ``<pad> <eos> <bos> <unk>``, then one id per character.

    No special token is added on encode (prompts are exactly their characters); decoding concatenates characters.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(tok_models.WordLevel(vocab, unk_token=UNK_TOKEN))
    # An empty split pattern with "isolated" behaviour yields one piece per character (whitespace included).
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    return _fast_tokenizer(core)


def is_char_tokenizer_dir(path: str | Path) -> bool:
    marker = Path(path) / MARKER_FILE
    if not marker.is_file():
        return False
    return json.loads(marker.read_text()).get("kind") == CHAR_TOKENIZER_KIND


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved by :func:`save_tiny` (character tokenizer) or any Hugging Face tokenizer folder."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    if is_char_tokenizer_dir(path):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
        tokenizer.padding_side = "left"
        return tokenizer
    return AutoTokenizer.from_pretrained(str(path))


def _qwen2_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    vocab_size: int,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_positions: int,
) -> Qwen2Config:
    if hidden % heads != 0:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    if heads % kv_heads != 0:
        raise ValueError(f"heads={heads} must be divisible by kv_heads={kv_heads}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token; the model could never stop")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=pad,
        rope_theta=10000.0,
        torch_dtype="float32",
    )


def _init_model(config: Qwen2Config, seed: int) -> Qwen2ForCausalLM:
    # A local generator state keeps model construction deterministic without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model.to(torch.float32).eval()


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 2048,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 decoder sized for the character tokenizer (~0.8 M parameters by default).

    Embeddings are tied; ``model.state_dict()`` still lists ``lm_head.weight``, which vLLM needs on reload.
    """
    return _init_model(
        _qwen2_config(
            tokenizer,
            vocab_size=len(tokenizer),
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            intermediate=intermediate or 3 * hidden,
            max_positions=max_positions,
        ),
        seed,
    )


def build_tiny_model_for_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A tiny random Qwen2 for any tokenizer (e.g. the 151k-token R1-distill one) to test chat-template paths.

    The vocabulary is rounded up to a multiple of 64 (as released Qwen2 checkpoints do); with ``hidden=64`` the tied
    embedding of a 151k vocabulary is ~9.7 M parameters, the rest is small.
    """
    vocab = -(-len(tokenizer) // 64) * 64
    return _init_model(
        _qwen2_config(
            tokenizer,
            vocab_size=vocab,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            intermediate=3 * hidden,
            max_positions=max_positions,
        ),
        seed,
    )


def save_tiny(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Save model (fp32 safetensors) and tokenizer to ``path``; mark character tokenizers for :func:`load_tokenizer`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return save_tokenizer(tokenizer, path)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Save a tokenizer so that :func:`load_tokenizer` gets it back unchanged (character tokenizers are marked)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    marker = path / MARKER_FILE
    if _is_char_tokenizer(tokenizer):
        marker.write_text(json.dumps({"kind": CHAR_TOKENIZER_KIND}, indent=2) + "\n")
    elif marker.exists():
        marker.unlink()
    return path


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the symbol byte-level tokenizers (Qwen2's among them) write each byte as
    (printable ASCII stays itself, a space is 'Ġ', a newline 'Ċ')."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {b: chr(b) for b in kept} | {b: chr(256 + i) for i, b in enumerate(moved)}


def portable_char_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerFast:
    """The character tokenizer as a byte-level BPE without merges: the same ids for the same text, and a folder
    that plain ``AutoTokenizer.from_pretrained`` loads right. transformers resolves a Qwen2 folder to
    ``Qwen2Tokenizer`` whatever tokenizer_config.json names, and that class rebuilds a byte-level BPE from
    tokenizer.json's vocabulary: the character vocabulary's ' ' and '\\n' are not byte-level symbols, so it dropped
    them ('cat dog' -> 'catdog'); written as 'Ġ' and 'Ċ' they round-trip. Text outside printable ASCII has no id
    (the character tokenizer's ``<unk>``; ``Qwen2Tokenizer`` drops it)."""
    if not _is_char_tokenizer(tokenizer):
        raise ValueError("not the character tokenizer (build_tiny_tokenizer)")
    symbols = _byte_symbols()
    vocab = {(t if t in SPECIAL_TOKENS else symbols[ord(t)]): i for t, i in tokenizer.get_vocab().items()}
    core = Tokenizer(tok_models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return _fast_tokenizer(core)


def save_portable_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Save a tokenizer into an exported model folder so that ``AutoTokenizer.from_pretrained(path)`` loads it
    (and :func:`load_tokenizer` too): the character tokenizer as :func:`portable_char_tokenizer` (marked, and
    named ``PreTrainedTokenizerFast`` in tokenizer_config.json, which transformers 4 and 5 both read), any other
    as it is."""
    if not _is_char_tokenizer(tokenizer):
        return save_tokenizer(tokenizer, path)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    portable_char_tokenizer(tokenizer).save_pretrained(str(path))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    (path / MARKER_FILE).write_text(json.dumps({"kind": CHAR_TOKENIZER_KIND}, indent=2) + "\n")
    return path


def load_tiny(
    path: str | Path, *, dtype: torch.dtype = torch.float32
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerBase]:
    """Load a model folder written by :func:`save_tiny` (or any Qwen2 folder) with the right tokenizer loader."""
    model = Qwen2ForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return model, load_tokenizer(path)


def _is_char_tokenizer(tokenizer: PreTrainedTokenizerBase) -> bool:
    vocab = tokenizer.get_vocab()
    return len(vocab) == len(SPECIAL_TOKENS) + len(CHARACTERS) and all(c in vocab for c in CHARACTERS)
