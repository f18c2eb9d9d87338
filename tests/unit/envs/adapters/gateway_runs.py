"""Agent runs of an adapter env through a served gateway, as the agent rollout kind makes them: one session per
run, one ``openai.AsyncOpenAI`` bound to it (a timeout on every call, no retries); the runs' results and each
session's call records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import openai

#: Seconds a client call, and a whole batch of runs, may take.
CALL_TIMEOUT_S = 60.0
RUNS_TIMEOUT_S = 180.0


async def _run_one(gateway: Any, env: Any, query_id: str) -> tuple[Any, list[Any]]:
    session = gateway.open_session()
    client = openai.AsyncOpenAI(
        base_url=gateway.session_base_url(session), api_key="x", timeout=CALL_TIMEOUT_S, max_retries=0
    )
    try:
        result = await env.run_agent(client, gateway.model_name, env.agent_task(query_id))
    finally:
        records = gateway.close_session(session)
        await client.close()
    return result, records


async def _run_all(gateway: Any, env: Any, query_ids: Sequence[str], concurrent: bool) -> list[Any]:
    if concurrent:
        return list(await asyncio.gather(*(_run_one(gateway, env, q) for q in query_ids)))
    return [await _run_one(gateway, env, q) for q in query_ids]


def run_episodes(
    gateway: Any, env: Any, query_ids: Sequence[str], *, concurrent: bool = False
) -> tuple[list[Any], list[list[Any]]]:
    """``env.run_agent`` on each query's task, each in its own gateway session (one after the other, so each call
    is one engine batch and the samples are reproducible; ``concurrent``: all at once, lockstep batches); returns
    the results and each session's records, in query order."""
    pairs = asyncio.run(asyncio.wait_for(_run_all(gateway, env, query_ids, concurrent), RUNS_TIMEOUT_S))
    return [p[0] for p in pairs], [p[1] for p in pairs]


def extends_previous(records: Sequence[Any]) -> bool:
    """Whether every call after the first extends the call before it, token for token: the gateway says so
    (``extra["extended"]``, ``extends_call``) and its prompt starts with that call's prompt and completion."""
    for before, after in zip(records, records[1:], strict=False):
        head = list(before.prompt_ids) + list(before.completion_ids)
        if not (after.extra["extended"] and after.extra["extends_call"] == before.index):
            return False
        if list(after.prompt_ids[: len(head)]) != head:
            return False
    return True


def reply_text(tokenizer: Any, record: Any) -> str:
    """The text the gateway returned for ``record``'s completion: its tokens decoded without special tokens, the
    stop token left out."""
    ids = list(record.completion_ids)
    if record.finish_reason == "stop" and ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)
