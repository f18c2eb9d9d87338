"""Name -> factory registry for text environments, extended by packages through the entry-point group
``r3_rllib.text_envs``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from r3_rllib.envs.base import TextEnv

ENTRY_POINT_GROUP = "r3_rllib.text_envs"
_REGISTRY: dict[str, Callable[..., TextEnv]] = {}


def register_text_env(name: str, factory: Callable[..., TextEnv], *, overwrite: bool = False) -> None:
    """Make `factory(**config)` available as `make_text_env(name, **config)`."""
    if not callable(factory):
        raise TypeError(f"factory for text env {name!r} must be callable, got {type(factory).__name__}")
    if name in _REGISTRY and _REGISTRY[name] is not factory and not overwrite:
        raise ValueError(f"text env {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_text_envs() -> list[str]:
    return sorted(set(_REGISTRY) | set(_entry_points()))


def get_text_env_factory(name: str) -> Callable[..., TextEnv]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    eps = _entry_points()
    if name in eps:
        factory = eps[name].load()
        _REGISTRY[name] = factory
        return factory
    known = registered_text_envs()
    hint = difflib.get_close_matches(name, known, n=1)
    raise ValueError(
        f"unknown text env {name!r}; known: {', '.join(known) or 'none'}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
    )


def make_text_env(name: str, **config: Any) -> TextEnv:
    """Build the registered text env `name` with `config`."""
    return get_text_env_factory(name)(**config)
