"""Named registries of pure functions (advantage estimators, policy losses): a method is an entry, not a rewrite.

A registered function declares, next to its name, which config fields its keyword parameters are read from
(``config_params``: keyword -> config field) and which per-sample fields it needs besides the rewards or log-probs
(``sample_inputs``, e.g. the trajectory ids and observation keys of a multi-step estimator). The trainer then calls
every entry the same way, ``fn(..., **registry.params_from(name, config), **inputs)``, and a new estimator or loss
needs no edit of the loop: one decorated function plus the config value that names it.

An entry may also declare a *batch step* (``batch_fn``, with its own ``batch_config_params``): a function applied
once to the concatenated outputs of every group of a batch after the per-group pass, for methods whose formula
needs batch statistics (e.g. REINFORCE++-baseline's normalisation by the batch std). The trainer applies it
generically when the entry declares one.

Every named thing of the package is an instance of :class:`Registry`: advantage estimators and policy losses
(``core``), replay priorities (``replay``), text environments (``envs``) and named models. Estimators, losses and
text envs may also come from installed packages' entry points (groups ``r3_rllib.advantages``, ``r3_rllib.losses``,
``r3_rllib.text_envs``), loaded on first use; and any registry's lookup takes a ``"module:attribute"`` path
(``"my_pkg.losses:my_loss"``), imported in the process that looks it up. Both reach every process without a
registration run there first; a registration made only in the driver does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from r3_rllib.core.objects import ObjectPathError, is_object_path, load_object

F = TypeVar("F", bound=Callable[..., Any])


class Registry(dict[str, Callable[..., Any]]):
    """``name -> function`` (a dict, so ``in``, ``[]``, ``sorted()`` work), plus what each entry declares."""

    def __init__(
        self, kind: str, *, entry_points: Callable[[], Mapping[str, EntryPoint]] | None = None
    ) -> None:
        """``kind`` names an entry in messages (``"policy loss"``); ``entry_points()``, when given, returns the
        installed entry points that declare more entries (``name -> EntryPoint``), loaded on first use."""
        super().__init__()
        self.kind = kind
        self.config_params: dict[str, dict[str, str]] = {}
        self.sample_inputs: dict[str, tuple[str, ...]] = {}
        self.batch_fns: dict[str, Callable[..., Any]] = {}
        self.batch_config_params: dict[str, dict[str, str]] = {}
        self.batch_sample_inputs: dict[str, tuple[str, ...]] = {}
        #: Old name -> the name that replaced it: looking an old name up says which one to use instead.
        self.renamed: dict[str, str] = {}
        self._entry_points = entry_points

    def register(
        self,
        name: str,
        *,
        config_params: Mapping[str, str] | None = None,
        sample_inputs: tuple[str, ...] = (),
        batch_fn: Callable[..., Any] | None = None,
        batch_config_params: Mapping[str, str] | None = None,
        batch_sample_inputs: tuple[str, ...] = (),
    ) -> Callable[[F], F]:
        """Decorator adding ``fn`` under ``name`` (names are unique). ``config_params`` maps the keyword parameters
        the trainer fills to the config fields they come from; ``sample_inputs`` names per-sample fields passed as
        keyword sequences of the group's length; ``batch_fn`` is an optional batch step (module docstring) whose
        keyword parameters come from ``batch_config_params`` and, as sequences of the batch's length, the
        per-sample fields ``batch_sample_inputs`` names."""
        if batch_fn is None and (batch_config_params or batch_sample_inputs):
            raise ValueError(f"{self.kind} {name!r}: batch parameters given without a batch_fn")

        def deco(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            self.config_params[name] = dict(config_params or {})
            self.sample_inputs[name] = tuple(sample_inputs)
            if batch_fn is not None:
                self.batch_fns[name] = batch_fn
                self.batch_config_params[name] = dict(batch_config_params or {})
                self.batch_sample_inputs[name] = tuple(batch_sample_inputs)
            return fn

        return deco

    def add(self, name: str, fn: Callable[..., Any], *, overwrite: bool = False) -> None:
        """Register ``fn`` under ``name`` without declarations (the non-decorator form). A name already known
        (registered, or declared by an entry point) with another function raises ``ValueError`` unless
        ``overwrite``; adding the same function again is a no-op."""
        if not overwrite:
            existing = self.lookup(name)
            if existing is not None and existing is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({_describe(existing)}); "
                    "pass overwrite=True to replace it"
                )
        if name in self:
            del self[name]
        self.register(name)(fn)

    def declared(self) -> dict[str, EntryPoint]:
        """The installed entry points that declare entries (empty for a registry without entry points)."""
        return dict(self._entry_points()) if self._entry_points is not None else {}

    def names(self) -> list[str]:
        """Every known name, sorted: registered ones and those declared by installed entry points."""
        return sorted(set(self) | set(self.declared()))

    def load_declared(self, name: str) -> Callable[..., Any] | None:
        """The function the entry point ``name`` declares (imported now, not registered), or None without one."""
        ep = self.declared().get(name)
        if ep is None:
            return None
        try:
            fn = ep.load()
        except Exception as exc:  # an installed plugin that fails to import must say which one
            raise ImportError(
                f"{self.kind} {ep.name!r}: cannot load entry point {ep.value!r}: {exc}"
            ) from exc
        if not callable(fn):
            raise TypeError(f"{self.kind} {ep.name!r}: entry point {ep.value!r} is not callable")
        return fn

    def lookup(self, name: str) -> Callable[..., Any] | None:
        """The entry ``name``: registered, loaded (and from then on registered) from its entry point, or, for a
        ``"module:attribute"`` path, imported in this process (:func:`~r3_rllib.core.objects.load_object`: an
        ``ObjectPathError`` names the module or attribute that fails); None when nothing knows it."""
        if name in self:
            return self[name]
        if is_object_path(name):
            fn = load_object(name, what=self.kind)
            if not callable(fn):
                raise ObjectPathError(f"{self.kind} {name!r} is a {type(fn).__name__}, not a function")
        else:
            fn = self.load_declared(name)
            if fn is None:
                return None
        if name not in self:  # importing its module may have registered it under this name already
            self._adopt(name, fn)
        return self[name]

    def _adopt(self, name: str, fn: Callable[..., Any]) -> None:
        """Register ``fn`` under ``name`` with the declarations of the entry already holding it: a function its
        module registers (``@register_loss("mine", config_params=...)``) keeps them when named by path."""
        twin = next((other for other, f in self.items() if f is fn), None)
        if twin is None:
            self.register(name)(fn)
            return
        self.register(
            name,
            config_params=self.config_params.get(twin),
            sample_inputs=self.sample_inputs.get(twin, ()),
            batch_fn=self.batch_fns.get(twin),
            batch_config_params=self.batch_config_params.get(twin),
            batch_sample_inputs=self.batch_sample_inputs.get(twin, ()),
        )(fn)

    def resolves(self, name: object) -> bool:
        """Whether ``name`` names an entry (registered, declared by an entry point, or a path that imports);
        a path that fails to import raises its ``ObjectPathError``."""
        return isinstance(name, str) and self.lookup(name) is not None

    def get_fn(self, name: str) -> Callable[..., Any]:
        fn = self.lookup(name)
        if fn is None:
            if name in self.renamed:
                raise KeyError(f"{self.kind} {name!r} was renamed: use {self.renamed[name]!r}")
            raise KeyError(f"unknown {self.kind} {name!r}; known: {self.names()}")
        return fn

    def params_from(self, name: str, config: Any) -> dict[str, Any]:
        """The keyword arguments entry ``name`` takes from ``config`` (any object with those attributes)."""
        self.get_fn(name)
        missing = [field for field in self.config_params[name].values() if not hasattr(config, field)]
        if missing:
            raise ValueError(f"{self.kind} {name!r} reads config field(s) {missing}, which the config lacks")
        return {kw: getattr(config, field) for kw, field in self.config_params[name].items()}

    def batch_params_from(self, name: str, config: Any) -> dict[str, Any]:
        """The keyword arguments entry ``name``'s batch step takes from ``config`` (empty when it has none)."""
        self.get_fn(name)
        fields = self.batch_config_params.get(name, {})
        missing = [field for field in fields.values() if not hasattr(config, field)]
        if missing:
            raise ValueError(
                f"{self.kind} {name!r}'s batch step reads config field(s) {missing}, which the config lacks"
            )
        return {kw: getattr(config, field) for kw, field in fields.items()}

    def copy(self) -> Registry:
        """A registry of the same kind holding the same entries and declarations (changes to it stay in it)."""
        other = type(self)(self.kind, entry_points=self._entry_points)
        other.update(self)
        for mine, theirs in (
            (self.config_params, other.config_params),
            (self.sample_inputs, other.sample_inputs),
            (self.batch_fns, other.batch_fns),
            (self.batch_config_params, other.batch_config_params),
            (self.batch_sample_inputs, other.batch_sample_inputs),
            (self.renamed, other.renamed),
        ):
            theirs.update(mine)
        return other

    def pop(self, name: str, *default: Any) -> Any:
        """``dict.pop`` that drops the entry's declarations with it."""
        if name in self:
            fn = self[name]
            del self[name]
            return fn
        return super().pop(name, *default)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.config_params.pop(name, None)
        self.sample_inputs.pop(name, None)
        self.batch_fns.pop(name, None)
        self.batch_config_params.pop(name, None)
        self.batch_sample_inputs.pop(name, None)


def entry_point_group(group: str) -> Callable[[], dict[str, EntryPoint]]:
    """``entry_points`` for a :class:`Registry`: the installed entry points of ``group``, read at each use, so a
    package that declares some is found in every process (a learner actor, an env runner) with no code run first."""
    return lambda: {ep.name: ep for ep in entry_points(group=group)}


def _describe(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
