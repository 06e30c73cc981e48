"""docs/mcp.md runs as pasted: its curl examples against `agentreach up --auth off` and the echo agent (each
answers the status shown, with the JSON-RPC codes shown), and its mcp SDK snippet prints what the doc says."""

from __future__ import annotations

import sys

from doc_support import ROOT, check_curl, doc_mesh, promised_codes, run
from test_a2a_doc import CURL, PYTHON

DOC = ROOT / "docs" / "mcp.md"


async def test_the_mcp_doc_runs_as_pasted_against_agentreach_up(http, tmp_path):
    text = DOC.read_text()
    examples = CURL.findall(text)
    [snippet] = PYTHON.findall(text)
    assert len(examples) >= 9
    async with doc_mesh(http, ROOT, "--data-dir", str(tmp_path / "data"), "--auth", "off") as mesh:
        for example, status, shown in examples:
            body = shown.split("\n\n", 1)[1] if "\n\n" in shown else ""
            # The shown body, where "..." stands for what differs per run (ids) or is left out.
            await check_curl(mesh, example, status,
                             [*promised_codes(shown), *filter(None, (part.strip() for part in body.split("...")))])
        printed = await run([sys.executable, "-c", mesh.on_our_ports(snippet)])
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == "['echo'] {'echo': {'text': 'hello'}}"
