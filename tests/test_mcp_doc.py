"""docs/mcp.md runs as pasted: its curl examples against `agentreach up --auth off` and the echo agent (each
answers the status shown, with the JSON-RPC codes shown), its mcp SDK snippet prints what the doc says, and
its "Adding an MCP server" section starts examples/mcp_server.py, adds it with `agentreach mcp add` and calls
its tool through the router."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import aiohttp

from conftest import wait_for
from doc_support import ROOT, check_curl, doc_environment, doc_mesh, promised_codes, run, venv_commands
from mesh import mcp_client
from test_a2a_doc import CURL, PYTHON

DOC = ROOT / "docs" / "mcp.md"
ADDING = "## Adding an MCP server"
BASH = re.compile(r"```bash\n(python examples/mcp_server\.py[^`]*?)\n```", re.S)


def sections() -> tuple[str, str]:
    """The doc before its "Adding an MCP server" section, and that section."""
    text = DOC.read_text()
    before, adding = text.split(ADDING)
    return before, adding.split("\n## ")[0]


async def check_examples(mesh, text: str) -> None:
    for example, status, shown in CURL.findall(text):
        body = shown.split("\n\n", 1)[1] if "\n\n" in shown else ""
        # The shown body, where "..." stands for what differs per run (ids) or is left out.
        await check_curl(mesh, example, status,
                         [*promised_codes(shown), *filter(None, (part.strip() for part in body.split("...")))])


async def test_the_mcp_doc_runs_as_pasted_against_agentreach_up(http, tmp_path):
    text = sections()[0]
    [snippet] = PYTHON.findall(text)
    assert len(CURL.findall(text)) >= 9
    async with doc_mesh(http, ROOT, "--data-dir", str(tmp_path / "data"), "--auth", "off") as mesh:
        await check_examples(mesh, text)
        printed = await run([sys.executable, "-c", mesh.on_our_ports(snippet)])
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == "['echo'] {'echo': {'text': 'hello'}}"


async def test_adding_the_example_mcp_server_as_the_doc_says(http, tmp_path):
    text = sections()[1]
    [commands] = BASH.findall(text)
    assert len(CURL.findall(text)) == 2
    async with doc_mesh(http, ROOT, "--data-dir", str(tmp_path / "data"), "--auth", "off") as mesh:
        server_line, add_line = mesh.on_our_ports(commands).splitlines()
        assert server_line == "python examples/mcp_server.py --port 9001 &"
        server = subprocess.Popen([sys.executable, "examples/mcp_server.py", "--port", str(mesh.ports["agent"])],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{mesh.ports['agent']}/mcp"

            async def serving() -> bool:
                assert server.poll() is None, f"examples/mcp_server.py exited with {server.returncode}"
                try:
                    await mcp_client.ping(http, url, aiohttp.ClientTimeout(total=5))
                    return True
                except (aiohttp.ClientError, mcp_client.McpFailure):
                    return False

            await wait_for(serving, timeout=20, what="examples/mcp_server.py to serve")
            added = await run(["bash", "-c", venv_commands(add_line)], env=doc_environment(mesh))
            assert added.returncode == 0, added.stderr
            printed = json.loads(added.stdout)
            assert set(printed["capabilities"]) == {"calc.add", "calc.echo"}

            async def routable() -> bool:
                async with http.post(f"{mesh.router_url}/atp", json={"capability": "calc.add",
                                                                      "payload": {"a": 2, "b": 3}}) as response:
                    return response.status == 200
            await wait_for(routable, timeout=10, what="the router to route calc.add")
            await check_examples(mesh, text)
        finally:
            server.terminate()
            server.wait(timeout=20)
