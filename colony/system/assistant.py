"""Built-in agent `assistant`: planned by the model, with a memory hierarchy it can use.

The replica's model picks each step as schema-constrained JSON (StructuredActionPolicy) among the
memory actions (recall, remember_message, list_tags, memory_map, forget, consolidate) and `answer`, which
writes the reply from the memories relevant to the question and streams its tokens. Producers
record every action and every run's task and answer, so a later run can recall what an earlier one
was told (the user's message, verbatim, by the conversation producer). What the model stores as
a fact about the user (the `human` block, archival memory) must be the user's words or an extract
of them (colony.memory.grounding): a write that is not fails, naming why. `answer` ends the run;
after `max_memory_steps` planned memory steps (default 1: a small model repeats a step rather
than moving on) the run answers. Functions a client offers (`tools` in the input, through the
OpenAI door) are planned beside the memory actions: choosing one ends the run with the call
(colony.planning.functions), and the client sends its result back in the next run's messages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    action_executor,
)
from colony.agents.blueprint import CapabilitySpec
from colony.agents.policy import ActionPolicyExecutionState, ActionPolicyIterationResult
from colony.agents.reply_stream import stream_reply
from colony.blackboard import Blackboard, TagFilter
from colony.errors import AgentUsageError, InferenceError
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.blocks.types import BlockType
from colony.memory.hierarchy import default_memory_hierarchy
from colony.memory.tools import MemoryToolsCapability, prompt_line
from colony.memory.types import MemoryQuery
from colony.planning.policies import StructuredActionPolicy
from colony.planning.streams import (
    ActionKeySubstringFilter,
    ConsciousnessStream,
    ConversationFormatter,
    JSONStreamFormatter,
    SuccessfulActionFilter,
)
from colony.system.builtin import RUNS_NAMESPACE
from colony.wire.run_task import task_text

log = logging.getLogger(__name__)
ANSWER = "answer"
MEMORY_LINES = 6
MAX_NOTES = 3
STREAM_ENTRIES = 4
HUMAN_BLOCK = "human"
MAX_BLOCK_NOTES = 6  # the newest lines of the core blocks that go into the answer's prompt
NOTE_MARGIN = 0.1  # notes within this much relevance of the best one go into the answer's prompt


class AnswerCapability(AgentCapability):
    """`answer`: the reply, written by the model from the question and the agent's memories."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        engine: InferenceEngine | None = None,
        max_tokens: int = 200,
        min_relevance: float = 0.25,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.engine = engine
        self.max_tokens = max_tokens
        self.min_relevance = min_relevance

    async def _block_notes(self) -> list[str]:
        """The lines of the `human` core block (what the agent was told about the user): notes of
        every answer, whatever the question, as core memory is always in context. The persona
        block stays out of the notes: "Name: Colony assistant" would answer "what is my name?"."""
        blocks = next(
            (
                c
                for c in (self.agent.capabilities.values() if self.agent else [])
                if isinstance(c, MemoryBlocksCapability)
            ),
            None,
        )
        if blocks is None:
            return []
        notes = []
        for view in await blocks.views():
            if view.info.block_type is not BlockType.CORE or view.info.label != HUMAN_BLOCK:
                continue
            for line in view.content.splitlines():
                text = prompt_line(line)[:400]
                if text and text not in notes:
                    notes.append(text)
        return notes[-MAX_BLOCK_NOTES:]

    async def _memories(self, question: str) -> list[str]:
        tools = next(
            (
                c
                for c in (self.agent.capabilities.values() if self.agent else [])
                if isinstance(c, MemoryToolsCapability)
            ),
            None,
        )
        if tools is None:
            return []
        run = self.agent.current_run if self.agent is not None else None
        found = await tools.service().recall(
            MemoryQuery(
                query=question,
                # what the user said and the facts stored, not earlier generated replies (a wrong
                # answer once given would otherwise be repeated as if remembered), nor procedures
                tag_filter=TagFilter(none_of=frozenset({"assistant", "action", "skill"})),
                max_results=MEMORY_LINES * 2,
                min_relevance=self.min_relevance,
            ),
            tools.resolve(None),
        )
        notes: list[str] = []
        best = None
        for item in found:
            entry = item.entry
            if run is not None and (
                entry.created_at >= (run.started_at or 0) or run.run_id in entry.entry_id
            ):
                continue  # written during this run (its own message): not a memory of it
            if entry.content.rstrip().endswith("?"):
                continue  # an earlier question states no fact
            best = item.relevance if best is None else best
            if item.relevance < best - NOTE_MARGIN:
                break  # only the notes about as relevant as the best: a small model copies distractors
            text = prompt_line(entry.content)[:400]
            text = text.removeprefix("User: ") if "user" in entry.tags else text
            if text not in notes:
                notes.append(text)
        return notes[:MAX_NOTES]

    @staticmethod
    def prompt(question: str, notes: list[str]) -> str:
        """Notes first (the most relevant first), then the question: the shape even the 135M
        default model answers from (a system prompt about "memories" makes it refuse instead)."""
        if not notes:
            return f"Question: {question}\nAnswer briefly."
        lines = "\n".join(f"Note: {n}" for n in notes)
        return f"{lines}\nQuestion: {question}\nAnswer using the notes."

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def answer(self, question: str) -> str:
        """Reply to the user (uses your memories of earlier conversations); ends the task."""
        if self.engine is None:
            raise AgentUsageError("the assistant answers on an engine replica (no engine was injected)")
        run = self.agent.current_run if self.agent is not None else None
        if len(question.split()) < 3 and run is not None:  # a planner's placeholder, not a question
            question = task_text(run.input)
        notes = [*await self._block_notes(), *await self._memories(question)]
        request = InferenceRequest(
            messages=[ChatMessage(role="user", content=self.prompt(question, notes))],
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        return await stream_reply(self.agent, self.engine, request)


class AssistantPolicy(StructuredActionPolicy):
    """StructuredActionPolicy where `answer` ends the run and a run answers by `max_plan_steps`."""

    def __init__(
        self,
        agent: Agent | None = None,
        *,
        engine: InferenceEngine | None = None,
        max_plan_steps: int = 4,
        max_memory_steps: int = 1,
        max_tokens: int = 160,
        goals: Sequence[str] = (),
        consciousness_streams: Sequence[Any] = (),
        client_functions: bool = True,
    ) -> None:
        super().__init__(
            agent,
            engine=engine,
            max_tokens=max_tokens,
            allow_finish=False,
            goals=goals,
            consciousness_streams=consciousness_streams,
            client_functions=client_functions,
        )
        self.max_plan_steps = max_plan_steps
        self.max_memory_steps = max_memory_steps
        self._answer_only = False  # (this step offers `answer` of the agent's own actions, no more)

    def planning_action_schemas(self) -> list[dict[str, Any]]:
        actions = super().planning_action_schemas()
        return [a for a in actions if a["name"] == ANSWER] if self._answer_only else actions

    async def plan_step(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        # after `max_memory_steps` planned steps, or at the last step: answer (a small model
        # otherwise repeats the step it just took); with a client's functions offered, the step
        # after the memory steps still chooses between answering and calling one of them
        memory_done = len(self.call_trace) >= self.max_memory_steps
        if state.step >= self.max_plan_steps - 1 or (memory_done and not _offers_functions(state.run.input)):
            return await self._answer(state)
        self._answer_only = memory_done
        try:
            step = await super().plan_step(state)
        except InferenceError as exc:  # the model's plan was no usable JSON: answer instead
            if _call_required(state.run.input):  # (but a call was asked for: no answer will do)
                raise AgentUsageError(
                    f"the model made no usable call of the functions offered: {exc}"
                ) from exc
            log.warning("assistant %s: planning step failed (%s); answering", self._who(), exc)
            return await self._answer(state)
        finally:
            self._answer_only = False
        if step.action == ANSWER and step.action_result is not None:
            ok = step.action_result.success
            return step.model_copy(
                update={
                    "done": True,
                    "output": step.action_result.output if ok else None,
                    "error": None if ok else step.action_result.error,
                }
            )
        return step

    async def _answer(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        """Answer the task as asked (the last step, or when planning failed)."""
        parameters = {"question": task_text(state.run.input)}
        result = await self.dispatch(ANSWER, parameters)
        return ActionPolicyIterationResult(
            action=ANSWER,
            parameters=parameters,
            action_result=result,
            done=True,
            output=result.output if result.success else None,
            error=None if result.success else result.error,
        )

    def _who(self) -> str:
        return self.agent.agent_id if self.agent is not None else "-"


def _offers_functions(run_input: Any) -> bool:
    """The run's client offers functions (`tools`, and a `tool_choice` other than none)."""
    return (
        isinstance(run_input, dict)
        and bool(run_input.get("tools"))
        and run_input.get("tool_choice") != "none"
    )


def _call_required(run_input: Any) -> bool:
    """The run's client asked for a call of one of its functions (`tool_choice` required or named)."""
    choice = run_input.get("tool_choice") if isinstance(run_input, dict) and run_input.get("tools") else None
    return choice == "required" or isinstance(choice, dict)


def assistant_streams() -> list[Any]:
    """The assistant's consciousness streams: its conversation (the answers it gave) and its
    actions (every call and outcome), each the last few, rendered into the planning prompt."""
    return [
        ConsciousnessStream.bind(
            name="conversation",
            formatter=ConversationFormatter.bind(),
            action_filter=SuccessfulActionFilter(ActionKeySubstringFilter(ANSWER)),
            max_entries=STREAM_ENTRIES,
        ),
        ConsciousnessStream.bind(
            name="actions",
            formatter=JSONStreamFormatter.bind(section_title="## Recent Actions", max_value_chars=200),
            action_filter=ActionKeySubstringFilter(""),
            max_entries=STREAM_ENTRIES,
        ),
    ]


PERSONA = {
    "name": "Colony assistant",
    "style": "brief and friendly",
    "guidelines": "Answer from what you remember about the user; say so when you do not know.",
}


def assistant_blueprint(agent_id: str = "assistant", max_tokens: int = 200) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=agent_id,
            agent_type=AgentType.SERVICE,
            role="assistant",
            action_policy_blueprints={"consciousness_streams": assistant_streams()},
        ),
        capabilities=[
            # `remember(fact)` left out: a small model's own "facts" are often junk that later
            # answers copy; `remember_message` stores what the user said
            # short chat turns on a small model: STM copied into LTM as said (no model summaries,
            # which the 135M model writes as copies anyway, and which would hold a batch back for
            # up to 15 minutes)
            *default_memory_hierarchy(exclude_actions=["remember"], consolidate=False),
            # core blocks `persona` and `human` in every prompt, with the block tools (recall is
            # the memory tools' one: the same search over conversation and archival memory)
            CapabilitySpec(
                # what the model writes into `human` or archival memory must be what the user said
                # (colony.memory.grounding); `persona` and other blocks are the agent's own
                blueprint=MemoryBlocksCapability.bind(
                    templates=[("persona", PERSONA), "human"],
                    tool_log=False,
                    user_blocks=[HUMAN_BLOCK],
                    ground_archival=True,
                ),
                exclude_actions=["recall"],
            ),
            AnswerCapability.bind(max_tokens=max_tokens),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=AssistantPolicy.bind(
            goals=[
                "Help the user. When the user tells you something about themselves (their name, what "
                "they like), keep it in your `human` block with `core_memory_save_message`. Example: "
                'the user says "Remember that I like tea." -> {"action": '
                '"core_memory_save_message", "parameters": {"label": "human"}}. When the '
                "user asks a question, reply with `answer`.",
            ],
            max_tokens=160,
        ),
    )
