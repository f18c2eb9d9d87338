#!/usr/bin/env bash
# Set up and run the embedded default: GRPO on the tiny arithmetic model, a few minutes on a laptop CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/r3 train examples/tiny_arithmetic_cpu.yaml "$@"
