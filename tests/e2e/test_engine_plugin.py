"""Adding an engine is its module plus one registration: a package installed here (with pip, into a folder of its
own) declares an engine in the entry-point group ``r3_rllib.engines``; a run names it, its two EnvRunners (fresh
processes that find the entry point themselves) build it and sample with it, and the policy trains.

The engine is the HF engine that writes, per process, how often it generated and loaded weights. The run is a
driver script in a subprocess with the package's folder on its PYTHONPATH, and starts its own Ray instance, whose
workers inherit that path as an installed package's would be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from repo_paths import REPO

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "r3-recording-engine"
version = "0.1.0"

[project.entry-points."r3_rllib.engines"]
recording = "recording_engine.spec:SPEC"

[tool.setuptools]
packages = ["recording_engine"]
"""

# The registration: read by config checks without importing the engine module (nor torch).
SPEC = """
from r3_rllib.engines.registry import EngineCapabilities, EngineSpec

SPEC = EngineSpec(
    name="recording",
    engine_class="recording_engine.engine:RecordingEngine",
    capabilities=EngineCapabilities(exact_entropies=True, partial_rollouts=False, rollout_head=False),
)
"""

ENGINE = """
import json
import os
from pathlib import Path

from r3_rllib.engines.hf_engine import HFEngine


class RecordingEngine(HFEngine):
    def __init__(self, model_path, tokenizer=None, *, record_dir, **kwargs):
        super().__init__(model_path, tokenizer, **kwargs)
        self.record = Path(record_dir) / f"{os.getpid()}.json"
        self.calls = {"generate": 0, "update_weights": 0}
        self.record.write_text(json.dumps(self.calls))

    def generate(self, prompt_ids, n, params):
        out = super().generate(prompt_ids, n, params)
        self.calls["generate"] += 1
        self.record.write_text(json.dumps(self.calls))
        return out

    def update_weights(self, named_tensors, version):
        super().update_weights(named_tensors, version)
        self.calls["update_weights"] += 1
        self.record.write_text(json.dumps(self.calls))
"""

DRIVER = """
import json, os, sys
import ray
from r3_rllib import R3Config

ray.init(num_cpus=4, address="local", include_dashboard=False, log_to_driver=False)
config = (
    R3Config()
    .environment("arithmetic", env_config={"digits": 2, "num_queries": 16})
    .env_runners(num_env_runners=2)
    .learners(num_learners=0)
    .training(
        engine="recording",
        engine_kwargs={"record_dir": sys.argv[1]},
        group_size=4,
        queries_per_iteration=8,
        max_new_tokens=5,
    )
    .debugging(seed=0)
)
algo = config.build_algo()
try:
    before = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
    for _ in range(2):
        algo.train()
    after = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
finally:
    algo.stop()
    ray.shutdown()
print(json.dumps({"driver": os.getpid(), "before": before, "after": after}))
"""


def _install(tmp_path: Path) -> Path:
    """The engine package installed with pip into a folder of its own (the project's environment is left as is)."""
    src = tmp_path / "src"
    (src / "recording_engine").mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "recording_engine" / "__init__.py").write_text("")
    (src / "recording_engine" / "spec.py").write_text(textwrap.dedent(SPEC))
    (src / "recording_engine" / "engine.py").write_text(textwrap.dedent(ENGINE))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(site), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert list(site.glob("r3_recording_engine-*.dist-info/entry_points.txt")), "pip wrote the entry point"
    return site


def test_an_engine_of_an_installed_package_trains_in_the_runners(tmp_path):
    site = _install(tmp_path)
    records = tmp_path / "records"
    records.mkdir()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(records)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    calls = {int(p.stem): json.loads(p.read_text()) for p in records.glob("*.json")}
    assert len(calls) == 2 and result["driver"] not in calls, f"one engine in each of the 2 runners: {calls}"
    assert all(c["generate"] >= 2 and c["update_weights"] >= 1 for c in calls.values()), calls
    assert result["after"] != result["before"], "the update changed the policy"
