"""Attacks on the per-session cap's memory: one caller naming thousands of sessions, each id as long as the
context allows. A real router and agent on 127.0.0.1; the router runs in this process, so what it keeps is
measured with tracemalloc."""

from __future__ import annotations

import gc
import tracemalloc

from test_budgets_routers import budgeted, metered, spend  # noqa: F401 (a fixture)

SESSIONS = 300
ID_CHARS = 3500  # the context travels in a header: at most 4,096 bytes of JSON


async def kept_per_session(mesh, agent, key: str, prefix: str, chars: int) -> float:
    """Bytes the router still holds after SESSIONS calls each naming a new session of ``chars`` characters."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(SESSIONS):
        session = f"{prefix}{n:06d}".ljust(chars, "s")
        answer = await spend(mesh, key, context={"session_id": session, "token_budget": 1000})
        assert answer.status == 200, answer.body
    agent.received.clear()  # the test's agent records every call it got (the context header with it)
    gc.collect()
    return (tracemalloc.get_traced_memory()[0] - before) / SESSIONS


async def test_a_sessions_id_is_not_what_its_cap_keeps(start_mesh, metered):  # noqa: F811 (the fixture imported)
    mesh = await start_mesh(auth=True)
    agent = await metered("llm-1")
    await mesh.add(agent, "llm.chat")
    key = await budgeted([mesh])
    await kept_per_session(mesh, agent, key, "warm-", 10)  # buffers, caches and rings reach their size
    tracemalloc.start()
    try:
        short = await kept_per_session(mesh, agent, key, "short-", 10)
        long = await kept_per_session(mesh, agent, key, "long-", ID_CHARS)
    finally:
        tracemalloc.stop()
    # 100,000 sessions are remembered: kept as their ids, that was 100,000 x 3.5 KB from one caller.
    assert long - short < ID_CHARS / 4, (short, long)
