"""Named models: a name resolves to its cached folder and never trains; a builder in ``warmstart`` makes the folder,
and the entry points that used to build on resolution (``r3 eval``, ``r3 build-model``) build first."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from r3_rllib.cli import main as cli_main
from r3_rllib.models import hub, smollm2
from r3_rllib.warmstart import named

NAME = hub.GRIDWORLD_TINY_SFT


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty named-model cache, and a builder for the gridworld warm start that writes a stand-in folder."""
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    calls: list[str] = []

    def fake_build() -> Path:
        folder = hub.named_model_folder(NAME)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        calls.append(NAME)
        return folder

    monkeypatch.setitem(named.NAMED_MODEL_BUILDERS, NAME, fake_build)
    return tmp_path / "cache"


def test_a_name_resolves_without_training_and_says_how_to_build(cache, monkeypatch):
    from r3_rllib.warmstart import gridworld

    monkeypatch.setattr(
        gridworld, "build_warm_start", lambda *a, **k: pytest.fail("resolving must not train")
    )
    with pytest.raises(hub.NamedModelNotBuiltError, match=f"r3 build-model {NAME}") as err:
        hub.resolve_model_path(NAME)
    assert isinstance(err.value, FileNotFoundError) and str(hub.named_model_folder(NAME)) in str(err.value)
    assert NAME in hub.named_models()


def test_build_then_resolve(cache):
    folder = named.build_named_model(NAME)
    assert folder == hub.named_model_folder(NAME) and folder.is_relative_to(cache)
    assert hub.resolve_model_path(NAME) == folder == named.build_model_path(NAME)
    assert hub.policy_path(NAME) == str(folder)
    with pytest.raises(ValueError, match="unknown named model"):
        named.build_named_model("no-such-model")


def test_build_named_models_skips_folders_hub_names_and_none(cache, tmp_path, monkeypatch):
    built: list[str] = []
    monkeypatch.setattr(named, "build_named_model", built.append)
    local = tmp_path / "policy"
    local.mkdir()
    named.build_named_models([None, str(local), "org/model", NAME, NAME])
    assert built == [NAME]
    # A local folder of the same name wins over the named model, as in resolution.
    (tmp_path / NAME).mkdir()
    monkeypatch.chdir(tmp_path)
    named.build_named_models([NAME])
    assert built == [NAME]


def test_registering_a_model_and_its_builder(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "NAMED_MODELS", type(hub.NAMED_MODELS)("named model"))
    monkeypatch.setattr(
        named, "NAMED_MODEL_BUILDERS", type(named.NAMED_MODEL_BUILDERS)("named model builder")
    )
    folder = tmp_path / "mine"
    hub.register_named_model("mine", lambda: hub.built_folder("mine"))
    named.register_named_model_builder("mine", lambda: folder)
    assert named.build_named_model("mine") == folder
    with pytest.raises(ValueError, match="already has a builder"):
        named.register_named_model_builder("mine", lambda: tmp_path)
    named.register_named_model_builder("mine", lambda: tmp_path, overwrite=True)
    assert named.build_named_model("mine") == tmp_path
    with pytest.raises(ValueError, match="already registered"):
        hub.register_named_model("mine", lambda: tmp_path)
    hub.register_named_model("mine", lambda: tmp_path, overwrite=True)
    assert hub.resolve_model_path("mine") == tmp_path


def test_cli_build_model(cache, capsys):
    assert cli_main(["build-model", NAME]) == 0
    assert capsys.readouterr().out.strip() == str(hub.named_model_folder(NAME))
    assert cli_main(["build-model", "no-such-model"]) == 2
    assert "unknown named model" in capsys.readouterr().err


def test_r3_eval_builds_a_named_model_before_resolving_it(cache, monkeypatch, capsys):
    from r3_rllib.eval.evaluate import add_eval_args, run_eval

    def not_built() -> Path:
        raise hub.NamedModelNotBuiltError("builder ran; nothing written")

    monkeypatch.setitem(named.NAMED_MODEL_BUILDERS, NAME, not_built)
    args = add_eval_args(argparse.ArgumentParser()).parse_args(["--model", NAME])
    assert run_eval(args, engine_factory=lambda *a, **k: pytest.fail("no engine")) == 2
    assert "builder ran" in capsys.readouterr().err


def test_a_model_folder_under_home_written_with_a_tilde_resolves(tmp_path, monkeypatch):
    """`model_path: ~/models/x` (a config built in code keeps the `~`) is the folder under $HOME, not a hub name."""
    folder = tmp_path / "models" / "x"
    folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.resolve_model_path("~/models/x") == folder
    with pytest.raises(FileNotFoundError, match="no model folder"):
        hub.resolve_model_path("~/models/missing/y")
