"""docs/a2a.md runs as pasted: its curl examples against `agentreach up --auth off` and the echo agent (each
answers the status shown, with the codes shown), and its a2a-sdk snippet prints what the doc says."""

from __future__ import annotations

import re
import sys

from doc_support import ROOT, check_curl, doc_mesh, promised_codes, run

DOC = ROOT / "docs" / "a2a.md"
CURL = re.compile(r"```bash\n(curl [^`]*?)\n```\s*```http\nHTTP/1\.1 (\d{3})([^`]*?)```", re.S)
PYTHON = re.compile(r"```python\n(.*?)```", re.S)


async def test_the_a2a_doc_runs_as_pasted_against_agentreach_up(http, tmp_path):
    text = DOC.read_text()
    examples = CURL.findall(text)
    [snippet] = PYTHON.findall(text)
    assert len(examples) >= 10
    async with doc_mesh(http, ROOT, "--data-dir", str(tmp_path / "data"), "--auth", "off") as mesh:
        for example, status, shown in examples:
            await check_curl(mesh, example, status, [*promised_codes(shown),
                                                     *re.findall(r'"state":"[A-Za-z_]+"', shown)])
        printed = await run([sys.executable, "-c", mesh.on_our_ports(snippet)])
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == "TASK_STATE_COMPLETED [{'echo': 'hello'}]"
