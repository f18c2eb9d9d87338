"""The config saved in every algorithm checkpoint (``r3_config.json``) and the config ``R3.from_checkpoint`` rebuilds
from it: data only, checked against the manifest, code it names refused unless trusted, overrides over it, and this
r3_rllib's rules applied with the checkpoint named. (The whole rebuild in a new process:
tests/e2e/test_distributed_and_checkpoint.py::test_checkpoint_restores_in_new_process_and_continues.)"""

from __future__ import annotations

import json

import pytest
from ray.rllib.callbacks.callbacks import RLlibCallback

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import learner_faults, learner_state
from r3_rllib.algorithms.r3.checkpoint_config import (
    CONFIG_FILE,
    CheckpointConfigError,
    code_names,
    config_from_checkpoint,
    config_record,
    model_mismatch_message,
    read_checkpoint_config,
    write_checkpoint_config,
)
from r3_rllib.algorithms.r3.checkpoint_files import CorruptCheckpointError, build_manifest, write_manifest
from r3_rllib.config import rules


class MyCallbacks(RLlibCallback):
    """A callbacks class: code, which a checkpoint does not save."""


def _config(**training) -> R3Config:
    return (
        R3Config.r3_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 64})
        .env_runners(num_env_runners=2)
        .training(
            model_path="/models/tiny", group_size=4, queries_per_iteration=8, lr=[[0, 1e-3], [512, 1e-4]]
        )
        .training(**training)
    )


def _checkpoint(tmp_path, config: R3Config | None = None, record: dict | None = None) -> str:
    """A checkpoint folder holding the saved config (of `config`, or `record` as written) and its manifest."""
    folder = tmp_path / "checkpoint_000001"
    folder.mkdir()
    (folder / "r3_state.pkl").write_bytes(b"state")
    if record is not None:
        (folder / CONFIG_FILE).write_text(json.dumps(record))
    else:
        write_checkpoint_config(str(folder), config or _config())
    write_manifest(str(folder), build_manifest(str(folder), {"iteration": 1}))
    return str(folder)


def test_every_data_setting_is_saved_and_code_is_named_not_saved():
    config = _config().callbacks(MyCallbacks)
    record = config_record(config)
    settings = record["settings"]
    assert settings["env_config"] == {"digits": 2, "num_queries": 64} and settings["num_env_runners"] == 2
    assert settings["lr"] == [[0, 1e-3], [512, 1e-4]] and settings["replay"] is True
    # RLlib's callbacks class held code; a default class (the runner's) or the algorithm class is not listed.
    assert record["unsaved"] == ["callbacks"] and "callbacks" not in settings and "class" not in settings
    assert config_record(_config())["unsaved"] == []
    assert json.loads(json.dumps(record)) == record


def test_numpy_scalars_are_saved_as_the_numbers_they_hold():
    """A sweep's draw (np.float64, np.int64) is data, saved as a JSON number, not listed as code."""
    import numpy as np

    config = _config(lr=np.float64(3e-4), group_size=np.int64(6))
    record = config_record(config.environment(env_config={"digits": np.int64(3)}))
    assert record["unsaved"] == []
    assert record["settings"]["lr"] == 3e-4 and type(record["settings"]["lr"]) is float
    assert record["settings"]["group_size"] == 6 and record["settings"]["env_config"]["digits"] == 3


def test_the_rebuilt_config_has_the_saved_settings_and_the_overrides(tmp_path):
    path = _checkpoint(tmp_path)
    rebuilt = config_from_checkpoint(R3Config, path, {"num_env_runners": 1, "group_size": 8})
    original = _config()
    original.validate()  # as the rebuilt one was (validate() derives some of RLlib's settings)
    differing = {k for k, v in rebuilt.to_dict().items() if v != original.to_dict()[k]}
    assert differing == {"num_env_runners", "group_size"}
    assert rebuilt.num_env_runners == 1 and rebuilt.group_size == 8 and rebuilt.lr == [[0, 1e-3], [512, 1e-4]]


def test_an_override_that_names_no_setting_is_refused(tmp_path):
    """update_from_dict would keep the typo as a stray attribute and run with the saved value."""
    path = _checkpoint(tmp_path)
    with pytest.raises(
        CheckpointConfigError, match=r"no setting named 'num_env_runner'; did you mean 'num_env_runners'"
    ):
        config_from_checkpoint(R3Config, path, {"num_env_runner": 1})


def test_settings_that_held_code_must_be_given_again(tmp_path):
    path = _checkpoint(tmp_path, _config().callbacks(MyCallbacks))
    with pytest.raises(
        CheckpointConfigError, match=r"callbacks held code .* config_overrides=\{'callbacks': ...\}"
    ):
        config_from_checkpoint(R3Config, path)
    assert config_from_checkpoint(R3Config, path, {"callbacks": MyCallbacks}).callbacks_class is MyCallbacks


def test_code_named_by_path_is_refused_unless_trusted_or_overridden(tmp_path):
    """A checkpoint from elsewhere could name any importable function, with its arguments among the options."""
    config = _config().environment("subprocess:run", env_config={"args": ["touch", "/tmp/x"], "shell": False})
    path = _checkpoint(tmp_path, config)
    with pytest.raises(CheckpointConfigError, match=r"env = 'subprocess:run'.*trust_object_paths=True"):
        config_from_checkpoint(R3Config, path)
    overridden = config_from_checkpoint(R3Config, path, {"env": "arithmetic", "env_config": {"digits": 2}})
    assert overridden.env == "arithmetic"
    # Trusted, the path is taken as saved (validate() leaves an env the driver cannot check to the runners).
    assert config_from_checkpoint(R3Config, path, trust_object_paths=True).env == "subprocess:run"


def test_which_values_name_code():
    settings = {
        "env": "my_pkg.envs:MathEnv",
        "env_config": {
            "reward": "my_pkg.rewards:exact",
            "prompt": "Question: {q}\nAnswer:",
            "url": "http://x:80",
        },
        "reward_models": [{"kind": "rule", "fn": "rules:length"}],
        "engine_kwargs": {"trust_remote_code": True},
        "reflection_template": "Hint:{hint}",
        "model_path": "/models/tiny",
    }
    assert dict(code_names(settings)) == {
        "env": "my_pkg.envs:MathEnv",
        "env_config.reward": "my_pkg.rewards:exact",
        "reward_models.0.fn": "rules:length",
        "engine_kwargs.trust_remote_code": True,
    }


def test_a_rule_added_since_names_the_checkpoint_and_the_way_out(tmp_path, monkeypatch):
    path = _checkpoint(tmp_path)

    def newer_rule(config):
        return "training.group_size: this version wants at least 8" if config.group_size < 8 else None

    monkeypatch.setattr(rules, "CROSS_FIELD_RULES", (*rules.CROSS_FIELD_RULES, newer_rule))
    with pytest.raises(
        CheckpointConfigError, match=r"r3_config.json: this r3_rllib refuses the saved config"
    ) as e:
        config_from_checkpoint(R3Config, path)
    assert "wants at least 8" in str(e.value) and "config_overrides" in str(e.value)
    assert config_from_checkpoint(R3Config, path, {"group_size": 8}).group_size == 8


def test_a_setting_saved_under_its_former_name_is_read_under_its_new_one(tmp_path):
    """replay_max_staleness became replay_max_age (config/settings.py RENAMED_FIELDS): a checkpoint of the old
    name restores under the new one, with the rename's warning."""
    record = config_record(_config(replay_max_age=7))
    record["settings"]["replay_max_staleness"] = record["settings"].pop("replay_max_age")
    path = _checkpoint(tmp_path, record=record)
    with pytest.warns(FutureWarning, match="replay_max_staleness"):
        rebuilt = config_from_checkpoint(R3Config, path)
    assert rebuilt.replay_max_age == 7


def test_a_checkpoint_without_a_saved_config_says_how_to_restore_it(tmp_path):
    folder = tmp_path / "checkpoint_000001"
    folder.mkdir()
    (folder / "r3_state.pkl").write_bytes(b"state")
    write_manifest(str(folder), build_manifest(str(folder), {"iteration": 1}))
    with pytest.raises(CheckpointConfigError, match=r"holds no saved config .*algo.restore\("):
        read_checkpoint_config(str(folder))


@pytest.mark.parametrize("damage", ["changed", "not json", "not a record"])
def test_a_changed_or_damaged_saved_config_is_refused(tmp_path, damage):
    path = _checkpoint(tmp_path)
    saved = tmp_path / "checkpoint_000001" / CONFIG_FILE
    if damage == "changed":
        saved.write_text(saved.read_text().replace('"group_size": 4', '"group_size": 5'))
        match = "differs from the checkpoint's manifest"
    else:
        saved.write_text("{not json" if damage == "not json" else json.dumps({"format_version": 1}))
        write_manifest(path, build_manifest(path, {"iteration": 1}))
        match = "not a saved config"
    with pytest.raises(CorruptCheckpointError, match=match):
        read_checkpoint_config(path)


def test_the_learner_death_hint_names_ways_that_work():
    assert "R3.from_checkpoint(path)" in learner_faults.RESUME_HINT and "restore_from_path" not in (
        learner_faults.RESUME_HINT
    )


def test_rllibs_checkpointable_calls_refuse_what_our_format_does_not_hold():
    """save_to_path / restore_from_path lead to save / restore (the whole algorithm, a local folder): a partial
    state, a component or another file system is refused before anything is touched."""
    from r3_rllib.algorithms.r3.checkpointing import R3Checkpoints

    untouched = object()  # no attribute of an algorithm: any use of it would fail otherwise
    with pytest.raises(ValueError, match="pass only the path"):
        R3Checkpoints.save_to_path(untouched, "ckpt", state={"learner": {}})
    with pytest.raises(ValueError, match="whole R3 checkpoint"):
        R3Checkpoints.restore_from_path(untouched, "ckpt", component="learner_group")
    with pytest.raises(ValueError, match="local folder"):
        R3Checkpoints.from_checkpoint("ckpt", filesystem=object())


def test_resume_from_checkpoint_is_checked_before_ray_and_not_carried_into_a_rebuild(tmp_path):
    """A run started from an earlier checkpoint saves that setting too; its own checkpoint already holds the state,
    so R3.from_checkpoint builds without it (the earlier folder may be gone)."""
    from r3_rllib.train_config import load_run_file

    missing = tmp_path / "gone"
    with pytest.raises(ValueError, match=r"resume_from_checkpoint: no folder .*gone"):
        _config(resume_from_checkpoint=str(missing)).validate()
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    path = _checkpoint(tmp_path, _config(resume_from_checkpoint=str(earlier)))
    earlier.rmdir()
    assert config_from_checkpoint(R3Config, path).resume_from_checkpoint is None
    run_file = tmp_path / "longer.yaml"
    run_file.write_text(f"training:\n  resume_from_checkpoint: {path}\nstop:\n  training_iteration: 60\n")
    assert load_run_file(str(run_file)).config.resume_from_checkpoint == path


def test_a_relative_resume_path_is_made_absolute_where_it_is_set(tmp_path, monkeypatch):
    """`--set training.resume_from_checkpoint=runs/<name>/<trial>` names a folder below the working folder; the Tune
    trial that restores it runs in its own folder, so the driver's config holds the absolute path."""
    (tmp_path / "runs" / "x" / "t").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config = _config(resume_from_checkpoint="runs/x/t")
    assert config.resume_from_checkpoint == str(tmp_path / "runs" / "x" / "t")
    assert (
        R3Config().update_from_dict(config.to_dict()).resume_from_checkpoint == config.resume_from_checkpoint
    )


def test_a_checkpoint_is_found_as_r3_export_finds_it(tmp_path):
    """R3.from_checkpoint and resume_from_checkpoint take what r3 export and r3 eval take: a checkpoint, a trial's
    folder (its newest complete checkpoint) or an experiment's folder with one trial; a folder of two trials is
    refused, naming them."""
    from r3_rllib.algorithms.r3.checkpoint_config import checkpoint_folder
    from r3_rllib.algorithms.r3.export import ExportError

    trial = tmp_path / "runs" / "tiny" / "grpo_0"
    trial.mkdir(parents=True)
    for index in (1, 2):
        (trial / f"checkpoint_00000{index}").mkdir()
        (trial / f"checkpoint_00000{index}" / "r3_state.pkl").write_bytes(b"state")
        write_manifest(
            str(trial / f"checkpoint_00000{index}"), build_manifest(str(trial / f"checkpoint_00000{index}"))
        )
    (trial / "checkpoint_000003").mkdir()  # a save that did not finish (no manifest): skipped
    newest = str(trial / "checkpoint_000002")
    assert checkpoint_folder(trial) == newest and checkpoint_folder(trial.parent) == newest
    assert checkpoint_folder(trial / "checkpoint_000001") == str(trial / "checkpoint_000001")
    (trial.parent / "grpo_1" / "checkpoint_000000").mkdir(parents=True)
    with pytest.raises(ExportError, match="holds 2 trials"):
        checkpoint_folder(trial.parent)


def test_model_tensors_that_differ_are_named_by_kind():
    """Hand-built name -> shape maps: a reshaped tensor, one the checkpoint lacks and one only it has, each counted
    and named (at most `shown` names, then how many more); the same maps match."""
    here = {"embed.weight": (32, 8), "head.weight": (32, 8), "lora_A": (4, 8)}
    assert learner_state.model_state_mismatch(here, dict(here)) is None
    saved = {"embed.weight": (64, 8), "head.weight": (32, 8), "lora_B": (8, 4), "norm.weight": (8,)}
    assert learner_state.model_state_mismatch(saved, here) == (
        "of 3 model tensors here, 1 of another shape (embed.weight saved [64, 8], here [32, 8]); "
        "1 not in the checkpoint (lora_A); 2 only in the checkpoint (lora_B, norm.weight)"
    )
    assert learner_state.model_state_mismatch(saved, here, shown=1).endswith("(lora_B, ... (1 more))")


def test_the_model_mismatch_names_the_settings_that_differ(tmp_path):
    folder = _checkpoint(tmp_path, _config(lora_rank=8))
    message = model_mismatch_message(folder, "of 2 model tensors here, ...", _config(lora_rank=4))
    assert message.startswith(
        f"{folder} holds weights that do not fit this run's model: of 2 model tensors here"
    )
    assert "Its settings: lora_rank=8 there, 4 here." in message and "model_path=" not in message
    moved = model_mismatch_message(folder, "...", _config(lora_rank=8, model_path="/elsewhere/tiny"))
    assert "model_path='/models/tiny' there, '/elsewhere/tiny' here" in moved
    (tmp_path / "old").mkdir()  # a checkpoint without a saved config: the tensors alone
    assert "Its settings" not in model_mismatch_message(str(tmp_path / "old"), "...", _config())
