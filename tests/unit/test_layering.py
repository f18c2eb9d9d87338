"""The package's layers: every import inside ``r3_rllib`` (module-level and function-level, relative ones resolved)
goes from a lower layer to a higher one, never the other way and never both ways between two subpackages.

Parsing (``ast``) instead of importing: a deferred import inside a function is a dependency too, and the check must
not need Ray, torch or vLLM. ``importlib.import_module("r3_rllib....")`` with a literal name counts as an import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "r3_rllib"

# Top (imports nothing below it) to bottom. A module imports only from rows above its own, or from its own
# subpackage. Names are the subpackages (folders) and top-level modules of r3_rllib; "__init__" is the package
# root (it imports the algorithm lazily, for Tune). Names not present yet are the planned homes of the layers.
LAYERS: list[set[str]] = [
    {"types"},  # plain data crossing process boundaries (stdlib + numpy)
    {"core"},  # pure numerics: advantages, losses, log-probs, ranking, reflection, registries
    {
        "rewards",
        "models",
        "tools",
    },  # graders; tokenizer, tiny model, named models (a name never trains); sandbox
    # text envs; replay buffer and actor; generation engines; starting the driver's helper actors
    {"envs", "replay", "engines", "actor_start"},
    # the OpenAI-compatible rollout gateway in front of an engine; reward models, judges and their Ray actor pool;
    # the on-policy distillation teacher's actors
    {"gateway", "reward_models", "distill"},
    {"rollout", "r2po"},  # Ray-free rollout loops; R^2PO's rules
    {"config"},  # typed settings and their validation
    {"warmstart"},  # warm-start SFT and the builders of named models made by training
    {"eval"},  # benchmarks and evaluation (builds a named model before evaluating it)
    {"ray_session"},  # starting or joining Ray (token auth kept on); an algorithm built in Python starts it
    {"algorithms"},  # the only Ray/RLlib code
    {
        "train_config",
        "config_reference",
    },  # run files and the config reference, read from the algorithm's config
    {"cli", "__init__"},
]
LAYER_OF = {name: row for row, names in enumerate(LAYERS) for name in names}

# (importing part, imported part) edges that break the layers today and are left to fix; empty when none.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """Whether the dotted ``r3_rllib...`` name is a module or package of the source tree."""
    path = PACKAGE_DIR.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import of the tree, wherever it stands; relative imports resolved and
    ``from pkg import sub`` read as an import of ``pkg.sub`` when ``sub`` is a module."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield node.lineno, sub if source.startswith("r3_rllib") and _is_module(sub) else source
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _part(module: str) -> str:
    """The layer table's name for a module: its subpackage, its top-level module name, or "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_imports() -> list[tuple[str, str, str]]:
    """``(importing part, imported part, "file:line imports module")`` for every import between two parts."""
    edges = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target in sorted(set(_imported_modules(tree, module, path.name == "__init__.py"))):
            if target != "r3_rllib" and not target.startswith("r3_rllib."):
                continue
            here, there = _part(module), _part(target)
            if here != there:
                where = f"{path.relative_to(PACKAGE_DIR.parent)}:{line} imports {target}"
                edges.append((here, there, where))
    return edges


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(_module_name(p)) for p in PACKAGE_DIR.rglob("*.py")}
    missing = sorted(parts - set(LAYER_OF))
    assert not missing, f"place these parts of r3_rllib in LAYERS of {__file__}: {missing}"


def test_no_two_way_imports_between_subpackages():
    edges = package_imports()
    pairs = {(a, b) for a, b, _ in edges}
    both = [
        where
        for a, b, where in edges
        if (b, a) in pairs and (a, b) not in KNOWN_EXCEPTIONS and (b, a) not in KNOWN_EXCEPTIONS
    ]
    assert not both, "two-way imports between parts of r3_rllib:\n" + "\n".join(both)


def test_imports_go_up_the_layers_only():
    bad = [
        f"{where}: {a} (layer {LAYER_OF[a]}) may only import from layers above it, {b} is layer {LAYER_OF[b]}"
        for a, b, where in package_imports()
        if a in LAYER_OF and b in LAYER_OF and LAYER_OF[b] >= LAYER_OF[a] and (a, b) not in KNOWN_EXCEPTIONS
    ]
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_known_exceptions_are_still_needed():
    # An exception that no import needs any more is removed, so that the edge cannot come back unnoticed.
    pairs = {(a, b) for a, b, _ in package_imports()}
    assert not KNOWN_EXCEPTIONS - pairs, f"remove from KNOWN_EXCEPTIONS: {sorted(KNOWN_EXCEPTIONS - pairs)}"


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("def f():\n    from r3_rllib.algorithms.r3 import multistep\n", "r3_rllib.models.hub", "algorithms"),
        ("from ..engines.base import SamplingParams\n", "r3_rllib.models.hub", "engines"),
        ("import importlib\nimportlib.import_module('r3_rllib.eval.plot')\n", "r3_rllib.models.hub", "eval"),
    ],
)
def test_function_level_relative_and_dynamic_imports_are_seen(source, module, expected):
    found = {_part(target) for _, target in _imported_modules(ast.parse(source), module, False)}
    assert expected in found
