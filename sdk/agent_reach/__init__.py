"""Agent Reach SDK: the ATP protocol types and, as they land, the agent and caller helpers."""

from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, error_frame

__all__ = ["ErrorCode", "ErrorFrame", "RequestFrame", "ResponseFrame", "error_frame"]
