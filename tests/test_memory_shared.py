"""Shared memory (issue 36, deliverable 4) on a real redis-server: collective, task and global
scopes defined with access rules, written by agents (`share_memory`) and by subscriptions from an
agent's STM through the SharingTransformer, read by `recall_shared` and the shared lens; every
refusal (not a reader, not a writer, not defined, the user's words) is a failed action naming why."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import assert_failed
from pydantic import ValidationError

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.errors import InvalidArgument, SharedMemoryNotFound
from colony.memory.capability import MemoryCapability
from colony.memory.introspection import agent_memory_map
from colony.memory.scopes import MemoryScope
from colony.memory.shared import (
    SharedAccess,
    SharedMemoryCapability,
    SharedScopes,
    check_name,
    share_from,
    shared_name,
    shared_scope_id,
)
from colony.memory.shared_tools import SharedMemoryToolsCapability
from colony.memory.store import MemoryStore
from colony.memory.tools import MemoryToolsCapability
from colony.memory.types import MemoryIngestPolicy, MemorySubscription, NewMemory
from colony.memory.user_words import UserWords

TEAM = "collective:team-a"


def _blueprint(
    agent_id: str, *names: str, subscribe: bool = False, extra: list[Any] | None = None
) -> AgentBlueprint:
    capabilities: list[Any] = [MemoryCapability.bind(level="working"), MemoryCapability.bind(level="stm")]
    for name in names:
        subscriptions = [share_from("stm", tags=["assistant", "user"])] if subscribe else []
        capabilities.append(SharedMemoryCapability.bind(name=name, subscriptions=subscriptions))
    capabilities += [SharedMemoryToolsCapability.bind(), *(extra or [])]
    return AgentBlueprint(
        agent_class=Agent, metadata=AgentMetadata(agent_id=agent_id), capabilities=capabilities
    )


class Kit:
    def __init__(self, bb: Blackboard, tmp_path: Path) -> None:
        self.colony_id = f"c{uuid.uuid4().hex[:10]}"
        self.settings = ColonySettings(data_dir=tmp_path, colony_id=self.colony_id)
        self.runtime = LocalAgentRuntime(
            bb, colony_id=self.colony_id, settings=ColonySettings(data_dir=tmp_path)
        )
        self.store = MemoryStore(bb, self.settings)
        self.shared = SharedScopes(self.store, colony_id=self.colony_id)

    async def define(self, name: str, readers: list[str], writers: list[str]) -> None:
        await self.shared.define(name, readers=readers, writers=writers, by="test")

    def scope(self, agent_id: str, level: str) -> str:
        return MemoryScope.agent(agent_id, level, colony_id=self.colony_id)


@pytest.fixture
async def kit(bb: Blackboard, tmp_path: Path) -> AsyncIterator[Kit]:
    made = Kit(bb, tmp_path)
    yield made
    await made.runtime.shutdown()


def test_shared_scope_names_map_to_colony_scopes_and_back() -> None:
    for name in ("global", "collective:team-a", "task:t.1_x"):
        scope = shared_scope_id(name, colony_id="c1")
        assert ":colony:c1:namespace:memory-" in scope and shared_name(scope) == name
        assert MemoryScope.scope_type(scope) == name.split(":")[0]
    for bad in (
        "",
        "team",
        "global:x",
        "collective:",
        "collective:a:b",
        "collective:*",
        "task:../x",
        "task: x",
    ):
        with pytest.raises(InvalidArgument, match="not a shared scope name"):
            check_name(bad)
    assert shared_name(MemoryScope.agent("ada", "stm")) is None
    # a plain MemoryCapability on a shared scope would skip its access rules
    with pytest.raises(ValueError, match="SharedMemoryCapability"):
        MemoryCapability(scope_id=shared_scope_id(TEAM))
    with pytest.raises(ValueError):
        SharedAccess(readers=["ada", "bad:id"])
    with pytest.raises(ValueError):
        SharedAccess(writers=[f"a{i}" for i in range(257)])


async def test_readers_read_writers_write_and_others_are_refused(kit: Kit) -> None:
    await kit.define(TEAM, readers=["bob"], writers=["ada"])
    ada = await kit.runtime.spawn(_blueprint("ada", TEAM))
    bob = await kit.runtime.spawn(_blueprint("bob", TEAM))
    eve = await kit.runtime.spawn(_blueprint("eve", TEAM))
    fact = "The build server restarts every night at 02:00 UTC."
    shared = await ada.dispatcher.dispatch("share_memory", {"fact": fact, "tag": "ops"})
    assert shared.success, shared
    assert shared.output["shared"] is True and shared.output["scope"] == TEAM
    entry = await kit.store.get(shared_scope_id(TEAM, colony_id=kit.colony_id), shared.output["entry_id"])
    assert entry is not None and entry.created_by == "ada" and {"shared", "ops"} <= entry.tags

    found = await bob.dispatcher.dispatch("recall_shared", {"query": "when does the build server restart?"})
    assert found.success, found
    assert found.output[0]["content"] == fact and found.output[0]["shared_by"] == "ada"
    assert found.output[0]["scope"] == TEAM
    lens = "\n".join(await bob.get_capability("shared-memory").memory_sections("build server restart"))
    assert "## Memory: shared" in lens and fact in lens

    assert_failed(
        await bob.dispatcher.dispatch("share_memory", {"fact": "I think so too."}),
        "not let agent 'bob' write",
    )
    assert_failed(
        await eve.dispatcher.dispatch("recall_shared", {"query": "build"}), "you may read no shared memory"
    )
    assert_failed(
        await eve.dispatcher.dispatch("recall_shared", {"query": "build", "scope": TEAM}),
        "does not let agent 'eve' read",
    )
    assert await eve.get_capability("shared-memory").memory_sections("build server") == []
    assert_failed(
        await ada.dispatcher.dispatch("share_memory", {"fact": "x y z w", "scope": "collective:other"}),
        "not a member of shared memory 'collective:other'",
    )
    # revoked: the next write is refused, without restarting the agent
    await kit.define(TEAM, readers=["bob"], writers=[])
    assert_failed(
        await ada.dispatcher.dispatch("share_memory", {"fact": "Another fact here."}), "'ada' write"
    )
    assert await kit.store.count(shared_scope_id(TEAM, colony_id=kit.colony_id)) == 1


async def test_a_scope_nobody_defined_is_closed_and_global_defaults_to_read_only(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada", "task:t1", "global"))
    assert_failed(
        await ada.dispatcher.dispatch("share_memory", {"fact": "Task one is half done.", "scope": "task:t1"}),
        "'task:t1' is not defined",
        "colony memory shared define task:t1",
    )
    with pytest.raises(SharedMemoryNotFound, match="define it first"):
        await kit.shared.info("task:t1")
    await kit.shared.define("global", by="test")  # default: all read, none write
    assert_failed(
        await ada.dispatcher.dispatch("share_memory", {"fact": "Hello all agents here.", "scope": "global"})
    )
    await kit.store.write(
        shared_scope_id("global", colony_id=kit.colony_id), NewMemory(content="Office closed on Friday.")
    )
    found = await ada.dispatcher.dispatch(
        "recall_shared", {"query": "is the office open friday", "scope": "global"}
    )
    assert found.success and found.output[0]["content"] == "Office closed on Friday."
    assert await kit.shared.names() == ["global"]


async def test_the_users_words_are_not_shared(kit: Kit) -> None:
    await kit.define(TEAM, readers=["*"], writers=["*"])
    ada = await kit.runtime.spawn(_blueprint("ada", TEAM))
    said = "My locker code is 7291 and I park on level three."
    await kit.store.write(
        kit.scope("ada", "working"), NewMemory(content=f"User: {said}", tags={"user", "conversation"})
    )
    for fact in (
        said,
        "User said: my locker code is 7291",
        "The user's locker code is 7291 and I park on level three.",
        "My locker code\nis 7291 and\nI park on\nlevel three.",  # split to dodge a line check
        "The user told me: locker code 7291, parks on level three, which seems relevant for the team.",
        "Locker 7291.",  # the user's number
    ):
        assert_failed(await ada.dispatcher.dispatch("share_memory", {"fact": fact}), "what the user told you")
    assert_failed(
        await ada.dispatcher.dispatch("share_memory", {"fact": "Lockers are on floor two.", "tag": "user"}),
        "user",
    )
    ok = await ada.dispatcher.dispatch("share_memory", {"fact": "Lockers on floor two are being replaced."})
    assert ok.success, ok
    assert await kit.store.count(shared_scope_id(TEAM, colony_id=kit.colony_id)) == 1


async def test_stm_flows_into_a_shared_scope_through_the_transformer_once(kit: Kit) -> None:
    await kit.define(TEAM, readers=["*"], writers=["ada"])
    ada = await kit.runtime.spawn(_blueprint("ada", TEAM, subscribe=True))
    bob = await kit.runtime.spawn(_blueprint("bob", TEAM, subscribe=True))
    team = shared_scope_id(TEAM, colony_id=kit.colony_id)
    for agent in ("ada", "bob"):
        await kit.store.write(
            kit.scope(agent, "stm"), NewMemory(content=f"User: {agent}'s secret is 42", tags={"user"})
        )
        await kit.store.write(
            kit.scope(agent, "stm"),
            NewMemory(content=f"Assistant: {agent} found the bug in parser.py", tags={"assistant"}),
        )
    member_a = ada.get_capability("memory-shared-collective-team-a")
    member_b = bob.get_capability("memory-shared-collective-team-a")
    await member_a.ingest_once()  # (or its background look did)
    assert await member_b.ingest_once() == 0  # bob may not write: its position stays
    held = await kit.store.entries(team)
    assert [e.content for e in held] == ["Assistant: ada found the bug in parser.py"]
    assert "shared" in held[0].tags and held[0].sources == [
        f"{kit.scope('ada', 'stm')}#{held[0].sources[0].split('#')[1]}"
    ]
    await member_a.ingest_once()  # (its background look may have taken them first: never twice)
    assert len(await kit.store.entries(team)) == 1
    # granted later: bob's ingestion takes up what waited
    await kit.define(TEAM, readers=["*"], writers=["ada", "bob"])
    await member_b.ingest_once()  # (or its background look did)
    assert sorted(e.content for e in await kit.store.entries(team)) == [
        "Assistant: ada found the bug in parser.py",
        "Assistant: bob found the bug in parser.py",
    ]
    # the scope's definition stays the operator's; the agents' sources are added to it
    info = await kit.shared.info(TEAM)
    assert info.writers == ["ada", "bob"] and set(info.subscribed_to) == {
        kit.scope("ada", "stm"),
        kit.scope("bob", "stm"),
    }
    memory_map = await agent_memory_map(kit.store, "ada", colony_id=kit.colony_id)
    assert team in memory_map.scopes and (kit.scope("ada", "stm"), team) in memory_map.dataflow_edges


async def test_action_records_holding_the_users_words_stay_with_the_agent(kit: Kit) -> None:
    """An agent's STM holds its action records: one of them carries the user's message (a refused
    share, a reply). Subscribed without a tag filter, the transformer leaves it out."""
    await kit.define(TEAM, readers=["*"], writers=["*"])
    ada = await kit.runtime.spawn(
        AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id="ada"),
            capabilities=[
                MemoryCapability.bind(level="working"),
                MemoryCapability.bind(level="stm"),
                SharedMemoryCapability.bind(name=TEAM, subscriptions=[share_from("stm")]),
            ],
        )
    )
    said = "My locker code is 7291 and I park on level three."
    await kit.store.write(kit.scope("ada", "working"), NewMemory(content=f"User: {said}", tags={"user"}))
    stm = kit.scope("ada", "stm")
    leak = f'Action search({{"query": "{said}"}}) succeeded: 3 results'
    for content in (leak, "Action search(parser) succeeded: the bug is in parse_header"):
        await kit.store.write(stm, NewMemory(content=content, tags={"action"}))
    await ada.get_capability("memory-shared-collective-team-a").ingest_once()  # (or its background look did)
    held = [e.content for e in await kit.store.entries(shared_scope_id(TEAM, colony_id=kit.colony_id))]
    assert held == ["Action search(parser) succeeded: the bug is in parse_header"]


def _from(source: str) -> MemoryIngestPolicy:
    return MemoryIngestPolicy(subscriptions=[MemorySubscription(source_scope_id=source)])


def test_subscriptions_never_read_shared_memory_or_another_agents() -> None:
    team = shared_scope_id(TEAM)
    with pytest.raises(ValueError, match="may not read shared memory"):
        MemoryCapability(scope_id=MemoryScope.agent("eve", "ltm:semantic"), ingestion_policy=_from(team))
    with pytest.raises(ValueError, match="may not read shared memory"):
        SharedMemoryCapability(name="collective:public", subscriptions=[share_from(team)])
    with pytest.raises(ValueError, match="only its own levels"):
        SharedMemoryCapability(
            name="collective:public", subscriptions=[share_from(MemoryScope.agent("bob", "stm"))]
        )
    assert SharedMemoryCapability(name="collective:public", subscriptions=[share_from("stm")]).shared


async def test_a_definition_changes_what_it_names_and_running_members_follow_it(kit: Kit) -> None:
    await kit.shared.define(
        TEAM, readers=["ada"], writers=["ada"], purpose="Ada's", ttl_seconds=600, max_entries=2
    )
    ada = await kit.runtime.spawn(_blueprint("ada", TEAM, subscribe=True))
    info, created = await kit.shared.define(TEAM, writers=["ada", "bob"])
    assert not created and info.readers == ["ada"] and info.purpose == "Ada's"
    assert info.ttl_seconds == 600 and info.max_entries == 2 and info.writers == ["ada", "bob"]
    await kit.shared.define(TEAM, max_entries=100)  # raised while ada runs: her ingestion keeps 100
    for n in range(6):
        await kit.store.write(
            kit.scope("ada", "stm"), NewMemory(content=f"Assistant: finding {n}", tags={"assistant"})
        )
    team = shared_scope_id(TEAM, colony_id=kit.colony_id)
    sharing = ada.get_capability("memory-shared-collective-team-a")
    for _ in range(50):  # a look of ours that raced her background look is retried (it takes nothing)
        await sharing.ingest_once()
        if await kit.store.count(team) == 6:
            break
    assert await kit.store.count(team) == 6
    assert all(e.expires_at is not None for e in await kit.store.entries(team))  # the definition's TTL
    # a scope defined after its member started: the member takes the definition at its next look
    bob = await kit.runtime.spawn(_blueprint("bob", "task:late", subscribe=True))
    await kit.store.write(
        kit.scope("bob", "stm"), NewMemory(content="Assistant: late finding", tags={"assistant"})
    )
    member = bob.get_capability("memory-shared-task-late")
    assert await member.ingest_once() == 0
    await kit.shared.define("task:late", writers=["bob"], ttl_seconds=60, max_entries=3)
    await member.ingest_once()  # (or its background look did)
    [late] = await kit.store.entries(shared_scope_id("task:late", colony_id=kit.colony_id))
    assert late.expires_at is not None and late.expires_at - late.created_at <= 61
    assert (await kit.shared.info("task:late")).subscribed_to == [kit.scope("bob", "stm")]


async def test_concurrent_definitions_create_once(kit: Kit) -> None:
    outcomes = await asyncio.gather(*(kit.shared.define("task:t9", writers=[f"a{n}"]) for n in range(5)))
    assert sorted(created for _, created in outcomes) == [False] * 4 + [True]
    assert await kit.shared.names() == ["task:t9"]


async def test_the_cap_on_shared_scopes_holds_for_concurrent_creators(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the count was read outside the definition's transaction and the list was
    trimmed to the cap, so creators racing at the cap all passed and the oldest scope fell out of
    the listing while it stayed defined."""
    import colony.memory.shared as shared_module

    monkeypatch.setattr(shared_module, "MAX_SHARED_SCOPES", 6)
    with pytest.raises(ValidationError):  # a bad definition takes no place in the list
        await kit.shared.define("task:bad", readers=["not an id"])
    assert await kit.shared.names() == []
    await kit.shared.define("collective:first")
    for n in range(4):
        await kit.shared.define(f"task:t{n}")
    outcomes = await asyncio.gather(
        *(kit.shared.define(f"collective:late{n}") for n in range(5)), return_exceptions=True
    )
    made = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(made) == 1 and len(refused) == 4, outcomes
    assert all(isinstance(e, InvalidArgument) and "the most it keeps" in str(e) for e in refused)
    names = await kit.shared.names()
    assert len(names) == 6 and names[0] == "collective:first"
    for n in range(5):  # a refused creator defined nothing
        name = f"collective:late{n}"
        if name not in names:
            with pytest.raises(SharedMemoryNotFound):
                await kit.shared.info(name)
    again = await kit.shared.define("collective:first", purpose="still here")  # a defined one changes
    assert again[1] is False and again[0].purpose == "still here"
    assert (await kit.shared.define("task:t0", readers=["a"]))[0].readers == ["a"]


async def test_the_memory_map_shows_shared_scopes_only_to_their_readers(kit: Kit) -> None:
    await kit.define(TEAM, readers=["ada"], writers=["ada"])
    extra = [MemoryToolsCapability.bind()]
    ada = await kit.runtime.spawn(_blueprint("ada", TEAM, extra=extra))
    eve = await kit.runtime.spawn(_blueprint("eve", TEAM, extra=extra))
    assert (await ada.dispatcher.dispatch("share_memory", {"fact": "Project Zeus starts in May."})).success
    team = shared_scope_id(TEAM, colony_id=kit.colony_id)
    seen = {a.agent_id: (await a.dispatcher.dispatch("memory_map", {})).output["scopes"] for a in (ada, eve)}
    assert team in seen["ada"] and team not in seen["eve"]
    assert kit.scope("eve", "working") in seen["eve"]


QUESTIONS_AND_FINDINGS = [
    ("what does parse_header return?", "parse_header returns the header unchanged"),
    (
        "What does parse_header_value_list return?",
        "parse_header_value_list in email/_header_value_parser.py returns a list of tokens",
    ),
    ("Why does the server return 500?", "The handler raises KeyError, which becomes a 500."),
    (
        "Why does login fail when the password is empty?",
        "validate() raises KeyError when the password is empty because of the lookup on line 40",
    ),
    ("Look at colony/memory/shared.py", "colony/memory/shared.py defines SharedScopes"),
    ("I need to know which port Redis listens on.", "Redis listens on 6379 by default."),
]


@pytest.mark.parametrize(("asked", "finding"), QUESTIONS_AND_FINDINGS)
def test_a_finding_about_what_the_user_asked_may_be_shared(asked: str, finding: str) -> None:
    assert UserWords([asked, f"User: {asked}"]).retold_by(finding) is None


@pytest.mark.parametrize(
    "text",
    [
        "Locker code 7 2 9 1",
        "Locker code 72-91",
        "Locker code 7,291",
        "Sister: Dana\nCity: Oslo\nEmployer: Equinor",
        "Someone's relative, by all accounts a skilled engineer of many years, lives in Oslo now.",
        "My locker code\nis 7291 and\nI park on\nlevel three.",
        "they park on level three and the locker code is known",
        "User said: nothing much",
    ],
)
def test_the_users_statements_are_not_retold_however_written(text: str) -> None:
    said = [
        "User: My locker code is 7291 and I park on level three.",
        "My sister Dana lives in Oslo and works at Equinor.",
    ]
    assert UserWords(said).retold_by(text) is not None, text


async def test_an_agent_without_write_access_leaves_the_definition_alone(kit: Kit) -> None:
    await kit.define(TEAM, readers=["ada"], writers=["ada"])
    eve = await kit.runtime.spawn(_blueprint("eve", TEAM, subscribe=True))
    await eve.get_capability("memory-shared-collective-team-a").ingest_once()
    assert (await kit.shared.info(TEAM)).subscribed_to == []
    await kit.shared.define(TEAM, ttl_seconds=60)
    assert (await kit.shared.info(TEAM)).ttl_seconds == 60
    await kit.shared.define(TEAM, ttl_seconds=0)  # 0: no TTL any more
    assert (await kit.shared.info(TEAM)).ttl_seconds is None
