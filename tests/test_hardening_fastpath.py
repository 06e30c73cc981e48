"""The router's fast paths keep the hardening rules: an answer read in one go when its length is declared
must still respect the answer cap, measured on the decoded bytes (a compressed answer may declare a few
kilobytes and decode to gigabytes)."""

from __future__ import annotations

import gzip

from agent_support import ScriptedAgent
from router.core import RouterSettings

CAP = 1024 * 1024


async def test_a_compressed_answer_is_capped_by_its_decoded_size(start_mesh, start_scripted):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=CAP))
    agent: ScriptedAgent = await start_scripted("bomb")
    agent.body = gzip.compress(b'"' + b"a" * (8 * CAP) + b'"')
    agent.headers = {"Content-Encoding": "gzip"}
    assert len(agent.body) < CAP  # the declared length alone would pass
    await mesh.add(agent)
    answer = await mesh.call(payload=1)
    assert (answer.status, answer.body["error_code"]) == (502, "ANSWER_TOO_LARGE")


async def test_a_compressed_answer_within_the_cap_is_decoded_and_passed_on(start_mesh, start_scripted):
    mesh = await start_mesh(routing=RouterSettings(max_answer_bytes=CAP))
    agent: ScriptedAgent = await start_scripted("zipped")
    agent.body = gzip.compress(b'{"echo": "' + b"a" * 1000 + b'"}')
    agent.headers = {"Content-Encoding": "gzip"}
    await mesh.add(agent)
    answer = await mesh.call(payload=1)
    assert (answer.status, answer.body["result"]) == (200, {"echo": "a" * 1000})
