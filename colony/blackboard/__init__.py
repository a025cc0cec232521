"""The Redis blackboard: single source of truth for agent state, requests, results and events."""

from colony.blackboard.blackboard import Blackboard
from colony.blackboard.connection import create_redis, resolve_redis_url
from colony.blackboard.events import ConsumedEvent, EventConsumer, EventSubscription
from colony.blackboard.models import BlackboardEntry, BlackboardEvent, QueryPage, TagFilter, WriteRequest
from colony.blackboard.protocol import (
    AgentRunProtocol,
    BlackboardKeyspace,
    BlackboardProtocol,
    RequestResultProtocol,
    WorkAssignmentProtocol,
)
from colony.blackboard.scopes import BlackboardScope, scope_id
from colony.blackboard.transaction import Transaction

__all__ = [
    "AgentRunProtocol",
    "Blackboard",
    "BlackboardEntry",
    "BlackboardEvent",
    "BlackboardKeyspace",
    "BlackboardProtocol",
    "BlackboardScope",
    "ConsumedEvent",
    "EventConsumer",
    "EventSubscription",
    "QueryPage",
    "RequestResultProtocol",
    "TagFilter",
    "Transaction",
    "WorkAssignmentProtocol",
    "WriteRequest",
    "create_redis",
    "resolve_redis_url",
    "scope_id",
]
