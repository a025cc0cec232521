"""Agents manage their own blocks through tools, against a real redis-server: create and delete,
share with another agent and take it back, swap a working block out of the prompt and in, and file
archival memory under a label. Every refusal is a failed action result that names the reason and
changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import assert_failed

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime
from colony.agents.state.action_log import _IDEMPOTENCY_KEY
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.memory.blocks.manage import SWAPPED_HEADER, BlockManagementCapability
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.tools import TOOL_LOG, MemoryBlocksCapability
from colony.memory.blocks.types import SYSTEM, BlockType, NewBlock, SharedAccess
from colony.memory.capability import MemoryCapability


def _blueprint(agent_id: str, *, blocks: bool = True, **options: Any) -> AgentBlueprint:
    capabilities: list[Any] = [
        MemoryCapability.bind(level="working"),
        MemoryCapability.bind(level="ltm:semantic"),
    ]
    if blocks:
        capabilities.append(
            MemoryBlocksCapability.bind(
                templates=["human"],
                blocks=[NewBlock(label="persona", content="I am helpful.", block_type=BlockType.CORE)],
                **options,
            )
        )
    capabilities.append(BlockManagementCapability.bind())
    return AgentBlueprint(
        agent_class=Agent, metadata=AgentMetadata(agent_id=agent_id), capabilities=capabilities
    )


class Kit:
    def __init__(self, bb: Blackboard, tmp_path: Path) -> None:
        self.colony_id = f"c{uuid.uuid4().hex[:10]}"
        self.runtime = LocalAgentRuntime(
            bb, colony_id=self.colony_id, settings=ColonySettings(data_dir=tmp_path)
        )
        self.store = BlockStore(bb.redis, ColonySettings(colony_id=self.colony_id))

    async def labels(self, owner: str) -> set[str]:
        return {info.label for info in await self.store.list_owned(owner)}

    async def seen_by(self, agent_id: str) -> dict[str, SharedAccess]:
        return {info.label: access for info, access in await self.store.list_for(agent_id)}


@pytest.fixture
async def kit(bb: Blackboard, tmp_path: Path) -> AsyncIterator[Kit]:
    made = Kit(bb, tmp_path)
    yield made
    await made.runtime.shutdown()


async def test_an_agent_creates_and_deletes_its_own_blocks_and_only_those(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = ada.dispatcher.dispatch
    made = await dispatch(
        "block_create", {"label": "plans", "description": "What I plan to do next", "content": "Step 1: read"}
    )
    assert made.success, made
    assert made.output == {
        "label": "plans",
        "block_type": "working",
        "char_limit": 5000,
        "swapped_out": False,
        "created": True,
    }
    view = await kit.store.read("ada", "plans")
    assert view.content == "Step 1: read\n" and view.info.created_by == "ada"
    sections = "\n".join(await ada.get_capability("memory_blocks").memory_sections())
    assert "<plans>" in sections and "Step 1: read" in sections

    # a create redone under its action's key finds its untouched block and reports it made; the same
    # create outside that action, one asking for other content or limit, or one after an edit is refused
    asked = {"label": "drafts", "description": "Drafts", "content": "first draft", "char_limit": 300}
    key = _IDEMPOTENCY_KEY.set("run-a:1:a0")
    try:
        assert (await dispatch("block_create", asked)).success
        assert (await dispatch("block_create", asked)).success  # the redo
        for other in ({"content": "TOTALLY DIFFERENT"}, {"char_limit": 100}, {"description": "Other"}):
            assert_failed(
                await dispatch("block_create", {**asked, **other}), "already has a block labelled 'drafts'"
            )
    finally:
        _IDEMPOTENCY_KEY.reset(key)
    assert_failed(await dispatch("block_create", asked), "already has a block labelled 'drafts'")
    assert (await kit.store.read("ada", "drafts")).content == "first draft\n"
    assert (await dispatch("core_memory_append", {"label": "plans", "content": "Step 2: write"})).success
    key = _IDEMPOTENCY_KEY.set("run-b:1:a0")
    try:
        assert_failed(
            await dispatch("block_create", {"label": "plans", "description": "What I plan to do next"}),
            "already has a block labelled 'plans'",
        )
    finally:
        _IDEMPOTENCY_KEY.reset(key)
    assert (await dispatch("block_delete", {"label": "drafts"})).success
    assert_failed(await dispatch("block_create", {"label": "Bad Label", "description": "x"}), "label")
    assert_failed(await dispatch("block_create", {"label": "big", "description": "x", "kind": "log"}), "kind")

    # blocks made for the agent (blueprint, template, system log) are not its to delete
    for label in ("persona", "human", TOOL_LOG):
        assert_failed(await dispatch("block_delete", {"label": label}), f"block {label!r} was made for you")
    assert_failed(await dispatch("block_delete", {"label": "nothing"}), "no block labelled 'nothing'")
    assert await kit.labels("ada") == {"persona", "human", "plans", TOOL_LOG}

    deleted = await dispatch("block_delete", {"label": "plans"})
    assert deleted.success and deleted.output == {"label": "plans", "deleted": True}
    assert await kit.labels("ada") == {"persona", "human", TOOL_LOG}
    assert_failed(await dispatch("block_delete", {"label": "plans"}), "no block labelled 'plans'")


async def test_sharing_follows_the_access_rules_and_unsharing_takes_the_block_away(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada"))
    bob = await kit.runtime.spawn(_blueprint("bob"))
    share, bob_do = ada.dispatcher.dispatch, bob.dispatcher.dispatch
    assert (await share("block_create", {"label": "board", "description": "Shared task board"})).success

    granted = await share("block_share", {"label": "board", "agent_id": "bob"})
    assert granted.success and granted.output == {"label": "board", "agent_id": "bob", "access": "read_only"}
    assert (await kit.seen_by("bob"))["board"] is SharedAccess.READ_ONLY
    assert "<board>" in "\n".join(await bob.get_capability("memory_blocks").memory_sections())
    assert_failed(
        await bob_do("core_memory_append", {"label": "board", "content": "bob was here"}), "read-only"
    )

    # sharing again changes the access: append-only lets bob add a line at the end
    assert (
        await share("block_share", {"label": "board", "agent_id": "bob", "access": "append_only"})
    ).success
    assert (await bob_do("core_memory_append", {"label": "board", "content": "bob: tests done"})).success
    assert (await kit.store.read(SYSTEM, "board", owner="ada")).content == "bob: tests done\n"

    # refusals, each naming its reason; nothing changes
    assert_failed(
        await bob_do("block_share", {"label": "board", "agent_id": "carol"}), "ada's block, shared with you"
    )
    assert_failed(await bob_do("block_delete", {"label": "board"}), "only its owner")
    assert_failed(await bob_do("block_swap_out", {"label": "board"}), "only its owner")
    assert_failed(
        await share("block_share", {"label": "human", "agent_id": "bob"}), "holds what the user told you"
    )
    # ... nor another block quoting the user (found by review: the rule checked the label only)
    notes = {"label": "notes", "description": "My notes", "content": "User said: My password is hunter2"}
    assert (await share("block_create", notes)).success
    assert_failed(
        await share("block_share", {"label": "notes", "agent_id": "bob"}), "holds what the user told you"
    )
    assert_failed(await share("block_share", {"label": "board", "agent_id": "nobody"}), "no agent 'nobody'")
    assert_failed(await share("block_share", {"label": "board", "agent_id": "ada"}), "your own blocks")
    assert_failed(
        await share("block_share", {"label": "board", "agent_id": "bob", "access": "owner"}), "access"
    )
    assert_failed(await share("block_share", {"label": "board", "agent_id": "x:y"}), "agent_id")
    assert await kit.store.shares_of("ada", "board") == {"bob": SharedAccess.APPEND_ONLY}

    taken = await share("block_unshare", {"label": "board", "agent_id": "bob"})
    assert taken.success and "board" not in await kit.seen_by("bob")
    assert_failed(
        await share("block_unshare", {"label": "board", "agent_id": "bob"}), "not shared with bob", "nobody"
    )

    # deleting a shared block takes it from every view
    assert (await share("block_share", {"label": "board", "agent_id": "bob"})).success
    assert (await share("block_delete", {"label": "board"})).success
    assert "board" not in await kit.seen_by("bob")


async def test_a_working_block_swaps_out_of_the_prompt_and_back(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = ada.dispatcher.dispatch
    blocks, manage = ada.get_capability("memory_blocks"), ada.get_capability("block_management")
    assert (
        await dispatch("block_create", {"label": "draft", "description": "A long draft", "content": "v1"})
    ).success
    assert await manage.memory_sections() == []

    out = await dispatch("block_swap_out", {"label": "draft"})
    assert out.success and out.output["swapped_out"] is True
    assert "<draft>" not in "\n".join(await blocks.memory_sections())
    (listed,) = await manage.memory_sections()
    assert listed.startswith(SWAPPED_HEADER) and "- draft: A long draft" in listed
    assert (await kit.store.read("ada", "draft")).content == "v1\n"  # kept, only out of the prompt

    back = await dispatch("block_swap_in", {"label": "draft"})
    assert back.success and back.output["swapped_out"] is False
    assert "<draft>" in "\n".join(await blocks.memory_sections())
    assert await manage.memory_sections() == []
    assert_failed(await dispatch("block_swap_out", {"label": "persona"}), "core block, always in your prompt")
    assert_failed(await dispatch("block_swap_in", {"label": "missing"}), "no block labelled 'missing'")


async def test_an_archival_label_is_one_of_the_tags_and_cannot_be_faked(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = ada.dispatcher.dispatch
    ten = [f"t{n}" for n in range(10)]
    assert_failed(
        await dispatch("archival_insert", {"content": "a note", "tags": ten, "label": "x"}), "a label counted"
    )
    assert_failed(
        await dispatch("archival_insert", {"content": "a note", "tags": ["label:x"]}), "kept for `label`"
    )
    assert (await dispatch("archival_read", {"label": "x"})).output == []


async def test_archival_memory_is_filed_and_read_by_label(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = ada.dispatcher.dispatch
    filed = {
        "recipes": ["Pancakes need two eggs and a cup of milk.", "Bread rises for an hour before baking."],
        "travel": ["The train to Leeds leaves at nine on Mondays."],
    }
    for label, contents in filed.items():
        for content in contents:
            stored = await dispatch("archival_insert", {"content": content, "label": label})
            assert stored.success and stored.output["stored"], stored
    assert (await dispatch("archival_insert", {"content": "Unfiled note about the weather today."})).success

    recipes = await dispatch("archival_read", {"label": "recipes"})
    assert recipes.success
    assert sorted(item["content"] for item in recipes.output) == sorted(filed["recipes"])
    assert all("label:recipes" in item["tags"] for item in recipes.output)
    found = await dispatch("archival_search", {"query": "when does the train leave", "label": "travel"})
    assert [item["content"] for item in found.output] == filed["travel"]
    narrowed = await dispatch("archival_search", {"query": "when does the train leave", "label": "recipes"})
    assert {item["content"] for item in narrowed.output} <= set(filed["recipes"])
    assert (await dispatch("archival_read", {"label": "nothing_here"})).output == []
    assert_failed(await dispatch("archival_read", {"label": "Not A Label"}), "label")


async def test_a_created_user_block_holds_only_what_the_user_said_and_tools_need_blocks(kit: Kit) -> None:
    ada = await kit.runtime.spawn(_blueprint("ada", user_blocks=["diary"]))
    assert_failed(
        await ada.dispatcher.dispatch(
            "block_create",
            {"label": "diary", "description": "What the user told me", "content": "Her name is Zoe."},
        ),
        "block 'diary'",
    )
    assert "diary" not in await kit.labels("ada")
    assert_failed(
        await ada.dispatcher.dispatch("block_share", {"label": "diary", "agent_id": "ada"}), "no block"
    )

    bare = await kit.runtime.spawn(_blueprint("bare", blocks=False))
    assert_failed(
        await bare.dispatcher.dispatch("block_create", {"label": "x", "description": "y"}),
        "add MemoryBlocksCapability",
    )


async def test_the_users_words_never_reach_a_block_other_agents_see_whenever_it_was_shared(kit: Kit) -> None:
    """Found by review: the rule was checked at the share only, so an agent could share an empty
    block and then write the user's message into it, or save it into another agent's block."""
    from colony.agents.models import AgentRun

    ada = await kit.runtime.spawn(_blueprint("ada"))
    bob = await kit.runtime.spawn(_blueprint("bob"))
    told = "My bank PIN is 7291 and I live at 12 Elm Street"
    ada.current_run = AgentRun(agent_id="ada", input={"task": told})
    do = ada.dispatcher.dispatch
    assert (await do("block_create", {"label": "notes", "description": "my notes"})).success
    assert (await do("block_share", {"label": "notes", "agent_id": "bob", "access": "read_only"})).success

    # shared first, written later: every edit tool refuses the user's words there
    assert_failed(await do("core_memory_save_message", {"label": "notes"}), "seen by other agents", "human")
    assert_failed(await do("core_memory_append", {"label": "notes", "content": told}), "seen by other agents")
    inserted = await do("memory_insert", {"label": "notes", "content": f"{told}."})
    assert_failed(inserted, "seen by other agents")
    rethought = await do("memory_rethink", {"label": "notes", "new_content": "User said: PIN 7291"})
    assert_failed(rethought, "seen by other agents")
    # the agent's own words still go there, and its own private `human` block takes the message
    own_words = {"label": "notes", "content": "Checked the release plan."}
    assert (await do("core_memory_append", own_words)).success
    assert (await do("core_memory_save_message", {"label": "human"})).success
    assert "7291" not in (await kit.store.read("bob", "notes")).content
    assert "7291" in (await kit.store.read(SYSTEM, "human", owner="ada")).content

    # another agent's block shared with ada (append-only) takes none of the user's words either
    board = {"label": "board", "description": "team board"}
    assert (await bob.dispatcher.dispatch("block_create", board)).success
    shared = {"label": "board", "agent_id": "ada", "access": "append_only"}
    assert (await bob.dispatcher.dispatch("block_share", shared)).success
    assert_failed(await do("core_memory_save_message", {"label": "board"}), "seen by other agents")
    assert_failed(await do("core_memory_append", {"label": "board", "content": told}), "seen by other agents")
    assert (await do("core_memory_append", {"label": "board", "content": "ada: review done"})).success
    assert (await kit.store.read("bob", "board")).content == "ada: review done\n"

    # a block shared by nobody takes the message as before
    assert (await do("block_create", {"label": "mine", "description": "private"})).success
    assert (await do("core_memory_save_message", {"label": "mine"})).success
