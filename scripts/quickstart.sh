#!/usr/bin/env bash
# Set up and run the embedded default: GRPO on the tiny arithmetic model, a few minutes on a laptop CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every Ray actor is a new Python process that imports torch, transformers and RLlib. With PYTHONDONTWRITEBYTECODE
# set (some shells and CI images set it), none of them writes the compiled modules that the install skipped
# (--no-compile in setup.sh), so every actor compiles them again from source: measured here, a test of
# tests/e2e/test_algorithm.py (an algorithm build and two iterations) took 15.5 s instead of 7.4 s. Let the first
# import write them.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh
.venv/bin/r3 train examples/tiny_arithmetic_cpu.yaml "$@"
# What the model wrote in the last iteration: four of its recorded completions (all: `r3 samples runs/...`).
echo
.venv/bin/r3 samples runs/tiny_arithmetic_cpu --iteration -1 -n 4 || true
