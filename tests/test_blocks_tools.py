"""Memory-block tools of a planner against a real redis-server: each edit tool, refused edits
(limit, read-only, append-only, not shared, no unique match) as failed action results that change
nothing, archival memory in the agent's LTM scope found by archival_search and recall, the rolling
tool log, the prompt section the planner sees, and block templates."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime, ScriptedActionPolicy
from colony.agents.blueprint import CapabilitySpec
from colony.agents.models import AgentRun
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference.scripted import ScriptedEngine
from colony.memory.blocks.rendering import render_blocks
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.templates import apply_template, load_templates
from colony.memory.blocks.tools import EVENT_LOG, TOOL_LOG, MemoryBlocksCapability
from colony.memory.blocks.types import OPERATOR, SYSTEM, BlockType, NewBlock, SharedAccess
from colony.memory.capability import MemoryCapability
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.tools import MemoryToolsCapability
from colony.memory.types import NewMemory
from colony.planning.policies import StructuredActionPolicy

PERSONA = {"name": "Ada", "traits": ["curious", "kind"], "style": "brief"}


def _blueprint(agent_id: str, *, ltm: bool = True, policy: Any = None, **blocks: Any) -> AgentBlueprint:
    memory = [MemoryCapability.bind(level="working")]
    if ltm:
        memory.append(MemoryCapability.bind(level="ltm:semantic"))
    options: dict[str, Any] = {
        "templates": [("persona", PERSONA), "human"],
        "blocks": [
            NewBlock(label="notes", content="first line", char_limit=40),
            NewBlock(label="rules", content="be kind", read_only=True, block_type=BlockType.CORE),
        ],
        **blocks,
    }
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[*memory, MemoryBlocksCapability.bind(**options)],
        action_policy=policy,
    )


class Kit:
    """A runtime in a colony of its own (the runtime's settings name another colony: the blocks
    must still land in the agent's), and a store that looks at that colony from outside."""

    def __init__(self, bb: Blackboard, tmp_path: Path, **services: Any) -> None:
        self.colony_id = f"c{uuid.uuid4().hex[:10]}"
        self.runtime = LocalAgentRuntime(
            bb, colony_id=self.colony_id, settings=ColonySettings(data_dir=tmp_path), **services
        )
        self.store = BlockStore(bb.redis, ColonySettings(colony_id=self.colony_id))

    async def content(self, owner: str, label: str) -> str:
        return (await self.store.read(SYSTEM, label, owner=owner)).content

    async def head(self, owner: str, label: str) -> int:
        return (await self.store.history(SYSTEM, label, owner=owner)).head


@pytest.fixture
async def kit(bb: Blackboard, tmp_path: Path) -> AsyncIterator[Kit]:
    made = Kit(bb, tmp_path)
    yield made
    await made.runtime.shutdown()


async def test_blocks_and_templates_are_created_once_and_each_tool_edits_as_the_agent(kit: Kit) -> None:
    agent = await kit.runtime.spawn(_blueprint("ada"))
    owned = {i.label: i for i in await kit.store.list_owned("ada")}
    assert set(owned) == {"persona", "human", "notes", "rules", TOOL_LOG}
    assert owned["persona"].block_type is BlockType.CORE and owned["persona"].template == "persona"
    assert owned[TOOL_LOG].block_type is BlockType.LOG
    assert await kit.content("ada", "persona") == "Name: Ada\nTraits: curious, kind\nStyle: brief\n"

    dispatch = agent.dispatcher.dispatch
    result = await dispatch("core_memory_append", {"label": "human", "content": "Name: Bob"})
    assert result.success, result
    assert result.output == {"label": "human", "owner": "ada", "version": 2, "chars": 9, "char_limit": 2000}
    assert (await dispatch("core_memory_append", {"label": "human", "content": "Likes tea"})).success
    assert await kit.content("ada", "human") == "Name: Bob\nLikes tea\n"  # appended lines end with a break
    assert (
        await dispatch(
            "core_memory_replace", {"label": "human", "old_content": "tea", "new_content": "green tea"}
        )
    ).success
    assert (await dispatch("memory_insert", {"label": "human", "content": "Pronouns: he", "line": 1})).success
    assert (await dispatch("memory_insert", {"label": "human", "content": "From: Leeds"})).success
    assert await kit.content("ada", "human") == "Name: Bob\nPronouns: he\nLikes green tea\nFrom: Leeds\n"
    assert (await dispatch("memory_rethink", {"label": "human", "new_content": "Bob, from Leeds"})).success
    assert await kit.content("ada", "human") == "Bob, from Leeds\n"
    history = await kit.store.history(SYSTEM, "human", owner="ada")
    assert [v.op for v in history.versions] == [
        "create",
        "append",
        "append",
        "replace",
        "insert",
        "insert",
        "rethink",
    ]
    assert {(v.author, v.via) for v in history.versions[1:]} == {("ada", "tool")}

    # start again (a restore): existing blocks keep their edits
    await agent.get_capability("memory_blocks").start()
    assert await kit.content("ada", "human") == "Bob, from Leeds\n"
    assert await kit.head("ada", "human") == history.head


async def test_refused_edits_fail_with_the_reason_and_change_nothing(kit: Kit) -> None:
    agent = await kit.runtime.spawn(_blueprint("ada"))
    await kit.store.create("lead", NewBlock(label="board", content="task 1"))
    await kit.store.share(OPERATOR, "lead", "board", "ada", SharedAccess.APPEND_ONLY)
    await kit.store.create("lead", NewBlock(label="charter", content="we ship"))
    await kit.store.share(OPERATOR, "lead", "charter", "ada", SharedAccess.READ_ONLY)
    await kit.store.create("zed", NewBlock(label="diary", content="secret"))  # not shared with ada
    await kit.store.append("ada", "notes", "second line")  # "line" now occurs twice

    cases = [
        # (action, parameters, owner of the block, what the error must say)
        (
            "core_memory_append",
            {"label": "notes", "content": "x" * 30},
            "ada",
            ["would have", "/40", "memory_rethink"],
        ),
        (
            "core_memory_replace",
            {"label": "notes", "old_content": "nope", "new_content": "y"},
            "ada",
            ["does not occur", "copy the exact text"],
        ),
        (
            "core_memory_replace",
            {"label": "notes", "old_content": "line", "new_content": "y"},
            "ada",
            ["occurs 2 times", "more surrounding text"],
        ),
        ("memory_insert", {"label": "notes", "content": "z", "line": 7}, "ada", ["line 7 is outside"]),
        ("memory_rethink", {"label": "rules", "new_content": "be mean"}, "ada", ["read-only", "operator"]),
        (
            "core_memory_append",
            {"label": TOOL_LOG, "content": "forged"},
            "ada",
            ["log the system writes", "read-only"],
        ),
        (
            "core_memory_replace",
            {"label": "board", "old_content": "task 1", "new_content": "done"},
            "lead",
            ["append-only", "add text at its end only"],
        ),
        (
            "memory_insert",
            {"label": "board", "content": "NOT", "line": 0},
            "lead",
            ["append-only", "not insert"],
        ),
        (
            "memory_rethink",
            {"label": "board", "new_content": "wiped"},
            "lead",
            ["append-only", "core_memory_append"],
        ),
        (
            "core_memory_append",
            {"label": "charter", "content": "we sleep"},
            "lead",
            ["read-only access", "cannot be changed"],
        ),
        (
            "core_memory_append",
            {"label": "diary", "content": "x"},
            "zed",
            ["sees no block labelled 'diary'", "Your writable blocks: board, human, notes, persona"],
        ),
        ("core_memory_append", {"label": "Bad Label", "content": "x"}, None, ["label"]),
        ("core_memory_append", {"label": "notes", "content": "x" * 20_001}, "ada", ["20000"]),
    ]
    for action, params, owner, reasons in cases:
        label = params["label"]
        if label == TOOL_LOG:  # the refusal itself is logged there (by the system): checked below
            owner = None
        before = (await kit.content(owner, label), await kit.head(owner, label)) if owner else None
        result = await agent.dispatcher.dispatch(action, params)
        assert not result.success, (action, params, result)
        for reason in reasons:
            assert reason in (result.error or ""), (action, params, result.error)
        if owner:
            assert (await kit.content(owner, label), await kit.head(owner, label)) == before, (action, params)

    log_versions = (await kit.store.history(SYSTEM, TOOL_LOG, owner="ada")).versions
    assert {v.author for v in log_versions} == {SYSTEM} and "forged" not in await kit.content("ada", TOOL_LOG)

    # what append-only access allows still works, as the error says
    assert (
        await agent.dispatcher.dispatch("core_memory_append", {"label": "board", "content": "task 2"})
    ).success
    assert await kit.content("lead", "board") == "task 1\ntask 2\n"


async def test_archival_memory_is_the_ltm_scope_and_recall_reads_conversation_too(kit: Kit) -> None:
    agent = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = agent.dispatcher.dispatch
    stored = await dispatch(
        "archival_insert", {"content": "Ada's favourite colour is teal.", "tags": ["colour"]}
    )
    assert stored.success and stored.output["stored"] and stored.output["scope"] == "ltm:semantic", stored
    memory = MemoryStore(kit.runtime.blackboard, ColonySettings())
    ltm = MemoryScope.agent("ada", "ltm:semantic", colony_id=kit.colony_id)
    working = MemoryScope.agent_working("ada", colony_id=kit.colony_id)
    [entry] = await memory.entries(ltm)
    assert entry.content == "Ada's favourite colour is teal." and entry.tags == {"archival", "colour"}
    assert entry.kind == "archival" and entry.entry_id == stored.output["entry_id"]
    await memory.write(
        working, NewMemory(content="User: I am flying to Lisbon on Friday.", kind="conversation")
    )

    found = await dispatch("archival_search", {"query": "what colour does Ada like best", "limit": 3})
    assert found.success and found.output[0]["content"] == "Ada's favourite colour is teal.", found
    assert all(item["scope"] == "ltm:semantic" for item in found.output)  # archival only
    recalled = await dispatch("recall", {"query": "when is the trip to Lisbon", "limit": 3})
    assert recalled.success and recalled.output[0]["content"].endswith("Lisbon on Friday."), recalled
    assert recalled.output[0]["scope"] == "working"
    both = await dispatch("recall", {"query": "Ada's favourite colour", "limit": 5})
    assert {item["scope"] for item in both.output} == {"ltm:semantic", "working"}

    forgetful = await kit.runtime.spawn(_blueprint("no-ltm", ltm=False))
    refused = await forgetful.dispatcher.dispatch("archival_insert", {"content": "a fact to keep"})
    assert not refused.success and "no long-term memory" in refused.error and "working" in refused.error


async def test_the_tool_log_has_one_entry_per_action_and_the_agent_cannot_edit_it(kit: Kit) -> None:
    agent = await kit.runtime.spawn(_blueprint("ada"))
    dispatch = agent.dispatcher.dispatch
    await dispatch("core_memory_append", {"label": "human", "content": "Name: Bob"})
    await dispatch("core_memory_replace", {"label": "human", "old_content": "Zed", "new_content": "x"})
    await dispatch("no_such_action", {})
    await dispatch("core_memory_append", {"label": TOOL_LOG, "content": "I did nothing wrong"})
    view = await kit.store.read("ada", TOOL_LOG)
    assert [(e["tool"], e["success"]) for e in view.entries or []] == [
        ("core_memory_append", True),
        ("core_memory_replace", False),
        ("no_such_action", False),
        ("core_memory_append", False),
    ]
    assert view.entries[0]["text"].startswith("core_memory_append ok: ")
    assert "does not occur" in view.entries[1]["text"]
    assert "I did nothing wrong" not in view.content
    history = await kit.store.history(SYSTEM, TOOL_LOG, owner="ada")
    assert {v.author for v in history.versions} == {SYSTEM}

    quiet = await kit.runtime.spawn(_blueprint("quiet", tool_log=False))
    await quiet.dispatcher.dispatch("core_memory_append", {"label": "human", "content": "x"})
    assert TOOL_LOG not in {i.label for i in await kit.store.list_owned("quiet")}


async def test_memory_sections_show_every_block_the_agent_sees(kit: Kit) -> None:
    bare = await kit.runtime.spawn(_blueprint("bare", templates=[], blocks=[], tool_log=False))
    assert await bare.get_capability("memory_blocks").memory_sections("task") == []  # sees no block
    agent = await kit.runtime.spawn(_blueprint("ada"))
    capability = agent.get_capability("memory_blocks")
    await kit.store.create("lead", NewBlock(label="board", content="task 1"))
    await kit.store.share(OPERATOR, "lead", "board", "ada", SharedAccess.APPEND_ONLY)
    await kit.store.create_colony_block(
        NewBlock(label="mission", content="help people"), SharedAccess.READ_ONLY
    )
    await kit.store.create("ada", NewBlock(label="archive", content="old"))
    update_info = kit.store.update_info
    await update_info("ada", "archive", swapped_out=True)
    await agent.dispatcher.dispatch("core_memory_append", {"label": "notes", "content": "more"})

    [section] = await capability.memory_sections("any task")
    assert section == render_blocks(await capability.views())
    assert section.startswith("## Memory blocks\n\n<human>\n")
    assert (
        "<persona>\nStores details about your current persona, guiding how you behave and respond\n"
        "chars: 44/2000\nName: Ada\nTraits: curious, kind\nStyle: brief\n</persona>"
    ) in section
    assert (
        "<human>\nStores key details about the person you are conversing with\nchars: 0/2000\n</human>"
        in section
    )
    assert "<board>\n(no description)\nchars: 6/5000, append-only\ntask 1\n</board>" in section
    assert "<mission>\n(no description)\nchars: 11/5000, read-only\nhelp people\n</mission>" in section
    assert "<rules>\n(no description)\nchars: 7/5000, read-only\nbe kind\n</rules>" in section
    assert "<notes>\n(no description)\nchars: 15/40\nfirst line\nmore\n</notes>" in section
    assert (
        "<tool_log>\nThe actions you ran most recently and how they went; the system writes it, you cannot "
        "edit it\nentries: 1/1, read-only\n- [tool] core_memory_append ok: "
    ) in section
    assert "archive" not in section
    order = [
        line[1:-1] for line in section.splitlines() if line.startswith("<") and not line.startswith("</")
    ]
    assert order == ["human", "persona", "rules", "board", "mission", "notes", TOOL_LOG]

    # an agent with no block of its own sees the colony's
    [only_colony] = await bare.get_capability("memory_blocks").memory_sections("task")
    assert (
        only_colony == "## Memory blocks\n\n<mission>\n(no description)\nchars: 11/5000, read-only\n"
        "help people\n</mission>"
    )


async def test_the_planner_sees_its_blocks_and_its_own_edit_on_the_next_step(
    bb: Blackboard, tmp_path: Path
) -> None:
    engine = ScriptedEngine(
        [
            {"action": "core_memory_append", "parameters": {"label": "human", "content": "Name: Ada"}},
            {"action": "finish", "parameters": {"answer": "noted"}},
        ]
    )
    kit = Kit(bb, tmp_path, engine=engine)
    try:
        policy = StructuredActionPolicy.bind(goals=["Remember what the user tells you."])
        agent = await kit.runtime.spawn(_blueprint("planner", policy=policy))
        run = await agent.run("My name is Ada.")
        assert run.output == "noted", run
        first, second = (r.messages[-1].content for r in engine.requests[:2])
        assert (
            "<human>\nStores key details about the person you are conversing with\nchars: 0/2000\n</human>"
            in first
        )
        assert "chars: 9/2000\nName: Ada\n</human>" in second
        assert "- [tool] core_memory_append ok:" in second
        assert "core_memory_append(label: string, content: string)" in first
    finally:
        await kit.runtime.shutdown()


async def test_recall_is_excluded_from_one_of_two_capabilities_that_offer_it(kit: Kit) -> None:
    def blueprint(agent_id: str, exclude: list[str] | None) -> AgentBlueprint:
        return AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id=agent_id),
            capabilities=[
                MemoryCapability.bind(level="working"),
                MemoryToolsCapability.bind(),
                CapabilitySpec(blueprint=MemoryBlocksCapability.bind(), exclude_actions=exclude),
            ],
        )

    with pytest.raises(AgentUsageError, match="recall"):
        await kit.runtime.spawn(blueprint("both", None))
    agent = await kit.runtime.spawn(blueprint("both-ok", ["recall"]))
    assert agent.dispatcher.get("recall").capability == "memory"
    assert agent.dispatcher.get("archival_search").capability == "memory_blocks"

    hidden = await kit.runtime.spawn(_blueprint("no-recall", include_recall=False))
    planned = {spec.name for spec in hidden.dispatcher.planning_actions()}
    assert "recall" not in planned and {"archival_search", "core_memory_append"} <= planned
    refused = await hidden.dispatcher.dispatch("recall", {"query": "anything"})
    assert not refused.success and "use archival_search" in refused.error


def test_templates_validate_their_fields_and_render_the_content(tmp_path: Path) -> None:
    assert set(load_templates()) == {"persona", "human", "scratchpad", "organization", "custom"}
    persona = apply_template("persona", PERSONA | {"guidelines": "Answer in one line."})
    assert (
        persona.block_type is BlockType.CORE and persona.char_limit == 2000 and persona.template == "persona"
    )
    assert (
        persona.description == "Stores details about your current persona, guiding how you behave and respond"
    )
    assert (
        persona.content == "Name: Ada\nTraits: curious, kind\nStyle: brief\nGuidelines: Answer in one line."
    )
    human = apply_template("human", None, label="user")
    assert human.label == "user" and human.content == ""
    assert human.description == "Stores key details about the person you are conversing with"
    pad = apply_template("scratchpad", {"current_task": "book a train"}, char_limit=300)
    assert (
        pad.block_type is BlockType.WORKING
        and pad.char_limit == 300
        and pad.content == "Current task: book a train"
    )
    org = apply_template("organization", {"name": "Acme", "policies": "No refunds."})
    assert org.read_only and org.content == "Name: Acme\nPolicies: No refunds."

    refusals = [
        (("persona", {"name": 5}), {}, "name: 5 is not of type 'string'"),
        (("persona", {"traits": "curious"}), {}, "traits: 'curious' is not of type 'array'"),
        (("persona", {"nmae": "Ada"}), {}, "'nmae' was unexpected"),
        (("organization", {}), {}, "'name' is a required property"),
        (("persona", ["Ada"]), {}, "must be a mapping"),
        (("nope", None), {}, "known templates: custom, human, organization, persona, scratchpad"),
        (("custom", {"a": "b"}), {}, "needs the JSON schema"),
        (("custom", {}), {"schema": {"type": "string"}}, "type 'object'"),
        (
            ("custom", {}),
            {"schema": {"type": "object", "properties": {"a": {"type": 7}}}},
            "not a valid JSON schema",
        ),
        (("persona", {}), {"schema": {"type": "object"}}, "has its own fields schema"),
        (("persona", {}), {"colour": "red"}, "takes no colour"),
        (("persona", {"name": "Ada"}), {"char_limit": 5}, "limit is 5"),
        (("persona", {}), {"label": "Not A Label"}, "label"),
    ]
    for args, kwargs, message in refusals:
        with pytest.raises(InvalidArgument) as caught:
            apply_template(*args, **kwargs)
        assert message in str(caught.value), (args, kwargs, str(caught.value))

    schema = {
        "type": "object",
        "required": ["project"],
        "properties": {
            "project": {"type": "string"},
            "budget": {"type": "integer"},
            "tags": {"type": "array"},
        },
        "$defs": {"remote": {"$ref": "http://127.0.0.1:9/never.json"}},
    }
    custom = apply_template(
        "custom", {"project": "Atlas", "budget": 3, "tags": ["a", "b"]}, label="project", schema=schema
    )
    assert custom.label == "project" and custom.content == "Project: Atlas\nBudget: 3\nTags: a, b"
    with pytest.raises(InvalidArgument, match="'project' is a required property"):
        apply_template("custom", {"budget": 3}, label="project", schema=schema)
    remote = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/never.json"}}}
    with pytest.raises(InvalidArgument, match="only local references"):
        apply_template("custom", {"a": 1}, schema=remote)

    operator = tmp_path / "templates.yaml"
    operator.write_text(
        "templates:\n"
        "  ticket:\n"
        "    block_type: working\n"
        "    description: The support ticket you are handling\n"
        "    char_limit: 800\n"
        "    schema: {type: object, additionalProperties: false, properties: {id: {type: string}}}\n"
    )
    assert {"ticket", "persona"} <= set(load_templates(operator))
    ticket = apply_template("ticket", {"id": "T-1"}, templates_path=operator)
    assert ticket.label == "ticket" and ticket.content == "Id: T-1" and ticket.char_limit == 800
    with pytest.raises(InvalidArgument, match="unknown block template 'ticket'"):
        apply_template("ticket", {"id": "T-1"})
    operator.write_text("templates:\n  broken: {block_type: sideways}\n")
    with pytest.raises(InvalidArgument, match="template 'broken' is not valid"):
        load_templates(operator)


def test_bad_template_fields_fail_when_the_capability_is_built() -> None:
    with pytest.raises(InvalidArgument, match="traits"):
        MemoryBlocksCapability(scope_id="t:c:agent:x", templates=[("persona", {"traits": "curious"})])


async def test_save_message_keeps_what_the_user_said_and_refuses_questions(kit: Kit) -> None:
    """The tool a small model can drive (no text of its own to write): the run's task, word for
    word, as a line of the block; a question or a two-word message is refused and changes nothing."""
    agent = await kit.runtime.spawn(_blueprint("ada"))

    async def in_run(task: str) -> Any:
        agent.current_run = AgentRun(agent_id="ada", input={"task": task})
        try:
            return await agent.dispatcher.dispatch("core_memory_save_message", {"label": "human"})
        finally:
            agent.current_run = None

    saved = await in_run("Please remember that my  name\nis Ada.")
    assert saved.success, saved
    assert await kit.content("ada", "human") == "User said: Please remember that my name is Ada.\n"
    head = await kit.head("ada", "human")
    for refused in ("What is my name?", "hi there"):
        result = await in_run(refused)
        assert not result.success and "nothing saved" in result.error
    assert await kit.head("ada", "human") == head


async def test_the_event_log_has_one_entry_per_finished_run(kit: Kit) -> None:
    steps = [{"action": "core_memory_append", "parameters": {"label": "human", "content": "$input.fact"}}]
    agent = await kit.runtime.spawn(
        _blueprint("ada", event_log=True, policy=ScriptedActionPolicy.bind(steps=steps))
    )
    first = await agent.run({"task": "keep this", "fact": "Likes tea"})
    second = await agent.run({"task": "keep that", "fact": "x" * 5000})  # over the block's limit
    view = await kit.store.read("ada", EVENT_LOG)
    entries = view.entries or []
    assert first.status.value == "succeeded"
    assert [e["status"] for e in entries] == [first.status.value, second.status.value]
    assert entries[0]["text"].startswith(f"run {first.status.value}: keep this -> ")
    assert "keep that" in entries[1]["text"]
    assert view.info.block_type is BlockType.LOG and view.access is SharedAccess.READ_ONLY
    plain = await kit.runtime.spawn(_blueprint("plain", policy=ScriptedActionPolicy.bind(steps=steps)))
    await plain.run({"task": "t", "fact": "f"})
    assert EVENT_LOG not in {i.label for i in await kit.store.list_owned("plain")}


def test_a_callers_schema_may_not_run_regular_expressions() -> None:
    """A `custom` template's schema comes from the caller (HTTP): a backtracking `pattern` would
    stall the event loop, so schemas with regex keywords are refused; a field named `pattern` is fine."""
    evil = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    with pytest.raises(InvalidArgument, match="regular expressions are not accepted"):
        apply_template("custom", {"name": "a" * 40 + "!"}, "x", schema=evil)
    nested = {"type": "object", "properties": {"n": {"type": "object", "patternProperties": {"^a": {}}}}}
    with pytest.raises(InvalidArgument, match="patternProperties"):
        apply_template("custom", {}, "x", schema=nested)
    named = {"type": "object", "properties": {"pattern": {"type": "string"}}}
    assert apply_template("custom", {"pattern": "stripes"}, "x", schema=named).content == "Pattern: stripes"
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidArgument, match="nested deeper than 32 levels; write it flatter"):
        apply_template("custom", {}, "x", schema={"type": "object", "properties": {"x": deep}})
