"""An OpenAI-SDK agent program with a calculator tool trains through the EnvRunners' rollout gateways: two runners on
HF engines, T = 0.6, R^3's replay and ranking on; the samples' tokens are the gateway's records, token for token."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow

#: User modules the runners import by name (the verifiers taskset vf_e2e_sums), as a run gets them from PYTHONPATH.
AGENT_MODULES = str(Path(__file__).parent / "agent_modules")
# Set while the tests are collected, before the session's Ray starts: its workers (the runners) inherit it.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (AGENT_MODULES, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, AGENT_MODULES)

# Role initial, colon, content, one message a line (characters the tiny model's vocabulary has).
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def _calculator_agent():
    """The agent program (built here so it reaches the runners by value): ask, answer the reply's ``a+b`` with a
    tool message, ask again (a reflection rerun asks its reflection message first); reward 1 for the gold answer
    in the final reply, plus 0.1 per digit in it (partial credit: groups rarely tie)."""
    import re

    async def run(client, task, model):
        messages = [{"role": "user", "content": task.get("reflection") or task["question"]}]
        reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=5, timeout=60)
        text = reply.choices[0].message.content or ""
        call = re.search(r"(\d+)\s*\+\s*(\d+)", text)
        result = str(int(call.group(1)) + int(call.group(2))) if call else "no call"
        messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": result}]
        reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=5, timeout=60)
        answer = reply.choices[0].message.content or ""
        return {"reward": float(task["answer"] in answer) + 0.1 * sum(c.isdigit() for c in answer)}

    return run


def save_chat_tiny(tmp_path_factory) -> str:
    """The shipped tiny model with a chat template (the gateway's chat endpoint renders with it), saved."""
    from r3_rllib.models import default_tiny_model_path, load_tiny
    from r3_rllib.models.tiny import save_tiny

    model, tok = load_tiny(default_tiny_model_path())
    tok.chat_template = TEMPLATE
    return str(save_tiny(model, tok, tmp_path_factory.mktemp("chat_tiny")))


@pytest.fixture(scope="module")
def chat_tiny_model(tmp_path_factory) -> str:
    return save_chat_tiny(tmp_path_factory)


def _record_keeper():
    """A function (built here so it reaches the runners by value) that samples once on a runner, keeping the
    records its gateway's sessions returned: (samples, records)."""

    def keep_records(runner):
        runner.sample(num_queries=1)  # the gateway starts on the first rollout
        kept, close = [], runner._gateway.close_session

        def closing(session_id):
            records = close(session_id)
            kept.extend(records)
            return records

        runner._gateway.close_session = closing
        groups = runner.sample(num_queries=2).groups
        return [s for g in groups for s in g.samples], kept

    return keep_records


TASKS = [{"id": f"q{i}", "question": f"{i}+{i + 1}=", "answer": str(2 * i + 1)} for i in range(8)]


def _config(model_path: str, num_env_runners: int = 2) -> R3Config:
    """HF runners (two by default; two queries each per iteration), T = 0.6, R^3 (replay, ranking, reflection) on
    from the start, seeded."""
    return (
        R3Config.r3_preset()
        .environment("agent", env_config={"run": _calculator_agent(), "tasks": TASKS, "test_size": 0})
        .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .r3(replay_start_epoch=0, ranking_start_epoch=0, reflection_start_epoch=0, reflection_tau=1.0)
        .debugging(seed=3)
        .training(
            model_path=model_path,
            group_size=4,
            queries_per_iteration=2 * num_env_runners,
            max_new_tokens=5,
            temperature=0.6,
            lr=1e-3,
            micro_batch_size=32,
            eval_interval=0,
        )
    )


def test_an_openai_sdk_agent_trains_through_the_gateways(ray_session, chat_tiny_model):
    algo = _config(chat_tiny_model).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        checks = algo.env_runner_group.foreach_env_runner(_record_keeper(), local_env_runner=False)
    finally:
        algo.stop()
    rollout = results[-1]["rollout"]
    assert rollout["agent_calls_mean"] == 2.0 and rollout["agent_steps_mean"] == 1.0
    assert 0 < rollout["agent_context_token_frac"] < 1
    # The learner trained on agent samples (an iteration whose groups all tie trains nothing: 0 tokens, not NaN).
    assert all(r["learner"]["trained_tokens"] >= 0 for r in results)
    assert sum(r["learner"]["trained_tokens"] for r in results) > 0
    # R^3's ranking and reflection ran on agent samples (seeded; replay finds no correct past answer to add).
    total = {k: sum(r["r3"][k] for r in results) for k in ("ranked_groups", "reflection_prompts")}
    assert all(v > 0 for v in total.values()), total
    for samples, records in checks:
        assert len(samples) == 2 * 4 and len(records) == 2 * len(samples)
        by_prompt = {}
        for rec in records:
            by_prompt.setdefault(tuple(rec.prompt_ids), []).append(rec)
        for s in samples:
            full = s.prompt_ids + s.response_ids
            # The sample is its last call's prompt and completion, token for token; its first call's completion
            # and both calls' log-probs are where the mask says.
            last = [r for r in by_prompt.get(tuple(full[: len(full) - r_len(s)]), [])]
            assert any(list(r.completion_ids) == full[len(r.prompt_ids) :] for r in last)
            assert s.loss_mask[: r_first(s)].all() and not s.loss_mask.all()


def r_len(sample) -> int:
    """Tokens of the sample's last model turn (the mask's last run of ones)."""
    mask, n = sample.loss_mask, 0
    while n < len(mask) and mask[len(mask) - 1 - n]:
        n += 1
    return n


def r_first(sample) -> int:
    """Tokens of the sample's first model turn (the mask's first run of ones)."""
    mask, n = sample.loss_mask, 0
    while n < len(mask) and mask[n]:
        n += 1
    return n


def _call_keeper():
    """A function (built here so it reaches the runners by value) that starts the runner's gateway (it draws no
    seed) and keeps every call its sessions record, in ``runner.kept_calls``."""

    def install(runner):
        gateway = runner._rollout_gateway()
        close, runner.kept_calls = gateway.close_session, []

        def closing(session_id):
            records = close(session_id)
            runner.kept_calls.extend(records)
            return records

        gateway.close_session = closing

    return install


def _call_reader():
    """A function (built here so it reaches the runners by value) giving the calls a runner's gateway recorded, as
    (prompt ids, sampled ids, log-prob bytes), in content order (sessions close in the order their programs end,
    which timing decides)."""

    def read(runner) -> list[tuple]:
        calls = [
            (tuple(c.prompt_ids), tuple(c.completion_ids), c.logprobs.tobytes()) for c in runner.kept_calls
        ]
        return sorted(calls)

    return read


#: Learner metrics that measure time, memory or the threads an update got, not what was trained.
_MEASURED = ("update_s", "train_tokens_per_s", "peak_", "torch_threads")


def _seeded_run(model_path: str) -> tuple[list[dict], list[list[tuple]]]:
    """Two iterations on one runner; each iteration's trained-batch digest and learner metrics (timings left out),
    and every call its gateway recorded. (Runs on several runners merge their groups in runner order, seeded:
    tests/e2e/test_algorithm.py.)"""
    algo = _config(model_path, num_env_runners=1).build_algo()
    try:
        algo.env_runner_group.foreach_env_runner(_call_keeper(), local_env_runner=False)
        results = [algo.train() for _ in range(2)]
        calls = algo.env_runner_group.foreach_env_runner(_call_reader(), local_env_runner=False)
    finally:
        algo.stop()
    metrics = [
        {"trained_digest": r["rollout"]["trained_digest"]}
        | {k: v for k, v in r["learner"].items() if not k.startswith(_MEASURED)}
        for r in results
    ]
    return metrics, calls


def test_seeded_agent_runs_are_reproducible(ray_session, chat_tiny_model):
    """Batches go when every open session has a call waiting (gateway_max_batch_wait_s is a fallback that does not
    fire here), so two seeded runs sample the same tokens on every runner and the learner sees the same batches:
    identical tokens, log-probs and learner metrics, bit for bit."""
    first, second = _seeded_run(chat_tiny_model), _seeded_run(chat_tiny_model)
    metrics, calls = first
    assert [len(c) for c in calls] == [2 * 2 * 4 * 2]  # iterations x queries x G x 2 calls each
    assert sum(m["trained_tokens"] for m in metrics) > 0
    assert calls == second[1]
    differ = {
        k for mine, theirs in zip(metrics, second[0], strict=True) for k in mine if mine[k] != theirs.get(k)
    }
    assert not differ, f"learner metrics that differ between the runs: {sorted(differ)}"
    assert metrics == second[0]


def _masked_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of trained tokens (loss mask 1) in a response: one per model turn."""
    runs, start = [], None
    for i, on in enumerate([*mask.tolist(), False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    return runs


def assert_trained_as_recorded(samples, records) -> None:
    """Every model turn of every sample is a recorded call, token for token: the context before it is the call's
    prompt, its tokens are the call's completion, with the call's log-probs and token versions; the sample counts
    as its oldest token's version."""
    by_call: dict[tuple, list] = {}
    for r in records:
        by_call.setdefault((tuple(r.prompt_ids.tolist()), tuple(r.completion_ids.tolist())), []).append(r)
    assert samples
    for s in samples:
        full, p = list(s.prompt_ids) + list(s.response_ids), len(s.prompt_ids)
        runs = _masked_runs(np.asarray(s.loss_mask))
        assert runs
        for start, end in runs:
            calls = by_call[(tuple(full[: p + start]), tuple(full[p + start : p + end]))]
            assert any(
                np.array_equal(s.token_versions[start:end], r.token_versions)
                and np.array_equal(np.asarray(s.behavior_logprobs[start:end]), np.asarray(r.logprobs))
                for r in calls
            )
        assert s.policy_version == int(np.asarray(s.token_versions)[np.asarray(s.loss_mask)].min())


def _kept_calls():
    """A function (built here so it reaches the runners by value) giving the calls a runner's gateway recorded."""

    def read(runner) -> list:
        return list(runner.kept_calls)

    return read


def train_keeping_calls(algo, iterations: int) -> tuple[list[dict], list[list], list]:
    """``iterations`` iterations with every runner's gateway calls kept; the results, the batches the learner
    trained and every call recorded (those of a rollout still in flight included)."""
    batches, update = [], algo._update_learners

    def keep_batch(batch, phase=None):
        batches.append(list(batch))
        return update(batch, phase)

    algo._update_learners = keep_batch
    algo.env_runner_group.foreach_env_runner(_call_keeper(), local_env_runner=False)
    results = [algo.train() for _ in range(iterations)]
    algo.coordinator.drain()  # nothing in flight: every session of the requests made is closed and kept
    calls = algo.env_runner_group.foreach_env_runner(_kept_calls(), local_env_runner=False)
    return results, batches, [c for runner in calls for c in runner]


def verifiers_config(model_path: str, num_env_runners: int = 2, **training) -> R3Config:
    """The verifiers taskset vf_e2e_sums (agent_modules/) through verifiers' episodes and the in-process chat
    harness, on `num_env_runners` runners (two queries each per iteration) at T = 0.6, GRPO, seeded."""
    return (
        R3Config.grpo_preset()
        .environment("verifiers", env_config={"env": {"taskset": {"id": "vf_e2e_sums"}}})
        .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=11)
        .training(
            model_path=model_path,
            group_size=4,
            queries_per_iteration=2 * num_env_runners,
            max_new_tokens=5,
            temperature=0.6,
            lr=1e-3,
            micro_batch_size=32,
            eval_interval=0,
            **training,
        )
    )


def check_verifiers_run(results, batches, records, num_env_runners: int = 2) -> None:
    """Two iterations of 2 queries x G = 4 verifiers episodes per runner, one chat call each at T = 0.6 (what the
    config sets: the harness sends no sampling parameter of its own); what the learner trained is recorded."""
    assert len(records) == 2 * num_env_runners * 2 * 4
    assert all(r.endpoint == "chat" and r.temperature == pytest.approx(0.6) for r in records)
    rollout = results[-1]["rollout"]
    assert rollout["agent_calls_mean"] == 1.0 and rollout["agent_steps_mean"] == 1.0
    assert sum(r["learner"]["trained_tokens"] for r in results) > 0
    assert_trained_as_recorded([s for b in batches for s in b], records)


def test_a_verifiers_env_trains_through_the_gateways(ray_session, chat_tiny_model):
    """A verifiers taskset defined beside the tests (rubric rewards on the replies the gateways sampled) trains two
    iterations on two HF runners; every trained token is a recorded one."""
    pytest.importorskip("verifiers.v1")
    algo = verifiers_config(chat_tiny_model).build_algo()
    try:
        check_verifiers_run(*train_keeping_calls(algo, 2))
    finally:
        algo.stop()
