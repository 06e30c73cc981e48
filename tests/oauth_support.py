"""Tokens for the router's OAuth2 tests: asked for at /oauth/token, or forged with pyjwt (signed with
the router's real key, taken from the running router, so that a claim is the only thing wrong)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization

from router_support import Mesh


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def token_for(mesh: Mesh, client: dict[str, Any], **form: str) -> str:
    body = {"grant_type": "client_credentials", "client_id": client["client_id"],
            "client_secret": client["client_secret"], **form}
    async with mesh.http.post(f"{mesh.url}/oauth/token", data=body) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["access_token"]


async def token_request(mesh: Mesh, form: dict[str, str], headers: dict[str, str] | None = None,
                        **kwargs: Any) -> tuple[int, Any, Any]:
    async with mesh.http.post(f"{mesh.url}/oauth/token", data=form, headers=headers, **kwargs) as response:
        return response.status, await response.json(), response.headers


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"


def router_key(mesh: Mesh):
    assert mesh.router_server.auth is not None
    return mesh.router_server.auth.issuer.keys.current


def claims(client: dict[str, Any], **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": client["client_id"], "aud": "agentreach", "iss": "agentreach-router", "iat": now, "nbf": now,
            "exp": now + 300, "jti": os.urandom(8).hex(), "trust_level": "internal", "grants": ["echo"], **changes}


def signed(mesh: Mesh, body: dict[str, Any]) -> str:
    key = router_key(mesh)
    return jwt.encode(body, key.private, algorithm="EdDSA", headers={"kid": key.kid})


def tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["grants"] = ["echo", "secret.read"]
    return f"{header}.{b64(json.dumps(body).encode())}.{signature}"


def hs256_with_public_key(mesh: Mesh, body: dict[str, Any]) -> str:
    key = router_key(mesh)
    pem = key.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = unsigned({"alg": "HS256", "typ": "JWT", "kid": key.kid}, body)
    signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"
