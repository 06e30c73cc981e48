"""Agent Reach SDK: join the capability mesh with a decorator; reach a capability with one call."""

from agent_reach.agent import AgentReachSDK, BusinessFailure, atp_handler
from agent_reach.atp import BusinessError, ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, RouteFacts, error_frame
from agent_reach.client import ReachClient, ReachError, SyncReachClient
from agent_reach.context import CallContext, current
from agent_reach.wrap import register_capability

__all__ = [
    "AgentReachSDK", "BusinessError", "BusinessFailure", "CallContext", "ErrorCode", "ErrorFrame", "ReachClient",
    "ReachError", "RequestFrame", "ResponseFrame", "RouteFacts", "SyncReachClient", "atp_handler", "current",
    "error_frame", "register_capability",
]
