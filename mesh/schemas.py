"""The JSON Schemas a capability declares for its payload and its answer (``input_schema``, ``output_schema``).

The registry checks each one at registration (``schema_problem``); the router compiles a capability
version's ``input_schema`` once and checks every call's payload with it (``Validators``). Validation is
the ``jsonschema`` library's, with the dialect a schema names in ``$schema`` (2020-12 by default). A
``$ref`` is resolved only within the schema and the published metaschemas: nothing is ever fetched,
since a registrant must not make the router or the registry open URLs of its choosing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

MAX_SCHEMA_BYTES = 64 * 1024
# Capability versions whose compiled validators are kept; past it the cache starts again (a registry churning
# through that many versions costs one compile per call of each, never a wrong answer).
MAX_VALIDATORS = 4096
_encoder = msgspec.json.Encoder()


class PayloadProblem(msgspec.Struct, frozen=True):
    """Why a payload fails its capability's input_schema; ``field`` is its path (``payload.items[2].id``)."""

    field: str
    message: str


def _compiled(schema: dict[str, Any]) -> Validator:
    kind = validator_for(schema, default=Draft202012Validator)
    return kind(schema, registry=SPECIFICATIONS)  # it has no retrieve: no $ref is ever fetched


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What is wrong with a declared schema, or None: too large, not a valid JSON Schema, a $ref it does not hold."""
    size = len(_encoder.encode(schema))
    if size > MAX_SCHEMA_BYTES:
        return f"is {size} bytes as JSON; a schema may be at most {MAX_SCHEMA_BYTES}"
    kind = validator_for(schema, default=Draft202012Validator)
    try:
        kind.check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{part!r}]" for part in exc.absolute_path)
        return f"is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else "")
    try:
        _refs_resolve(schema)
    except Unresolvable as exc:
        return f"has $ref {exc.ref!r}, which is not in the schema (a remote $ref is never fetched)"
    return None


def _refs_resolve(schema: dict[str, Any]) -> None:
    """Look up every ``$ref`` of the root resource: one that validation would meet later fails now. A subschema
    with an ``$id`` of its own resolves its refs against itself, so it is left to validation (which says so)."""
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    base = resource.id() or ""
    resolver = SPECIFICATIONS.with_resource(base, resource).resolver(base)
    stack: list[Any] = [schema]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            if current is not schema and "$id" in current:
                continue
            ref = current.get("$ref")
            if isinstance(ref, str):
                resolver.lookup(ref)
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)


def _path(error: ValidationError) -> str:
    return "payload" + error.json_path[1:]


class Validators:
    """Each capability version's compiled input_schema, built on its first call and kept while the schema is
    the same one (a re-registration that changes it compiles anew)."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str], tuple[dict[str, Any], Validator]] = {}

    def problem(self, capability: str, version: str, schema: dict[str, Any], payload: Any) -> PayloadProblem | None:
        key = (capability, version)
        held = self._compiled.get(key)
        if held is None or (held[0] is not schema and held[0] != schema):
            if len(self._compiled) >= MAX_VALIDATORS:
                self._compiled.clear()
            held = self._compiled[key] = (schema, _compiled(schema))
        validator = held[1]
        try:
            if validator.is_valid(payload):
                return None
            error = best_match(validator.iter_errors(payload))
            assert error is not None  # not valid: there is an error to tell
        except Unresolvable as exc:  # registered before refs were checked: the schema's fault, said plainly
            return PayloadProblem(field="payload", message=f"The input_schema of {capability!r} has $ref {exc.ref!r}, "
                                                           "which is not in the schema")
        return PayloadProblem(field=_path(error), message=f"Payload does not match the input_schema of {capability!r} "
                                                          f"at {_path(error)}: {error.message}")
