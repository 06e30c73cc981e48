"""Agent Cards, built from the registry's view: one per capability, and the router's catalog of them.

A capability's card names the router as its endpoint (``{router}/a2a/{capability}``), its registration's
description, version and examples (one skill), and the credentials the router takes: an API key in
X-API-Key, or an OAuth2 client-credentials token from the router's /oauth/token. The catalog card lists
each capability the caller may call as one skill; its endpoint takes ``metadata.capability``. A skill's
declared JSON Schemas (input_schema, output_schema) ride in the card's extension ``SCHEMAS_EXTENSION``
(A2A skills have no schema field), keyed by skill id.
"""

from __future__ import annotations

from typing import Any

from agent_reach.versions import parse_version

from router.mirror import Offer

PROTOCOL_VERSION = "1.0"
MODES = ["application/json", "text/plain"]
CATALOG_NAME = "agentreach"
SCHEMAS_EXTENSION = "urn:agentreach:a2a:schemas:v1"


def _order(offer: Offer) -> tuple[bool, Any, str]:
    """Versions in semantic order; one that is no version orders below every version."""
    parsed = parse_version(offer.version)
    return parsed is not None, parsed or (), offer.version


def newest_offer(offers: list[Offer]) -> Offer:
    return max(offers, key=_order)


def skill_of(name: str, offers: list[Offer]) -> dict[str, Any]:
    """A capability as a skill: the description and examples of its newest registration."""
    newest = newest_offer(offers).capability
    return {"id": name, "name": name, "description": newest.description or f"The mesh capability {name}",
            "tags": [name.split(".")[0]], "examples": list(newest.examples)}


def schemas_of(name: str, offers: list[Offer]) -> dict[str, Any]:
    """The schemas the newest registration declares, as the extension lists them (empty: none declared)."""
    newest = newest_offer(offers).capability
    declared = {key: schema for key, schema in (("input_schema", newest.input_schema),
                                                ("output_schema", newest.output_schema)) if isinstance(schema, dict)}
    return {name: declared} if declared else {}


def _extensions(schemas: dict[str, Any]) -> dict[str, Any]:
    if not schemas:
        return {}
    return {"extensions": [{"uri": SCHEMAS_EXTENSION, "required": False, "params": {"skills": schemas},
                            "description": "JSON Schemas of each skill's payload (input) and answer (output)"}]}


def _security(base_url: str) -> dict[str, Any]:
    return {
        "securitySchemes": {
            "apiKey": {"apiKeySecurityScheme": {"location": "header", "name": "X-API-Key",
                                                "description": "A client API key issued by the registry"}},
            "oauth2": {"oauth2SecurityScheme": {"flows": {"clientCredentials": {
                "tokenUrl": f"{base_url}/oauth/token", "scopes": {}}}}},
        },
        "securityRequirements": [{"schemes": {"apiKey": {"list": []}}}, {"schemes": {"oauth2": {"list": []}}}],
    }


def _card(name: str, description: str, version: str, endpoint: str, skills: list[dict[str, Any]],
          base_url: str, auth: bool, schemas: dict[str, Any]) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": name, "description": description, "version": version,
        "supportedInterfaces": [{"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}],
        # v0.3 clients read the endpoint here.
        "url": endpoint, "preferredTransport": "JSONRPC",
        "provider": {"organization": "Agent Reach mesh", "url": base_url},
        "capabilities": {"streaming": True, "pushNotifications": False, **_extensions(schemas)},
        "defaultInputModes": MODES, "defaultOutputModes": MODES, "skills": skills,
    }
    return {**card, **_security(base_url)} if auth else card


def capability_card(name: str, offers: list[Offer], base_url: str, auth: bool) -> dict[str, Any]:
    skill = skill_of(name, offers)
    version = newest_offer(offers).version
    return _card(name, skill["description"], version, f"{base_url}/a2a/{name}", [skill], base_url, auth,
                 schemas_of(name, offers))


def catalog_card(skills: list[dict[str, Any]], base_url: str, auth: bool, schemas: dict[str, Any]) -> dict[str, Any]:
    return _card(CATALOG_NAME, "The capabilities of an Agent Reach mesh; name one in metadata.capability",
                 PROTOCOL_VERSION, f"{base_url}/a2a", skills, base_url, auth, schemas)
