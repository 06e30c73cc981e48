"""The `agentreach` command: the top floor, which assembles the registry, router, WAL and console
(nothing below imports it)."""
