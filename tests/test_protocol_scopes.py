"""Key protocols and scope ids: round trips, patterns, rejection of wildcards and empty segments."""

from __future__ import annotations

import fnmatch

import pytest

from colony.blackboard import AgentRunProtocol, BlackboardScope, WorkAssignmentProtocol, scope_id
from colony.blackboard.protocol import BlackboardKeyspace, RequestResultProtocol
from colony.errors import InvalidKey


@pytest.mark.parametrize("protocol", [AgentRunProtocol, WorkAssignmentProtocol])
def test_request_result_event_keys_round_trip(protocol: type[RequestResultProtocol]) -> None:
    kind = protocol.kind
    assert protocol.request_key("r-1") == f"request:{kind}:r-1"
    assert protocol.result_key("r-1") == f"result:{kind}:r-1"
    assert protocol.event_key("r-1", "completed") == f"event:{kind}:r-1:completed"
    assert protocol.parse_request_key(protocol.request_key("abc.def_9")) == "abc.def_9"
    assert protocol.parse_result_key(protocol.result_key("x")) == "x"
    assert protocol.parse_event_key(protocol.event_key("x", "progress")) == ("x", "progress")
    assert protocol.identify(protocol.result_key("q")) == ("result", {"request_id": "q"})
    assert protocol.identify("unrelated:key") is None


def test_patterns_match_exactly_their_keys() -> None:
    assert AgentRunProtocol.request_pattern() == "request:run:*"
    assert AgentRunProtocol.event_pattern("r1") == "event:run:r1:*"
    assert fnmatch.fnmatchcase(AgentRunProtocol.event_key("r1", "done"), AgentRunProtocol.event_pattern("r1"))
    assert not fnmatch.fnmatchcase(
        AgentRunProtocol.event_key("r2", "done"), AgentRunProtocol.event_pattern("r1")
    )
    assert not fnmatch.fnmatchcase(
        WorkAssignmentProtocol.request_key("r1"), AgentRunProtocol.request_pattern()
    )
    assert WorkAssignmentProtocol.claim_key("u1") == "claim:work:u1"
    assert AgentRunProtocol.claim_key("u1") == "claim:run:u1"


@pytest.mark.parametrize("bad", ["", "*", "a*", "a?b", "[x]", "a:b", "a b", "x{y}", None, 5])
def test_wildcard_and_empty_segments_rejected(bad: object) -> None:
    with pytest.raises(InvalidKey):
        AgentRunProtocol.request_key(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKey):
        AgentRunProtocol.event_key("ok", bad)  # type: ignore[arg-type]
    if bad is not None:  # None in a pattern means "any"
        with pytest.raises(InvalidKey):
            AgentRunProtocol.event_pattern(bad)  # type: ignore[arg-type]


def test_parse_rejects_foreign_keys() -> None:
    for key in ["request:run:", "request:run:a:b", "result:run:x", "request:work:x", "request:run:*"]:
        with pytest.raises(InvalidKey):
            AgentRunProtocol.parse_request_key(key)


def test_build_requires_exactly_the_template_segments() -> None:
    with pytest.raises(InvalidKey, match="missing"):
        AgentRunProtocol.build("event", request_id="x")
    with pytest.raises(InvalidKey, match="unexpected"):
        AgentRunProtocol.build("request", request_id="x", other="y")
    with pytest.raises(InvalidKey, match="no key template"):
        AgentRunProtocol.build("nope")


def test_scope_ids_are_distinct_and_namespaced() -> None:
    ids = {
        scope_id(BlackboardScope.TENANT),
        scope_id(BlackboardScope.COLONY),
        scope_id(BlackboardScope.SESSION, session_id="s1"),
        scope_id(BlackboardScope.AGENT, agent_id="s1"),
        scope_id(BlackboardScope.AGENT, agent_id="s1", colony_id="other"),
        scope_id(BlackboardScope.AGENT, agent_id="s1", namespace="compliance"),
    }
    assert len(ids) == 6
    assert scope_id(BlackboardScope.AGENT, agent_id="a1", namespace="compliance") == (
        "tenant:default:colony:default:agent:a1:namespace:compliance"
    )
    assert AgentRunProtocol.namespaced_scope(scope_id(BlackboardScope.COLONY), "pool").endswith(
        "colony:default:namespace:pool"
    )
    with pytest.raises(InvalidKey):
        scope_id(BlackboardScope.AGENT)
    with pytest.raises(InvalidKey):
        scope_id(BlackboardScope.AGENT, agent_id="a:b")
    with pytest.raises(InvalidKey):
        scope_id(BlackboardScope.SESSION, session_id="*")


def test_keyspace_keeps_a_scope_in_one_cluster_slot() -> None:
    ks = BlackboardKeyspace("tenant:t:colony:c")
    for redis_key in (ks.entry_key("a:b"), ks.tag_key("x"), ks.events_key):
        assert "{tenant:t:colony:c}" in redis_key
    assert ks.logical_key(ks.entry_key("a:b")) == "a:b"
    with pytest.raises(InvalidKey):
        ks.logical_key("colony:bb:{other}:e:a")
