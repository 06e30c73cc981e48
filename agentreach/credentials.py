"""Where the `agentreach` commands find the auth switch and the admin key.

The registry writes the admin key to ``<data-dir>/admin.key`` on its first start with auth on;
every other command (router, console, clients, tokens) reads it from there unless given one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from registry.access import read_admin_key

AUTH_ENV = "AGENTREACH_AUTH"
# Safer than --admin-key, which other users can read in `ps`.
ADMIN_KEY_ENV = "AGENTREACH_ADMIN_KEY"
REGISTRY_ENV = "AGENTREACH_REGISTRY"


def default_auth(environ: Mapping[str, str] = os.environ) -> str:
    """"off" only when AGENTREACH_AUTH says so; anything else (or nothing) keeps auth on."""
    return "off" if environ.get(AUTH_ENV, "").strip().lower() == "off" else "on"


def admin_key(given: str | None, data_dir: Path, environ: Mapping[str, str] = os.environ) -> str | None:
    """``--admin-key`` when given, else $AGENTREACH_ADMIN_KEY, else the data dir's admin.key."""
    given = given or environ.get(ADMIN_KEY_ENV)
    return given.strip() if given and given.strip() else read_admin_key(data_dir)


def default_registry(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(REGISTRY_ENV) or "http://127.0.0.1:8081"
