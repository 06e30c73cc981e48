"""Whose an agent_id is once its instance has deregistered: a small durable binding record.

While the registry holds an instance record (live, or evicted and kept as history) that record
names the agent_id's service. Deregistering deletes the record, so the service is kept under
``agent-ids/<agent_id>`` (``mesh.records.AgentIdBinding``): an instance restarting (deregister, then
register again) finds its id still its own, and no other service can take it in between. Only the
newest bindings are kept (``LifecycleConfig.kept_agent_ids``), so ids churned by short-lived
instances do not pile up for ever.
"""

from __future__ import annotations

from itertools import islice


def bindings_to_forget(bindings: dict[str, str], kept: int) -> list[str]:
    """The agent_ids of the oldest bindings past ``kept``; ``bindings`` iterates oldest first."""
    return list(islice(bindings, max(0, len(bindings) - kept)))
