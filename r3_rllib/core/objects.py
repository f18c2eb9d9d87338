"""``"package.module:attribute"`` paths: naming a function or class of the user's own module in a config value,
imported where the value is used (a learner actor, an env runner, the driver), so nothing has to be registered in
each process first. Text envs, reward functions, advantage estimators, policy losses and replay priorities accept
such a path wherever they accept a registered name.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from r3_rllib.core.typo_hints import closest_name


class ObjectPathError(ValueError):
    """A ``"module:attribute"`` path that names nothing usable; the message names the module or attribute."""


def is_object_path(name: object) -> bool:
    """Whether ``name`` is written ``"module:attribute"`` (registered names hold no colon)."""
    return isinstance(name, str) and ":" in name


def _import_module(module_name: str, path: str, what: str) -> Any:
    """``module_name`` imported; not found on ``sys.path``, it is looked for in the current directory too (Ray adds
    the driver's current directory to its workers' paths; ``r3`` run as a console script does not have it)."""
    module = _try_import(module_name, path, what)
    cwd = os.getcwd()
    if module is None and cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
        importlib.invalidate_caches()
        module = _try_import(module_name, path, what)
    if module is None:
        raise ObjectPathError(
            f"{what} {path!r}: cannot import module {module_name!r}: not found; it must be importable where the "
            f"name is resolved: an installed package, a module in the current directory ({cwd}) or on PYTHONPATH"
        )
    return module


def _try_import(module_name: str, path: str, what: str) -> Any:
    """The module, or None when it is not found; an error raised while importing it is an ObjectPathError."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        failure = exc  # the module was found; something it imports was not
    except Exception as exc:  # a syntax error or an exception at the module's top level
        failure = exc
    raise ObjectPathError(
        f"{what} {path!r}: importing module {module_name!r} failed: {type(failure).__name__}: {failure}"
    ) from failure


def load_object(path: str, *, what: str = "object") -> Any:
    """The object ``"package.module:attribute"`` names (the attribute may be dotted: ``"mod:Class.method"``),
    imported now; ``what`` names it in errors (``"text env"``, ``"reward"``). An :class:`ObjectPathError` (a
    ``ValueError``) names the malformed path, the module that cannot be imported, or the missing attribute."""
    module_name, _, attr = path.partition(":")
    if not module_name.strip() or not attr.strip() or ":" in attr:
        raise ObjectPathError(
            f"{what} {path!r}: expected 'module:attribute', e.g. 'my_tasks:MyEnv' or 'my_pkg.rewards:exact_match'"
        )
    obj = _import_module(module_name, path, what)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            hint = closest_name(part, names)
            raise ObjectPathError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
            ) from None
    return obj
