"""Name -> factory registry of text environments.

Factories come from three places: this package's own envs (:data:`BUILT_IN_TEXT_ENVS`: ``arithmetic``,
``chat_arithmetic``, ``math``, ``reward_fn``, ``gridworld``, ...), :func:`register_text_env` calls, and installed
packages that declare an entry point in the group ``r3_rllib.text_envs`` (``name = "package.module:Factory"``). The
built-in names are read from the code, not from installed metadata, so a checkout run from ``PYTHONPATH`` or shipped
to a cluster by Ray's ``runtime_env={"working_dir": ...}`` knows them in every process; an entry point cannot take a
built-in name. All are loaded on first use, so listing names imports nothing. An explicit registration takes
precedence over a built-in env or an entry point of the same name only when it is the same factory or
``overwrite=True``. The registry is a :class:`~r3_rllib.core.registry.Registry`, the package's one implementation
of named entries.

A name written ``"module:attribute"`` (``"my_tasks:SortEnv"``, ``"my_pkg.envs:make_env"``) needs no registration:
wherever an env name is accepted (``R3Config.environment``, run files, ``make_text_env``, ``r3 eval --env``) it names
the TextEnv class or factory that attribute of that module holds, imported on use (:func:`load_object`; a module
that cannot be imported, or lacks the attribute, is a ``ValueError`` naming it).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from r3_rllib.core.objects import ObjectPathError, is_object_path, load_object
from r3_rllib.core.registry import Registry
from r3_rllib.core.typo_hints import closest_name
from r3_rllib.envs.base import TextEnv

ENTRY_POINT_GROUP = "r3_rllib.text_envs"
TextEnvFactory = Callable[..., TextEnv]


#: The text envs this package ships: name -> ``"module:Factory"``, imported on first use.
BUILT_IN_TEXT_ENVS: dict[str, str] = {
    "agent": "r3_rllib.envs.agent:AgentTextEnv",
    "arithmetic": "r3_rllib.envs.arithmetic:ArithmeticEnv",
    "chat_arithmetic": "r3_rllib.envs.chat_arithmetic:ChatArithmeticEnv",
    "math": "r3_rllib.envs.math_env:MathEnv",
    "python_tool": "r3_rllib.envs.python_tool:PythonToolEnv",
    "gridworld": "r3_rllib.envs.gridworld:GridWorldEnv",
    "reasoning_gym": "r3_rllib.envs.reasoning_gym:ReasoningGymEnv",
    "reward_fn": "r3_rllib.envs.reward_fn:RewardFnEnv",
    "textworld": "r3_rllib.envs.textworld_env:TextWorldEnv",
    "verifiers": "r3_rllib.envs.adapters.verifiers_env:VerifiersEnv",
    "openenv": "r3_rllib.envs.adapters.openenv_env:OpenEnvEnv",
    "gem": "r3_rllib.envs.adapters.gem_env:GemEnv",
    "mcp": "r3_rllib.envs.adapters.mcp_tools:McpToolEnv",
}


def _entry_points() -> dict[str, EntryPoint]:
    """Installed entry points of the group (a function so tests can substitute their own)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _declared() -> dict[str, EntryPoint]:
    """The installed entry points, then the built-in envs over them (a built-in name is not taken by a plugin)."""
    built_in = {n: EntryPoint(n, value, ENTRY_POINT_GROUP) for n, value in BUILT_IN_TEXT_ENVS.items()}
    return {**_entry_points(), **built_in}


def new_text_env_registry() -> Registry:
    """An empty text-env registry that also knows the built-in envs and the installed entry points (looked up
    through :func:`_entry_points` at each use)."""
    return Registry("text env", entry_points=_declared)


_REGISTRY = new_text_env_registry()


def register_text_env(name: str, factory: TextEnvFactory, *, overwrite: bool = False) -> None:
    """Make ``factory(**config)`` available as ``make_text_env(name, **config)``.

    Registering a name that is already known (registered or declared by an entry point) with a different factory
    raises ``ValueError`` unless ``overwrite=True``; registering the same factory again is a no-op.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"text env name must be a non-empty string, got {name!r}")
    if is_object_path(name):
        raise ValueError(
            f"text env name {name!r} holds ':', which marks a 'module:Class' path; pick another name"
        )
    if not callable(factory):
        raise TypeError(f"factory for text env {name!r} must be callable, got {type(factory).__name__}")
    _REGISTRY.add(name, factory, overwrite=overwrite)


def registered_text_envs() -> list[str]:
    """Every known name, sorted: the built-in envs, registered ones and those declared by installed entry points."""
    return _REGISTRY.names()


def _load_env_path(name: str) -> TextEnvFactory:
    factory = load_object(name, what="text env")
    if isinstance(factory, type) and not issubclass(factory, TextEnv):
        raise ObjectPathError(f"text env {name!r}: {factory.__name__} is a class but not a TextEnv")
    if not callable(factory):
        raise ObjectPathError(
            f"text env {name!r} is a {type(factory).__name__}, not a TextEnv class or factory"
        )
    return factory


def get_text_env_factory(name: str) -> TextEnvFactory:
    """The factory for ``name`` (a registered name, or a ``"module:attribute"`` path); ``ValueError`` naming the
    known names and the closest match when unknown."""
    if is_object_path(name):
        return _load_env_path(name)
    factory = _REGISTRY.lookup(name)
    if factory is not None:
        return factory
    raise ValueError(unknown_text_env_message(name))


def unknown_text_env_message(name: str) -> str:
    """``"unknown text env 'x'; known: ...; did you mean 'y'?"`` (the closest known name, when one is close)."""
    known = registered_text_envs()
    hint = closest_name(str(name), known)
    return (
        f"unknown text env {name!r}; known: {', '.join(known) or 'none'}"
        + (f"; did you mean {hint!r}?" if hint else "")
        + " (an env of your own module is named 'module:Class')"
    )


def is_known_text_env(name: str) -> bool:
    """Whether the plain name ``name`` is known in this process (registered, built in, or declared by an installed
    entry point), importing nothing. A ``"module:attribute"`` path is not a name (False): it is imported on use."""
    if not isinstance(name, str) or is_object_path(name):
        return False
    return name in _REGISTRY or name in _REGISTRY.declared()


def registered_only_here(name: str) -> bool:
    """True when ``name`` was registered in this process with a factory that other processes cannot find (neither
    a built-in env nor an installed entry point declares it): the registry is per process, so such a name must be
    shipped to Ray workers another way (``R3Config.environment`` puts it in Ray Tune's cluster-wide env registry)."""
    factory = _REGISTRY.get(name)
    if factory is None:
        return False
    return _REGISTRY.load_declared(name) is not factory


def make_text_env(name: str, **config: Any) -> TextEnv:
    """Build the text env registered as ``name`` with keyword ``config``."""
    env = get_text_env_factory(name)(**config)
    if not isinstance(env, TextEnv):
        raise TypeError(f"text env {name!r}: factory returned {type(env).__name__}, not a TextEnv")
    return env
