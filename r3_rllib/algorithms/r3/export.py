"""``r3 export RUN_DIR [--checkpoint N] --out DIR``: a Hugging Face folder of the policy in a Tune checkpoint of a run,
read from the checkpoint's own files: no algorithm is built, Ray is not started, and nothing in the checkpoint can
run code (every file is checked against its manifest's sha256 first, DCP's pickled metadata is read with the
allow-list of safe_pickle.py, r3_state.pkl likewise).

``RUN_DIR`` is an experiment folder (``runs/<name>``, with one trial), a trial folder or a checkpoint folder; the
checkpoint is the newest complete one, or ``checkpoint_<N>`` with ``--checkpoint N`` (Tune's index, as in the
folder's name). The folder holds:

- the policy (``config.json``, ``model.safetensors``, ``generation_config.json``): the base model's architecture
  with the checkpoint's weights; R^2PO: the inference policy, without the rollout head. LoRA (``lora_rank > 0``):
  the adapter merged into the base weights, and ``lora_adapter/`` the adapter alone (``PeftModel.from_pretrained``);
- the tokenizer, loadable with plain ``AutoTokenizer.from_pretrained`` (the tiny model's character tokenizer as
  r3_rllib/models/tiny.py's portable form);
- ``README.md``, a model card: base model, method, data/env, settings and the run's final metrics (model_card.py).

Every file is readable by all (0644, folders 0755). The folder is written under a temporary name beside ``DIR``
and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3_rllib.algorithms.r3.checkpoint import (
    LEARNER_DIR,
    R3_STATE_FILE,
    CheckpointFormatError,
    newest_complete_checkpoint,
    read_algorithm_state,
    verify_algorithm_checkpoint,
)
from r3_rllib.algorithms.r3.checkpoint_files import CHECKPOINT_DIR, MANIFEST_FILE, trial_checkpoints

#: Tune's copy of a trial's config, beside its checkpoints.
PARAMS_FILE = "params.json"
FILE_MODE = 0o644
DIR_MODE = 0o755
DTYPES = ("auto", "float32", "bfloat16", "float16")


class ExportError(ValueError):
    """A run folder, checkpoint or output folder that cannot give an export; the message says which and why."""


@dataclass(frozen=True)
class CheckpointSource:
    """The checkpoint an export reads: its trial, its folder, the iteration it holds and the run's settings (the
    checkpoint's R3 settings over the trial's params.json)."""

    trial_dir: str
    checkpoint_dir: str
    iteration: int | None
    settings: dict[str, Any]


def find_checkpoint(
    run_dir: str | os.PathLike, index: int | None = None, *, verify: bool = True, who: str = "r3 export"
) -> tuple[str, str]:
    """(trial folder, checkpoint folder) of ``run_dir`` (an experiment, a trial or a checkpoint folder): the
    trial's newest complete checkpoint, or ``checkpoint_<index>`` verified against its manifest. ``verify=False``
    checks the files' presence and sizes only, hashing none (for a restore, which hashes them: a multi-GB checkpoint
    is read once); ``who`` names the caller in the note on a newer checkpoint skipped."""
    run_dir = os.path.abspath(os.fspath(run_dir))
    if not os.path.isdir(run_dir):
        raise ExportError(f"no run folder at {run_dir}")
    if _is_checkpoint(run_dir):
        if index is not None:
            raise ExportError(f"{run_dir} is a checkpoint folder: --checkpoint picks one of a trial's")
        return os.path.dirname(run_dir), _verified(run_dir) if verify else run_dir
    trial = run_dir if _is_trial(run_dir) else _only_trial(run_dir)
    if index is not None:
        path = os.path.join(trial, f"checkpoint_{index:06d}")
        if not os.path.isdir(path):
            found = ", ".join(os.path.basename(p) for _, p in reversed(trial_checkpoints(trial))) or "none"
            raise ExportError(f"no checkpoint {index} in {trial} (its checkpoints: {found})")
        return trial, _verified(path)
    choice = newest_complete_checkpoint(trial, set_aside=False, hashes=verify)
    if choice.path is None:
        reasons = "; ".join(choice.refused) or "it has none"
        raise ExportError(f"no complete checkpoint in {trial} ({reasons})")
    for reason in choice.refused:
        print(f"{who}: skipped a newer checkpoint: {reason}", file=sys.stderr)
    return trial, choice.path


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder of a run of ours (an experiment of Tune trials, a trial, or a checkpoint), which
    :func:`find_checkpoint` takes, rather than a model folder."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if _is_checkpoint(path) or _is_trial(path):
        return True
    return any(_is_trial(os.path.join(path, n)) for n in os.listdir(path))


def _is_checkpoint(path: str) -> bool:
    """A checkpoint folder: Tune's ``checkpoint_NNNNNN`` or any folder ``Algorithm.save`` wrote."""
    has_files = any(os.path.isfile(os.path.join(path, n)) for n in (R3_STATE_FILE, MANIFEST_FILE))
    return has_files or bool(CHECKPOINT_DIR.match(os.path.basename(path)))


def _is_trial(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    return os.path.isfile(os.path.join(path, PARAMS_FILE)) or bool(trial_checkpoints(path))


def _only_trial(exp_dir: str) -> str:
    trials = sorted(
        os.path.join(exp_dir, n) for n in os.listdir(exp_dir) if _is_trial(os.path.join(exp_dir, n))
    )
    if not trials:
        raise ExportError(f"{exp_dir} holds no Tune trial (a folder with {PARAMS_FILE} or checkpoint_*)")
    if len(trials) > 1:
        names = ", ".join(os.path.basename(t) for t in trials)
        raise ExportError(f"{exp_dir} holds {len(trials)} trials ({names}): name the trial's folder")
    return trials[0]


def _verified(checkpoint_dir: str) -> str:
    try:
        verify_algorithm_checkpoint(checkpoint_dir)
    except CheckpointFormatError as e:
        raise ExportError(f"checkpoint refused: {e}") from e
    return checkpoint_dir


def checkpoint_source(run_dir: str | os.PathLike, index: int | None = None) -> CheckpointSource:
    """The checkpoint of ``run_dir`` (:func:`find_checkpoint`) with its iteration and the run's settings."""
    trial, path = find_checkpoint(run_dir, index)
    try:
        state = read_algorithm_state(path)
    except CheckpointFormatError as e:
        raise ExportError(f"checkpoint refused: {e}") from e
    settings: dict[str, Any] = {}
    params = os.path.join(trial, PARAMS_FILE)
    if os.path.isfile(params):
        with open(params) as f:
            settings.update(json.load(f))
    settings.update(state.r3_settings or {})
    return CheckpointSource(trial, path, state.iteration, settings)


def read_policy_state(checkpoint_dir: str) -> dict[str, Any]:
    """The policy's tensors (the learner's ``policy.state_dict()`` names, unsharded) from the checkpoint's DCP
    folder, read in this process without a process group. LoRA checkpoints hold the adapter's tensors only."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from r3_rllib.algorithms.r3.safe_pickle import check_dcp_metadata

    dcp_dir = os.path.join(checkpoint_dir, LEARNER_DIR)
    check_dcp_metadata(dcp_dir)  # before DCP unpickles it: data only
    reader = FileSystemReader(dcp_dir)
    metadata = reader.read_metadata()
    template = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        path = (metadata.planner_data or {}).get(fqn)
        if path and len(path) == 2 and path[0] == "model" and isinstance(entry, TensorStorageMetadata):
            template[path[1]] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not template:
        raise ExportError(f"{dcp_dir}: no policy tensors in the checkpoint")
    state = {"model": template}
    with warnings.catch_warnings():  # one process on purpose: DCP's notice that it assumes so is no news
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        load(state, storage_reader=reader, no_dist=True)
    return state["model"]


def export_run(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    checkpoint: int | None = None,
    dtype: str = "auto",
) -> Path:
    """Write the Hugging Face folder ``out`` from a checkpoint of ``run_dir`` (see the module docstring); return
    its path. ``dtype``: the saved weights' ('auto': the base model's)."""
    out = Path(out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty folder: name a new one")
    source = checkpoint_source(run_dir, checkpoint)
    tmp = out.with_name(f".{out.name}.tmp-r3")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_export(source, tmp, dtype)
        make_readable(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_export(source: CheckpointSource, path: Path, dtype: str) -> None:
    from r3_rllib.algorithms.r3.model_card import write_model_card
    from r3_rllib.models.hub import policy_path
    from r3_rllib.models.tiny import load_tokenizer, save_portable_tokenizer
    from r3_rllib.warmstart import build_named_models

    settings = source.settings
    model_path, tokenizer_path = settings.get("model_path"), settings.get("tokenizer_path")
    build_named_models([model_path, tokenizer_path])  # a named model resolves only once built
    base = policy_path(model_path)
    state = read_policy_state(source.checkpoint_dir)
    if int(settings.get("lora_rank") or 0) > 0:
        _save_lora(base, state, settings, path, dtype)
    else:
        _save_full(base, state, path, dtype)
    save_portable_tokenizer(load_tokenizer(policy_path(tokenizer_path or model_path)), path)
    write_model_card(path, source, base_model=model_path)


def _target_dtype(dtype: str, config: Any):
    import torch

    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if dtype != "auto":
        return getattr(torch, dtype)
    found = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(found, str):
        found = getattr(torch, found, None)
    return found if isinstance(found, torch.dtype) and found.is_floating_point else torch.float32


def _save_full(base: str, state: dict[str, Any], path: Path, dtype: str) -> None:
    """The base model's architecture with the checkpoint's weights (a rollout head left out)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from r3_rllib.models.rollout_head import split_rollout_head_state

    config = AutoConfig.from_pretrained(base)
    state, _head = split_rollout_head_state(state)
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ExportError(
            f"the checkpoint's policy does not match {base}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    _copy_generation_config(base, model)
    model.to(_target_dtype(dtype, config)).save_pretrained(str(path), safe_serialization=True)


def _save_lora(base: str, state: dict[str, Any], settings: dict[str, Any], path: Path, dtype: str) -> None:
    """LoRA: the base with the checkpoint's adapter, merged into ``path`` and alone in ``path/lora_adapter``."""
    import torch
    from transformers import AutoModelForCausalLM

    from r3_rllib.models.lora import ADAPTER_DIR, add_lora
    from r3_rllib.models.progress_bars import no_progress_bars

    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = add_lora(
        model,
        int(settings["lora_rank"]),
        float(settings.get("lora_alpha", 16.0)),
        0.0,
        settings.get("lora_target_modules") or "all-linear",
    )
    adapter = {k: v for k, v in state.items() if "lora_" in k}
    missing, unexpected = model.load_state_dict(adapter, strict=False)
    missing = [k for k in missing if "lora_" in k]
    if not adapter or missing or unexpected:
        raise ExportError(
            f"the checkpoint's adapter does not match {base} with lora_rank={settings['lora_rank']}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    peft_model.peft_config["default"].base_model_name_or_path = str(settings.get("model_path") or base)
    peft_model.save_pretrained(str(path / ADAPTER_DIR))
    merged = peft_model.merge_and_unload()
    merged.to(_target_dtype(dtype, merged.config)).save_pretrained(str(path), safe_serialization=True)


def _copy_generation_config(base: str, model: Any) -> None:
    from transformers import GenerationConfig

    try:
        model.generation_config = GenerationConfig.from_pretrained(base)
    except OSError:  # the base has none: the one from_config derived stays
        pass


def make_readable(path: str | os.PathLike) -> None:
    """Files under ``path`` 0644, folders 0755 (an export is for others to read: safetensors' own files are 0600
    where the writing process's umask allows no more)."""
    os.chmod(path, DIR_MODE)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), DIR_MODE)
        for name in files:
            os.chmod(os.path.join(root, name), FILE_MODE)


def add_export_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "run_dir", help="experiment folder (runs/NAME, one trial), trial folder or checkpoint"
    )
    parser.add_argument("--out", required=True, help="the folder to write (new, or empty)")
    parser.add_argument(
        "--checkpoint",
        type=int,
        default=None,
        metavar="N",
        help="Tune's checkpoint index (checkpoint_00000N); default: the newest complete checkpoint",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="dtype of the saved weights (auto: the base model's)"
    )
    return parser


def run_export(args: argparse.Namespace) -> int:
    try:
        out = export_run(args.run_dir, args.out, checkpoint=args.checkpoint, dtype=args.dtype)
    except ExportError as e:
        print(f"r3 export: {e}", file=sys.stderr)
        return 2
    print(f"r3 export: wrote {out}")
    print(
        f"  load it: AutoModelForCausalLM.from_pretrained({str(out)!r}); AutoTokenizer.from_pretrained(same)"
    )
    return 0


def export_algorithm_policy(algo: Any, path: str | os.PathLike, *, with_head: bool = False) -> str:
    """``R3.export_policy``: every learner writes its part of the policy as a Hugging Face folder at ``path``, then
    the tokenizer goes beside it and the folder is made readable to all."""
    from r3_rllib.algorithms.r3.learner_calls import all_results, collective_results
    from r3_rllib.algorithms.r3.runner_setup import load_policy_tokenizer
    from r3_rllib.models.tiny import save_portable_tokenizer

    path = os.path.abspath(str(path))
    kwargs = {"with_head": True} if with_head else {}
    # The full state dict is gathered in a collective: one rank's error stops the export at once.
    results = collective_results(
        algo.learner_group, lambda learner, _p=path, _kw=kwargs: learner.export_hf(_p, **_kw)
    )
    assert any(r is not None for r in all_results(results))
    save_portable_tokenizer(load_policy_tokenizer(algo.config), path)  # loads with AutoTokenizer
    make_readable(path)
    return path
