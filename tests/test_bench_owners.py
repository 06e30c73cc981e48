"""bench/owners.py charges each py-spy sample to the owner of its innermost frame's file: the profile by owner
in docs/benchmarks.md rests on this mapping."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from doc_support import ROOT
from owners import RATE_HZ, owner_of, owners_of_raw, per_call_us

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


@pytest.mark.parametrize(("path", "owner"), [
    (f"{SITE}/aiohttp/client_reqrep.py", "aiohttp client"),
    (f"{SITE}/aiohttp/connector.py", "aiohttp client"),
    (f"{SITE}/aiohttp/web_protocol.py", "aiohttp server"),
    (f"{SITE}/aiohttp/http_parser.py", "aiohttp server"),
    (f"{SITE}/aiohttp/streams.py", "aiohttp, both (streams, writer, helpers)"),
    (f"{STDLIB}/asyncio/base_events.py", "asyncio and selectors"),
    (f"{STDLIB}/selectors.py", "asyncio and selectors"),
    (f"{ROOT}/router/attempt.py", "the mesh's own code"),
    (f"{ROOT}/sdk/agent_reach/atp.py", "the mesh's own code"),
    (f"{SITE}/aiosqlite/core.py", "sqlite (audit writer)"),
    (f"{STDLIB}/json/decoder.py", "other (C calls, stdlib)"),
    (f"{SITE}/router/core.py", "the mesh's own code"),  # installed without -e: in site-packages
    (f"{SITE}/yarl/_url.py", "yarl, multidict"),
])
def test_each_file_goes_to_its_owner(path, owner):
    assert owner_of(path) == owner


def test_samples_are_charged_to_the_innermost_frame_only():
    raw = "\n".join([
        f"<module> ({ROOT}/agentreach/cli.py:10);run ({STDLIB}/asyncio/base_events.py:600);"
        f"call ({ROOT}/router/core.py:170) 7",
        f"<module> ({ROOT}/agentreach/cli.py:10);call ({ROOT}/router/core.py:170);"
        f"request ({SITE}/aiohttp/client.py:500) 5",
        f"<module> ({ROOT}/agentreach/cli.py:10);select ({STDLIB}/selectors.py:468) 3",
        f"<module> ({ROOT}/agentreach/cli.py:10);call ({ROOT}/router/core.py:170) 2",
    ])
    assert owners_of_raw(raw) == {"the mesh's own code": 9, "aiohttp client": 5, "asyncio and selectors": 3}


def test_per_call_figures_follow_the_sampling_rate():
    figures = per_call_us(owners_of_raw(f"f ({ROOT}/router/core.py:1) {RATE_HZ}"), calls=1000)
    assert figures == {"the mesh's own code": 1000.0}  # a second of samples over 1,000 calls: 1 ms a call
