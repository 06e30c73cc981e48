"""The checked-in gencode of agent_reach/proto is what its .proto generates: a change to the service or its
messages without regenerating (the command is in the .proto) fails here, not at a caller."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parent.parent / "sdk"
PROTO = Path("agent_reach/proto/agent.proto")


def test_the_checked_in_gencode_is_what_the_proto_generates(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", str(PROTO)], cwd=SDK, check=True, capture_output=True)
    generated = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*_pb2.py*"))
    assert [str(path) for path in generated] == ["agent_reach/proto/agent_pb2.py", "agent_reach/proto/agent_pb2.pyi"]
    for path in generated:
        assert (tmp_path / path).read_bytes() == (SDK / path).read_bytes(), f"{path} is stale: regenerate it"
