"""Estimators and losses that reach every process: a ``"module:function"`` config value resolves by import in the
process that looks it up, and entry points of the groups ``r3_rllib.advantages`` / ``r3_rllib.losses`` are found
without any code run first. A fresh interpreter (``subprocess``) stands for a learner actor or an env runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.core.advantages import ADVANTAGE_FNS
from r3_rllib.core.losses import LOSS_FNS
from r3_rllib.core.objects import ObjectPathError

HERE = Path(__file__).resolve().parent
ESTIMATOR = "path_plugins:marked_advantages"
LOSS = "path_plugins:marked_reinforce"


def _fresh_python(code: str, *paths: Path) -> dict:
    """Run ``code`` in a new interpreter that imports only r3_rllib (and, through the paths, nothing of this
    test run's registrations); it prints one JSON line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def clean_registries():
    """Path entries (and the loss its module registers) are cached on lookup: drop them after each test."""
    yield
    for registry in (ADVANTAGE_FNS, LOSS_FNS):
        for name in [n for n in registry if n.startswith("path_plugins") or ":" in n or n.startswith("ep_")]:
            del registry[name]


@pytest.mark.slow
def test_a_fresh_process_resolves_paths_with_no_registration():
    out = _fresh_python(
        "import json, sys; from r3_rllib.core.advantages import ADVANTAGE_FNS, compute_group_advantages;"
        "from r3_rllib.core.losses import LOSS_FNS;"
        "from types import SimpleNamespace as NS;"
        f"before = 'path_plugins' in sys.modules or {LOSS!r} in LOSS_FNS;"
        f"adv = compute_group_advantages({ESTIMATOR!r}, [1.0, 0.0, 0.0, 1.0]).tolist();"
        f"params = LOSS_FNS.params_from({LOSS!r}, NS(loss_agg_mode='seq-mean-token-sum'));"
        "print(json.dumps({'before': before, 'adv': adv, 'params': params}))",
        HERE,
    )
    assert out["before"] is False, "nothing of the plugin module was loaded before the lookup"
    assert out["adv"] == [0.375, -0.375, -0.375, 0.375]
    assert out["params"] == {"agg_mode": "seq-mean-token-sum"}, "a path-named loss keeps its declared params"


def test_path_lookup_in_this_process_keeps_declarations(clean_registries):
    fn = LOSS_FNS.get_fn(LOSS)
    assert fn is LOSS_FNS["path_plugins_reinforce"]  # its module registered it under its own name too
    assert LOSS_FNS.config_params[LOSS] == {"agg_mode": "loss_agg_mode"}
    advantages = ADVANTAGE_FNS.get_fn(ESTIMATOR)([0.0, 1.0])
    np.testing.assert_allclose(advantages, [-0.375, 0.375])
    assert ADVANTAGE_FNS.config_params[ESTIMATOR] == {}  # a plain function declares nothing


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "no_such_plugin_mod:fn",
            r"policy loss 'no_such_plugin_mod:fn': cannot import module 'no_such_plugin_mod'",
        ),
        ("path_plugins:nope", r"module 'path_plugins' has no attribute 'nope'"),
        (
            "path_plugins:NOT_A_FUNCTION",
            r"policy loss 'path_plugins:NOT_A_FUNCTION' is a int, not a function",
        ),
        ("path_plugins:", r"expected 'module:attribute'"),
    ],
)
def test_a_bad_path_names_the_module_or_attribute(path, message, clean_registries):
    with pytest.raises(ObjectPathError, match=message):
        LOSS_FNS.get_fn(path)


def test_config_resolves_paths_and_refuses_a_bad_one_early(clean_registries):
    from r3_rllib.config.rules import setting_error

    assert setting_error("advantage_estimator", ESTIMATOR) is None
    assert setting_error("policy_loss", LOSS) is None
    error = setting_error("policy_loss", "no_such_plugin_mod:fn")
    assert error is not None and "cannot import module 'no_such_plugin_mod'" in error
    error = setting_error("advantage_estimator", "path_plugins:nope")
    assert error is not None and "has no attribute 'nope'" in error


@pytest.mark.slow
def test_entry_points_are_found_in_a_fresh_process(tmp_path):
    """A package that declares ``r3_rllib.advantages`` / ``r3_rllib.losses`` entry points (here a dist-info folder
    on the path) is found by name in a new process, with nothing imported or registered first."""
    dist = tmp_path / "my_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[r3_rllib.advantages]\nep_marked = path_plugins:marked_advantages\n\n"
        "[r3_rllib.losses]\nep_reinforce = path_plugins:marked_reinforce\n"
    )
    out = _fresh_python(
        "import json; from r3_rllib.core.advantages import ADVANTAGE_FNS;"
        "from r3_rllib.core.losses import LOSS_FNS;"
        "listed = 'ep_marked' in ADVANTAGE_FNS.names() and 'ep_reinforce' in LOSS_FNS.names();"
        "adv = ADVANTAGE_FNS.get_fn('ep_marked')([2.0, 0.0]).tolist();"
        "fn = LOSS_FNS.get_fn('ep_reinforce');"
        "print(json.dumps({'listed': listed, 'adv': adv, 'loss': fn.__name__,"
        " 'params': LOSS_FNS.config_params['ep_reinforce']}))",
        HERE,
        tmp_path,
    )
    assert out == {
        "listed": True,
        "adv": [0.375, -0.375],
        "loss": "marked_reinforce",
        "params": {"agg_mode": "loss_agg_mode"},
    }


def test_the_driver_refuses_a_bad_path_once_at_validation(clean_registries):
    from r3_rllib import R3Config

    config = R3Config().training(policy_loss="no_such_plugin_mod:fn", advantage_estimator=ESTIMATOR)
    with pytest.raises(ValueError, match="cannot import module 'no_such_plugin_mod'") as caught:
        config.validate()
    assert str(caught.value).count("no_such_plugin_mod") == 2  # the path and its module, in one message
