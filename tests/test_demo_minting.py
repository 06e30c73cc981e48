"""`agentreach demo` mints the demo's credentials over the registry's admin HTTP API, on the same path as
`up --demo` (in process): secrets are reused across starts while their records hold, replaced once an
operator rotated or revoked them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentreach.demo import HttpAdmin, mint_credentials
from conftest import admin_key, call
from sdk_support import refused_url


async def test_minted_over_http_once_then_reused_across_starts(start_registry, tmp_path: Path):
    server = await start_registry(tmp_path / "registry", auth=True)
    book = server.registry.access.book
    # The first registry named cannot be reached: the next one is used.
    admin = HttpAdmin([refused_url(), server.url], admin_key(server))
    first = await mint_credentials(admin, tmp_path / "demo")
    caller_key = first.caller_key_path.read_text().strip()
    assert book.client_by_api_key(caller_key).name == "demo-caller"
    assert book.client_by_api_key(first.orders_api_key).grants == ["intent.detect"]
    assert {service: book.token(token).service for service, token in first.tokens.items()} == {
        "demo-echo": "demo-echo", "demo-intent": "demo-intent", "demo-orders": "demo-orders"}

    again = await mint_credentials(admin, tmp_path / "demo")
    assert again == first and again.caller_key_path.read_text().strip() == caller_key
    assert len(server.registry.access.clients()) == 2 and len(server.registry.access.tokens()) == 3


async def test_an_operators_rotation_or_revocation_is_noticed_over_http(start_registry, tmp_path: Path, http):
    server = await start_registry(tmp_path / "registry", auth=True)
    book, key = server.registry.access.book, admin_key(server)
    admin = HttpAdmin([server.url], key)
    first = await mint_credentials(admin, tmp_path / "demo")
    caller = next(client for client in server.registry.access.clients() if client.name == "demo-caller")
    token_id = book.token(first.tokens["demo-echo"]).token_id
    assert (await call(http, "POST", f"{server.url}/clients/{caller.client_id}/rotate", key))[0] == 200
    assert (await call(http, "POST", f"{server.url}/tokens/{token_id}/revoke", key))[0] == 200

    second = await mint_credentials(admin, tmp_path / "demo")
    assert book.client_by_api_key(second.caller_key_path.read_text().strip()).client_id == caller.client_id
    assert second.tokens["demo-echo"] != first.tokens["demo-echo"]
    assert book.token(second.tokens["demo-echo"]).service == "demo-echo"
    assert second.tokens["demo-intent"] == first.tokens["demo-intent"]
    assert second.orders_api_key == first.orders_api_key


def test_the_demo_command_without_an_admin_key_refuses_in_one_line(tmp_path: Path):
    """With auth on (the default) and no key anywhere, it says what it lacks instead of running keyless."""
    env = {key: value for key, value in os.environ.items() if key != "AGENTREACH_ADMIN_KEY"}
    done = subprocess.run([sys.executable, "-m", "agentreach.cli", "demo", "--data-dir", str(tmp_path),
                           "--registry", refused_url()], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "AGENTREACH_ADMIN_KEY" in done.stderr and "Traceback" not in done.stderr


async def test_a_damaged_ids_file_means_minting_afresh(start_registry, tmp_path: Path):
    server = await start_registry(tmp_path / "registry", auth=True)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "demo-ids.json").write_text("[]")
    minted = await mint_credentials(HttpAdmin([server.url], admin_key(server)), tmp_path / "demo")
    assert server.registry.access.book.client_by_api_key(minted.orders_api_key).name == "demo-orders"
