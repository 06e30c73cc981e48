"""docs/security.md runs as pasted: every `bash` block, in order, in one shell, in the directory
where `agentreach up` (auth on, the default) keeps its data, each answer checked against the doc."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess

from doc_support import ROOT, doc_environment, doc_mesh, promised_codes

DOC = ROOT / "docs" / "security.md"
BLOCK = re.compile(r"```bash\n(.*?)\n```\s*```(http|json)\n(.*?)```", re.S)
END = "@@end-of-example@@"


def examples() -> list[tuple[str, str, str]]:
    """(commands, kind of answer shown, the answer shown) for every bash block followed by one."""
    return BLOCK.findall(DOC.read_text())


def check(commands: str, kind: str, shown: str, output: str) -> None:
    where = f"{commands}\n-> {output}"
    if kind == "http":
        status = re.match(r"HTTP/1\.1 (\d{3})", shown).group(1)
        assert output.startswith(f"HTTP/1.1 {status} "), where
        for promised in promised_codes(shown):
            assert promised in output, where
    else:
        got, promised = json.loads(output), json.loads(shown.replace("…", ""))
        assert set(got) == set(promised), where
        assert {key: got[key] for key in ("service", "name", "trust_level", "grants", "token_type", "scope")
                if key in promised} == {key: promised[key] for key in
                                        ("service", "name", "trust_level", "grants", "token_type", "scope")
                                        if key in promised}, where


async def test_the_security_walkthrough_runs_as_pasted(http, tmp_path):
    blocks = examples()
    assert len(blocks) >= 15
    async with doc_mesh(http, tmp_path) as mesh:
        script = "\n".join(f"{mesh.on_our_ports(commands)}\necho {END}" for commands, _, _ in blocks)
        result = await asyncio.to_thread(subprocess.run, ["bash", "-c", script], capture_output=True, text=True,
                                         timeout=120, cwd=tmp_path, env=doc_environment(mesh))
        outputs = result.stdout.split(f"{END}\n")
        assert len(outputs) == len(blocks) + 1, result.stdout + result.stderr
        for (commands, kind, shown), output in zip(blocks, outputs, strict=False):
            check(commands, kind, shown, output.strip())
    # Secrets stay out of the working tree (where git would pick them up): only the data dir is left.
    assert sorted(path.name for path in tmp_path.iterdir()) == [".agentreach"]
