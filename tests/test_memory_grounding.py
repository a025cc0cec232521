"""Issue 36, deliverable 7: what is stored as a fact about the user is what the user said.

The check itself (colony.memory.grounding), then the tools that apply it on a real redis-server:
a refused write is a failed action result naming why, and changes nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime
from colony.agents.blueprint import CapabilitySpec
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.blocks.types import SYSTEM
from colony.memory.capability import MemoryCapability
from colony.memory.grounding import (
    MAX_CANDIDATE_CHARS,
    MIN_COVERAGE,
    check_grounded,
    check_lines,
    repetition,
    stem,
)
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.tools import MemoryToolsCapability
from colony.memory.types import NewMemory

DANA = "Hi, my name is Dana."
OSLO = "I live in Oslo and I like green tea; my cat is called Tom and I am 34."
LOOP = "I am here to help you with your memories. " * 16


# -- the check -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "candidate",
    [DANA, "User said: Hi, my name is Dana.", "my name is dana", "User: Hi, my name is Dana"],
)
def test_the_users_words_verbatim_are_grounded(candidate: str) -> None:
    verdict = check_grounded(candidate, [DANA])
    assert verdict.grounded and verdict.reason == "the user's words verbatim", verdict


@pytest.mark.parametrize(
    "candidate",
    ["The user's name is Dana.", "Name: Dana", "Lives in Oslo, likes green tea.", "Cat: Tom. Age: 34"],
)
def test_a_faithful_extract_is_grounded(candidate: str) -> None:
    verdict = check_grounded(candidate, [DANA, OSLO])
    assert verdict.grounded and verdict.reason.startswith("an extract"), verdict


def test_one_reworded_word_in_five_passes_and_more_does_not() -> None:
    reworded = check_grounded("Lives in Oslo, enjoys green tea", [OSLO])  # 4 of 5 content words
    assert reworded.grounded and reworded.coverage == pytest.approx(0.8)
    invented = check_grounded("Enjoys green tea", [OSLO])  # 2 of 3
    assert not invented.grounded and "enjoys" in invented.reason
    assert MIN_COVERAGE == 0.8
    assert not check_grounded("Likes coffee and lives in Oslo", [OSLO]).grounded  # 3 of 4


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        ("I'm Emily.", "emily"),
        ("The user's name is Emily.", "emily"),
        ("Dana's cat is called Felix.", "felix"),
        ("Dana is 43 years old.", "43"),
    ],
)
def test_a_name_or_number_the_user_never_gave_is_refused(candidate: str, named: str) -> None:
    verdict = check_grounded(candidate, [DANA, OSLO])
    assert not verdict.grounded and f"the user never said {named}" in verdict.reason, verdict
    assert named in verdict.missing


def test_the_list_of_your_memories_text_is_refused() -> None:
    text = "This is a list of your memories. You can use them to answer the question."
    verdict = check_grounded(text, [DANA])
    assert not verdict.grounded, verdict
    assert "list" in verdict.reason and "memories" in verdict.reason and verdict.coverage == 0.0


def test_text_with_no_content_words_is_refused() -> None:
    assert not check_grounded("Hello! Yes, it is.", [DANA]).grounded
    assert not check_grounded("...", [DANA]).grounded


def test_a_sentence_repeated_16_times_is_refused_even_with_the_users_words() -> None:
    verdict = check_grounded(LOOP, [DANA])
    assert not verdict.grounded and "16 times" in verdict.reason, verdict
    grounded_loop = "My name is Dana. " * 16  # every word the user's, still a loop, not a fact
    verdict = check_grounded(grounded_loop, [DANA])
    assert not verdict.grounded and 'repeats "my name is dana" 16 times' in verdict.reason
    unpunctuated = "my name is dana " * 16
    assert "repeats itself" in (repetition(unpunctuated) or "")
    assert repetition(OSLO) is None and repetition("Dana. Dana.") is None  # twice is not a loop


def test_what_the_user_repeated_is_stored_verbatim() -> None:
    said = "No. No. No. I said my name is Dana."
    assert check_grounded(said, [said]).grounded


@pytest.mark.parametrize(
    "framed",
    [
        "User says: I live in Oslo and love green tea",
        "The user said: I live in Oslo and love green tea",
        "User: I live in Oslo and love green tea",
        "the user told me I live in Oslo and love green tea",
    ],
)
def test_a_line_framed_as_the_users_words_must_be_them_verbatim(framed: str) -> None:
    """Found by review: only "User said" was held to verbatim; other quote frames passed a changed
    word as an extract."""
    said = ["I live in Oslo and like green tea"]
    assert not check_grounded(framed, said).grounded
    assert check_grounded(framed.replace("love", "like"), said).grounded  # verbatim: kept
    assert check_grounded("The user likes green tea", said).grounded  # not framed: an extract


def test_lines_are_checked_one_by_one() -> None:
    kept = "User said: Hi, my name is Dana.\nName: Dana"
    assert check_lines(kept, [DANA]).grounded
    verdict = check_lines(kept + "\nFavourite band: Nightwish", [DANA])
    assert not verdict.grounded and 'line "Favourite band: Nightwish"' in verdict.reason, verdict
    repeated = "\n".join(["Name: Dana"] * 3)
    assert "3 times" in check_lines(repeated, [DANA]).reason


def test_stems_match_word_forms() -> None:
    assert stem("likes") == stem("like") == stem("liked") == stem("liking")
    assert stem("cities") == stem("city") and stem("cats") == stem("cat") and stem("class") == "class"


def test_hostile_huge_input_is_bounded() -> None:
    huge = "Dana " * 2_000_000  # 10 MB
    started = time.perf_counter()
    verdict = check_grounded(huge, [huge])
    assert not verdict.grounded and f"longer than {MAX_CANDIDATE_CHARS}" in verdict.reason
    assert check_lines(huge, [DANA]).reason == verdict.reason
    just_under = ("x" * 30 + " ") * (MAX_CANDIDATE_CHARS // 31)
    assert not check_lines(just_under, [huge, huge]).grounded
    mixed = "\n".join(f"line {n} of Dana" for n in range(1500))[:MAX_CANDIDATE_CHARS]
    check_lines(mixed, [huge])
    assert time.perf_counter() - started < 3.0  # 2 shared cores; measured ~0.2 s


# -- the tools that apply it -----------------------------------------------------------------------


def _grounded_agent(agent_id: str) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[
            MemoryCapability.bind(level="working"),
            MemoryCapability.bind(level="ltm:semantic"),
            CapabilitySpec(
                blueprint=MemoryToolsCapability.bind(ground_facts=True), exclude_actions=["recall"]
            ),
            MemoryBlocksCapability.bind(
                templates=[("persona", {"name": "Colony assistant"}), "human"],
                tool_log=False,
                user_blocks=["human"],
                ground_archival=True,
            ),
        ],
    )


@pytest.fixture
async def runtime(bb: Blackboard, tmp_path: Path) -> AsyncIterator[LocalAgentRuntime]:
    made = LocalAgentRuntime(
        bb, colony_id=f"c{uuid.uuid4().hex[:10]}", settings=ColonySettings(data_dir=tmp_path)
    )
    yield made
    await made.shutdown()


async def test_tools_refuse_what_the_user_did_not_say_with_the_reason(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(_grounded_agent("keeper"))
    blocks = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    await agent.begin_run({"task": DANA})
    dispatch = agent.dispatcher.dispatch

    async def human() -> str:
        return (await blocks.read(SYSTEM, "human", owner="keeper")).content

    refused = await dispatch(
        "core_memory_append", {"label": "human", "content": "This is a list of your memories"}
    )
    assert not refused.success and "BlockEditRejected" in (refused.error or "")
    assert "not stored" in (refused.error or "") and "list, memories" in (refused.error or ""), refused.error
    emily = await dispatch("memory_insert", {"label": "human", "content": "I'm Emily."})
    assert not emily.success and "the user never said emily" in (emily.error or ""), emily.error
    assert await human() == ""  # nothing stored
    assert (
        await dispatch("core_memory_append", {"label": "human", "content": "The user's name is Dana."})
    ).success
    assert (await dispatch("core_memory_save_message", {"label": "human"})).success
    rethink = await dispatch("memory_rethink", {"label": "human", "new_content": "Name: Dana\nCat: Felix"})
    assert not rethink.success and 'line "Cat: Felix"' in (rethink.error or ""), rethink.error
    swap = {"label": "human", "old_content": "Dana.", "new_content": "Emily."}
    assert not (await dispatch("core_memory_replace", swap)).success
    assert await human() == "The user's name is Dana.\nUser said: Hi, my name is Dana.\n"
    # moving the block's own words around states nothing new
    assert (await dispatch("memory_rethink", {"label": "human", "new_content": "Name: Dana"})).success
    # the persona is the agent's own: not held to what the user said
    assert (await dispatch("core_memory_append", {"label": "persona", "content": "I'm Emily."})).success

    looped = await dispatch("archival_insert", {"content": LOOP})
    assert not looped.success and "16 times" in (looped.error or ""), looped.error
    fact = await dispatch("remember", {"fact": "The user's name is Emily."})
    assert not fact.success and "emily" in (fact.error or "") and "remember_message" in (fact.error or "")
    assert (await dispatch("remember", {"fact": "The user is called Dana."})).success
    ltm = MemoryScope.agent("keeper", "ltm:semantic", colony_id=runtime.colony_id)
    stored = [e.content for e in await MemoryStore(runtime.blackboard, ColonySettings()).entries(ltm)]
    assert stored == ["The user is called Dana."]


async def test_an_earlier_user_message_in_memory_grounds_a_later_write(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(_grounded_agent("later"))
    working = next(
        c
        for c in agent.capabilities.values()
        if isinstance(c, MemoryCapability) and c.scope_type == "working"
    )
    await working.write(
        NewMemory(content=f"User: {OSLO}", tags={"conversation", "user"}, kind="conversation")
    )
    await working.write(  # what the assistant said is not what the user said
        NewMemory(
            content="Assistant: Your dog is Rex.", tags={"conversation", "assistant"}, kind="conversation"
        )
    )
    await agent.begin_run({"task": "Please keep that in mind."})
    dispatch = agent.dispatcher.dispatch
    assert (
        await dispatch("core_memory_append", {"label": "human", "content": "Cat: Tom, lives in Oslo"})
    ).success
    rex = await dispatch("core_memory_append", {"label": "human", "content": "Dog: Rex"})
    assert not rex.success and "rex" in (rex.error or ""), rex.error


async def test_model_output_cannot_claim_the_user_tag(runtime: LocalAgentRuntime) -> None:
    """An entry tagged `user` grounds later writes (it is what the user said): a tool's tags may not
    name it, or a model could store an invented fact and then quote it as the user's."""
    agent = await runtime.spawn(_grounded_agent("tagger"))
    await agent.begin_run({"task": DANA})
    dispatch = agent.dispatcher.dispatch
    archived = await dispatch("archival_insert", {"content": "Hi, my name is Dana.", "tags": ["user"]})
    assert not archived.success and "kept for what the user said" in (archived.error or ""), archived.error
    fact = await dispatch("remember", {"fact": "The user is called Dana.", "tag": "user"})
    assert not fact.success and "kept for what the user said" in (fact.error or ""), fact.error
    assert (await dispatch("archival_insert", {"content": "Hi, my name is Dana.", "tags": ["intro"]})).success


# -- found by the attacking review (issue 36) -------------------------------------------------------

TEA = "I live in Oslo and I like green tea and hiking on weekends."


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        ("Name: Emily. Lives in Oslo, likes green tea, hiking on weekends.", "emily"),  # a label's value
        ("Emily lives in Oslo, likes green tea and hiking on weekends.", "emily"),  # starts a sentence
        ("She lives in Oslo, likes green tea and hiking on weekends.", "she"),  # who they are
        ("Lives in Oslo, likes green tea.\nPronouns: she/her", "she"),  # not skipped per line
        ("Works in Oslo with Alex\u00adandra, likes green tea and hiking.", "alexandra"),  # spliced
    ],
)
def test_names_and_pronouns_get_no_allowance_wherever_they_stand(candidate: str, why: str) -> None:
    verdict = check_lines(candidate, [TEA.replace("I live", "I work with Alex and live")])
    assert not verdict.grounded and why in verdict.reason, verdict


def test_a_quote_must_be_the_users_words_and_what_they_typed_counts_as_typed() -> None:
    assert not check_grounded("User said: I live in Bergen.", [TEA, "I was in Bergen once."]).grounded
    assert check_grounded("User said: I live in Oslo", [TEA]).verbatim
    assert check_grounded("Lives in İstanbul with Alex", ["I live in İstanbul with Al\u00adex."]).grounded


def test_many_lines_against_much_said_are_checked_fast() -> None:
    said = [("I live in Oslo and like green tea. " * 6000)[:200_000]]
    lines = "\n".join(f"Likes green tea number {n}" for n in range(3999))[:MAX_CANDIDATE_CHARS]
    started = time.perf_counter()
    check_lines(lines, said)
    assert time.perf_counter() - started < 3.0  # what the user said is read once, not per line


async def test_an_edit_is_checked_by_the_lines_it_leaves(runtime: LocalAgentRuntime) -> None:
    """A replace or deletion inside a kept quote makes a line the user did not say: refused. The
    block's words are not a source for new lines, so an allowance does not ratchet."""
    agent = await runtime.spawn(_grounded_agent("editor"))
    told = "I do not eat meat. I live in Oslo, my brother lives in Berlin."
    await agent.begin_run({"task": told})
    dispatch = agent.dispatcher.dispatch
    blocks = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    assert (await dispatch("core_memory_save_message", {"label": "human"})).success
    quote = f"User said: {told}\n"
    for old, new in (("not ", ""), ("in Oslo", "in Berlin")):
        edit = await dispatch(
            "core_memory_replace", {"label": "human", "old_content": old, "new_content": new}
        )
        assert not edit.success and "BlockEditRejected" in (edit.error or ""), (old, edit.error)
    assert (await blocks.read(SYSTEM, "human", owner="editor")).content == quote
    lower = "lives in oslo with emily, does not eat meat"  # a lower-case name: the documented gap
    assert (await dispatch("core_memory_append", {"label": "human", "content": lower})).success
    called = await dispatch("core_memory_append", {"label": "human", "content": "Called Emily."})
    assert not called.success and "emily" in (called.error or ""), called.error  # no ratchet
    dropped = {"label": "human", "old_content": f"{lower}", "new_content": ""}
    assert (await dispatch("core_memory_replace", dropped)).success  # removing a line is allowed
