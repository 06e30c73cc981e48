"""The routing-policy schema: decoding with paths, cross-field rules, timeouts, the store encoding."""

import msgspec
import pytest

from mesh.policy import (
    DEFAULT_POLICY,
    BreakerConfig,
    Policy,
    PolicyError,
    StickyConfig,
    TimeoutConfig,
    validate_policy,
)
from mesh.records import decode_value, encode_value, policy_key
from router.timeouts import ResolvedTimeouts, resolve_timeouts

SEED = b"""{"capability": "intent.detect", "policy": "least_load",
 "affinity": {"enabled": true, "key": "session_id", "ttl_seconds": 300},
 "timeout": {"connect_ms": 200, "first_byte_ms": 2000, "total_ms": 10000},
 "retry": {"enabled": false, "max_attempts": 2},
 "circuit_breaker": {"error_threshold_percent": 30, "min_requests": 30, "reset_seconds": 30, "window_seconds": 60},
 "fallback_capability": null}"""


def decode(body: str | bytes) -> Policy:
    return msgspec.json.decode(body, type=Policy)


def test_seed_policy_decodes():
    policy = decode(SEED)
    assert policy.capability == "intent.detect" and policy.policy == "least_load"
    assert policy.affinity == StickyConfig(enabled=True, key="session_id", ttl_seconds=300)
    assert policy.timeout == TimeoutConfig(connect_ms=200, first_byte_ms=2000, total_ms=10000)
    assert policy.circuit_breaker == BreakerConfig(error_threshold_percent=30, min_requests=30, reset_seconds=30,
                                                   window_seconds=60, half_open_probes=1)
    assert policy.retry.enabled is False and policy.retry.max_attempts == 2
    assert policy.fallback_capability is None
    validate_policy(policy, "intent.detect")


def test_empty_body_is_the_default_policy():
    policy = decode(b"{}")
    assert policy == DEFAULT_POLICY
    assert policy.policy is None and policy.capability is None
    assert policy.timeout == TimeoutConfig(connect_ms=1000, first_byte_ms=None, total_ms=None)
    assert policy.circuit_breaker == BreakerConfig(error_threshold_percent=50, min_requests=20, reset_seconds=30,
                                                   window_seconds=60, half_open_probes=1)


def test_store_encoding_round_trips():
    policy = decode(SEED)
    assert decode_value(policy_key("intent.detect"), encode_value(policy)) == policy


@pytest.mark.parametrize(("body", "path"), [
    ('{"policy": "random"}', "$.policy"),
    ('{"affinity": {"ttl_seconds": 0}}', "$.affinity.ttl_seconds"),
    ('{"affinity": {"key": ""}}', "$.affinity.key"),
    ('{"timeout": {"connect_ms": 0}}', "$.timeout.connect_ms"),
    ('{"timeout": {"total_ms": "10s"}}', "$.timeout.total_ms"),
    ('{"retry": {"max_attempts": 6}}', "$.retry.max_attempts"),
    ('{"retry": {"max_attempts": 0}}', "$.retry.max_attempts"),
    ('{"circuit_breaker": {"error_threshold_percent": 0}}', "$.circuit_breaker.error_threshold_percent"),
    ('{"circuit_breaker": {"error_threshold_percent": 100.5}}', "$.circuit_breaker.error_threshold_percent"),
    ('{"circuit_breaker": {"min_requests": 0}}', "$.circuit_breaker.min_requests"),
    ('{"circuit_breaker": {"reset_seconds": 0}}', "$.circuit_breaker.reset_seconds"),
    ('{"circuit_breaker": {"window_seconds": 0}}', "$.circuit_breaker.window_seconds"),
    ('{"circuit_breaker": {"half_open_probes": 0}}', "$.circuit_breaker.half_open_probes"),
    ('{"fallback_capability": "no spaces"}', "$.fallback_capability"),
])
def test_bad_values_fail_decoding_with_their_path(body, path):
    with pytest.raises(msgspec.ValidationError) as failure:
        decode(body)
    assert str(failure.value).endswith(f"at `{path}`")


def test_unknown_fields_are_refused_at_every_level():
    with pytest.raises(msgspec.ValidationError, match=r"unknown field `connect` - at `\$.timeout`"):
        decode('{"timeout": {"connect": 5}}')
    with pytest.raises(msgspec.ValidationError, match="unknown field `retries`"):
        decode('{"retries": 3}')


def test_threshold_of_exactly_100_percent_is_allowed():
    policy = decode('{"circuit_breaker": {"error_threshold_percent": 100}}')
    assert policy.circuit_breaker.error_threshold_percent == 100


@pytest.mark.parametrize(("policy", "field"), [
    (Policy(capability="other.cap"), "capability"),
    (Policy(fallback_capability="intent.detect"), "fallback_capability"),
    (Policy(timeout=TimeoutConfig(connect_ms=3000, first_byte_ms=2000)), "timeout.connect_ms"),
    (Policy(timeout=TimeoutConfig(first_byte_ms=5000, total_ms=4000)), "timeout.first_byte_ms"),
    (Policy(timeout=TimeoutConfig(connect_ms=5000, total_ms=4000)), "timeout.connect_ms"),
])
def test_cross_field_rules_name_the_field(policy, field):
    with pytest.raises(PolicyError) as failure:
        validate_policy(policy, "intent.detect")
    assert failure.value.field == field
    assert failure.value.message == str(failure.value)


def test_consistent_policies_pass_validation():
    validate_policy(Policy(capability="intent.detect", fallback_capability="intent.fallback",
                           timeout=TimeoutConfig(connect_ms=100, first_byte_ms=100, total_ms=100)), "intent.detect")
    validate_policy(Policy(timeout=TimeoutConfig(connect_ms=5000)), "intent.detect")


def test_timeouts_default_to_the_capability_sla():
    assert resolve_timeouts(TimeoutConfig(), 8000, None) == ResolvedTimeouts(connect_s=1.0, first_byte_s=8.0,
                                                                             total_s=8.0)


def test_configured_timeouts_win_over_the_sla():
    config = TimeoutConfig(connect_ms=200, first_byte_ms=2000, total_ms=10000)
    assert resolve_timeouts(config, 30000, None) == ResolvedTimeouts(connect_s=0.2, first_byte_s=2.0, total_s=10.0)


def test_hint_shortens_total_and_caps_the_others():
    config = TimeoutConfig(connect_ms=200, first_byte_ms=2000, total_ms=10000)
    assert resolve_timeouts(config, 30000, 1500) == ResolvedTimeouts(connect_s=0.2, first_byte_s=1.5, total_s=1.5)
    assert resolve_timeouts(config, 30000, 100) == ResolvedTimeouts(connect_s=0.1, first_byte_s=0.1, total_s=0.1)


def test_hint_never_lengthens_total_and_non_positive_hints_are_ignored():
    config = TimeoutConfig(total_ms=10000)
    assert resolve_timeouts(config, 30000, 60000).total_s == 10.0
    assert resolve_timeouts(config, 30000, 0).total_s == 10.0
    assert resolve_timeouts(TimeoutConfig(), 5000, -1).total_s == 5.0
