"""Importing r3_rllib is cheap and Ray-free for the pure parts, and still makes "R3" a Tune trainable name."""

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": ""},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_pure_parts_do_not_import_ray():
    code = (
        "import sys, r3_rllib, r3_rllib.envs, r3_rllib.core, r3_rllib.rewards\n"
        "print(sorted(m for m in ('ray', 'ray.rllib', 'ray.tune') if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_tune_resolves_r3_after_import():
    code = (
        "import sys, r3_rllib\n"
        "assert 'ray.rllib' not in sys.modules\n"
        "from ray.tune.registry import get_trainable_cls\n"
        "print(get_trainable_cls('R3').__name__)\n"
        "print('ray.rllib.algorithms.dreamerv3' in sys.modules)"
    )
    # Tune resolved "R3" without importing every RLlib algorithm (DreamerV3's import prints gymnasium warnings).
    assert _run(code).splitlines()[-2:] == ["R3", "False"]
