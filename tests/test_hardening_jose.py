"""The router's JWTs name their algorithm as RFC 9864 does (hardening item 21).

`EdDSA` is deprecated in favour of `Ed25519`: tokens and JWKS entries say `Ed25519`, and a client
library that follows RFC 9864 (joserfc, which warns on `EdDSA`) verifies them with the published
keys alone. Tokens that say `EdDSA` — what routers wrote before — are still accepted; `none` and
HS256 still are not. A real router and agent on 127.0.0.1 (router_support's `secure` mesh).
"""

from __future__ import annotations

import hashlib
import hmac
import warnings

import jwt
from cryptography.hazmat.primitives import serialization
from joserfc import jwt as jose_jwt
from joserfc.jwk import KeySet, OKPKey

from oauth_support import b64, bearer, claims, hs256_with_public_key, router_key, token_for, unsigned


async def test_tokens_and_jwks_say_ed25519_and_an_rfc_9864_client_verifies_them_without_warnings(secure):
    mesh, _ = secure
    client = await mesh.new_client(["echo"])
    token = await token_for(mesh, client)
    async with mesh.http.get(f"{mesh.url}/.well-known/jwks.json") as response:
        jwks = await response.json()
    assert jwt.get_unverified_header(token)["alg"] == "Ed25519"
    assert [key["alg"] for key in jwks["keys"]] == ["Ed25519"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verified = jose_jwt.decode(token, KeySet.import_key_set(jwks), algorithms=["Ed25519"])
    assert verified.header["alg"] == "Ed25519" and verified.claims["sub"] == client["client_id"]


async def test_tokens_signed_under_either_name_are_accepted(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    key = router_key(mesh)
    older = jwt.encode(claims(client), key.private, algorithm="EdDSA", headers={"kid": key.kid})
    pem = key.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    by_joserfc = jose_jwt.encode({"alg": "Ed25519", "kid": key.kid}, claims(client), OKPKey.import_key(pem),
                                 algorithms=["Ed25519"])
    for token in (older, by_joserfc):
        answer = await mesh.call("echo", headers=bearer(token))
        assert answer.status == 200, answer.body
    assert agent.calls == 2


async def test_none_and_hs256_are_refused_whatever_else_the_header_says(secure):
    mesh, agent = secure
    client = await mesh.new_client(["echo"])
    key = router_key(mesh)
    pem = key.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # An Ed25519 header over an HMAC made with the public key: naming the algorithm is not enough.
    signing_input = unsigned({"alg": "Ed25519", "typ": "JWT", "kid": key.kid}, claims(client))
    mislabelled = f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"
    for token in (unsigned({"alg": "none", "typ": "JWT", "kid": key.kid}, claims(client)) + ".",
                  hs256_with_public_key(mesh, claims(client)), mislabelled):
        answer = await mesh.call("echo", headers=bearer(token))
        assert answer.status == 401 and answer.body["error_code"] == "UNAUTHENTICATED", answer.body
    assert agent.calls == 0
