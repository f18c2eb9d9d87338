"""Builders of the named models made by training: ``model_path: gridworld-tiny-sft`` resolves (in
:mod:`r3_rllib.models.hub`) to a cached folder that a builder registered here fills.

A name resolves to a path and never trains; building is a separate, explicit step that the driver (before its
runners start), ``r3 train``, ``r3 eval`` and ``r3 build-model NAME`` take. Builders reuse a cached folder of the
same configuration, so building an up-to-date model costs a metadata read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from r3_rllib.core.registry import Registry
from r3_rllib.models.hub import (
    GRIDWORLD_TINY_SFT,
    SMOLLM2_TEXTWORLD_SFT,
    named_model_folder,
    named_models,
    resolve_model_path,
)

# name -> function that builds the named model into the folder its resolver finds, and returns that folder.
NAMED_MODEL_BUILDERS = Registry("named model builder")


@NAMED_MODEL_BUILDERS.register(GRIDWORLD_TINY_SFT)
def build_gridworld_tiny_sft() -> Path:
    """The tiny model warm-started on gridworld expert moves ('hgpo' preset; about 30 s of SFT on first use)."""
    from r3_rllib.warmstart.gridworld import build_warm_start

    return build_warm_start(named_model_folder(GRIDWORLD_TINY_SFT), log=lambda message: None)


@NAMED_MODEL_BUILDERS.register(SMOLLM2_TEXTWORLD_SFT)
def build_smollm2_textworld_sft() -> Path:
    """SmolLM2-135M-Instruct warm-started on TextWorld walkthroughs (coin collector level 3, 6 commands, memory 2:
    the TextWorld bench's env; about two minutes of SFT on first use; needs the ``[envs]`` extra)."""
    from r3_rllib.warmstart.textworld import build_warm_start

    return build_warm_start(named_model_folder(SMOLLM2_TEXTWORLD_SFT), log=lambda message: None)


def register_named_model_builder(name: str, builder: Callable[[], Path], *, overwrite: bool = False) -> None:
    """Make :func:`build_named_model` build ``name`` with ``builder()`` (which returns the folder). The name itself
    is registered with :func:`r3_rllib.models.hub.register_named_model`, whose resolver finds the built folder."""
    if name in NAMED_MODEL_BUILDERS and NAMED_MODEL_BUILDERS[name] is not builder:
        if not overwrite:
            raise ValueError(f"named model {name!r} already has a builder; pass overwrite=True to replace it")
        del NAMED_MODEL_BUILDERS[name]
    if name not in NAMED_MODEL_BUILDERS:
        NAMED_MODEL_BUILDERS.register(name)(builder)


def build_named_model(name: str) -> Path:
    """Build named model ``name`` when its cached folder is missing or stale, and return the folder. A model
    without a builder (one converted on resolution, like ``smollm2-135m``) is resolved."""
    if name not in named_models():
        raise ValueError(f"unknown named model {name!r}; known: {', '.join(named_models())}")
    if name in NAMED_MODEL_BUILDERS:
        return Path(NAMED_MODEL_BUILDERS[name]())
    return resolve_model_path(name)


def build_named_models(models: Iterable[str | Path | None]) -> None:
    """Build each of ``models`` that is a named model (a config's ``model_path`` and ``tokenizer_path``); other
    values (folders, hub names, None) are left to :func:`r3_rllib.models.hub.resolve_model_path`. A local folder
    of the same name wins over a named model, as in resolution."""
    for model in dict.fromkeys(models):
        if isinstance(model, str) and model in named_models() and not Path(model).is_dir():
            build_named_model(model)


def build_model_path(model: str | Path) -> Path:
    """:func:`r3_rllib.models.hub.resolve_model_path` after building ``model`` if it is a named model."""
    build_named_models([model])
    return resolve_model_path(model)
