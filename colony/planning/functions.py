"""Functions a client offers an agent (OpenAI's `tools`, docs/clients.md). The `ask` agent's chat
form: the model either answers or calls one of them, and constrained decoding holds it to exactly
that choice (a JSON Schema: the answer, or one function's name with arguments that follow its
parameters' schema). A planner that takes them (StructuredActionPolicy with `client_functions`,
the `assistant`): they are actions beside the agent's own, and choosing one ends the run with the
call. The client runs the function and sends its result back as a `tool` message; the door
renders those as text the model reads.

Everything here comes from a client: names, descriptions and schemas are checked and bounded.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from colony.errors import AgentUsageError
from colony.inference.models import check_schema

MAX_TOOLS = 32
MAX_DESCRIPTION = 2000
MAX_PARAMETERS_BYTES = 16_000
MAX_TOOLS_BYTES = 64_000  # the functions' parameters together (the choice's schema, the prompt)
SCHEMA_BYTES, SCHEMA_DEPTH, SCHEMA_COUNT_MAX = 64_000, 32, 4096
COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


def tool_specs(tools: Any) -> list[ToolSpec]:
    """The functions offered (`[{"name", "description"?, "parameters"?}]`), checked; AgentUsageError
    naming the first that is not a function Colony can offer the model."""
    if not isinstance(tools, list) or not 1 <= len(tools) <= MAX_TOOLS:
        raise AgentUsageError(f"tools must be a list of 1 to {MAX_TOOLS} functions")
    specs, names = [], set()
    for index, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not NAME.match(name) or name in names:
            raise AgentUsageError(f"tools[{index}].name must be a new name of 1-64 letters, digits, _ or -")
        description = tool.get("description") or ""
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise AgentUsageError(f"tools[{index}].description must be text of at most {MAX_DESCRIPTION}")
        if not isinstance(parameters, dict) or len(json.dumps(parameters)) > MAX_PARAMETERS_BYTES:
            raise AgentUsageError(
                f"tools[{index}].parameters must be a JSON Schema of at most {MAX_PARAMETERS_BYTES} bytes"
            )
        if parameters.get("type", "object") != "object":  # (a call's arguments are an object)
            raise AgentUsageError(f"tools[{index}].parameters must be an object schema (type: object)")
        bounded_schema(parameters, f"tools[{index}].parameters")  # its depth before the checker recurses
        check_schema(parameters, f"tools[{index}].parameters")
        if "$ref" in json.dumps(parameters):  # (nested under the choice's schema, a ref would not resolve)
            raise AgentUsageError(f"tools[{index}].parameters: $ref is not taken; write the schema out")
        names.add(name)
        specs.append(ToolSpec(name, description, parameters))
    if sum(len(json.dumps(s.parameters)) + len(s.description) for s in specs) > MAX_TOOLS_BYTES:
        raise AgentUsageError(
            f"tools: their parameters and descriptions together are over {MAX_TOOLS_BYTES} bytes"
        )
    return specs


def bounded_schema(schema: Any, field: str) -> None:
    """AgentUsageError (naming `field`) for a schema a client could make constrained decoding
    expensive with: over SCHEMA_BYTES of JSON, nested deeper than SCHEMA_DEPTH, or asking for more
    than SCHEMA_COUNT_MAX items, characters or properties (a grammar spells its repetitions out)."""
    if len(json.dumps(schema)) > SCHEMA_BYTES:
        raise AgentUsageError(f"{field}: over {SCHEMA_BYTES} bytes of JSON")
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > SCHEMA_DEPTH:
            raise AgentUsageError(f"{field}: nested deeper than {SCHEMA_DEPTH}")
        if isinstance(node, dict):
            for key in COUNTS:
                count = node.get(key)
                if isinstance(count, int | float) and count > SCHEMA_COUNT_MAX:
                    raise AgentUsageError(f"{field}: {key} {count} is over {SCHEMA_COUNT_MAX}")
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)


def choice_schema(specs: list[ToolSpec], tool_choice: Any) -> dict[str, Any]:
    """The JSON Schema of the model's choice: `{"answer": text}` or `{"tool": name, "arguments": {...}}`
    for one function (`tool_choice`: "auto", "required", or {"function": {"name"}})."""
    wanted = chosen(specs, tool_choice)
    branches: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"tool": {"const": spec.name}, "arguments": spec.parameters},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for spec in wanted
    ]
    if tool_choice in (None, "auto"):
        answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        branches.insert(0, {**answer, "additionalProperties": False})
    return {"anyOf": branches}


def tool_prompt(specs: list[ToolSpec], required: bool) -> str:
    """What the model is told of the functions (the schema holds it to them)."""
    lines = [
        f"- {s.name}: {s.description or '(no description)'} Parameters: {json.dumps(s.parameters)}"
        for s in specs
    ]
    how = (
        'Call one of them: reply {"tool": name, "arguments": {...}}.'
        if required
        else 'To call one, reply {"tool": name, "arguments": {...}}; to answer, reply {"answer": text}.'
    )
    return "You can call these functions:\n" + "\n".join(lines) + "\n" + how


def read_choice(text: str, specs: list[ToolSpec]) -> dict[str, Any]:
    """The reply the model's JSON makes: `{"content"}` or `{"content": None, "tool_calls": [...]}`
    (OpenAI's shape, with a fresh call id); a reply that is no valid choice is its text."""
    try:
        choice = json.loads(text)
    except ValueError:
        return {"content": text}
    if isinstance(choice, dict) and isinstance(choice.get("answer"), str):
        return {"content": choice["answer"]}
    names = {s.name for s in specs}
    if isinstance(choice, dict) and choice.get("tool") in names and isinstance(choice.get("arguments"), dict):
        return call_output(choice["tool"], choice["arguments"])
    return {"content": text}


def call_output(name: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """An agent's reply that is a call of a client's function (OpenAI's shape). Its id derives
    from `key` (a run and step: the same decision replayed is the same call), else is fresh."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24] if key is not None else secrets.token_hex(12)
    call = {
        "id": f"call_{digest}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"content": None, "tool_calls": [call], "finish_reason": "tool_calls"}


@dataclass(frozen=True)
class OfferedFunctions:
    """The client's functions a planner may choose this run, and whether it must (`required`, or
    one named by `tool_choice`: the agent's own actions are not offered then)."""

    specs: list[ToolSpec]
    only: bool

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.specs}

    def actions(self, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The planner's actions: the agent's own (unless a call is required) and the functions,
        each as a planner sees an action ({name, description, parameters})."""
        functions = [
            {
                "name": s.name,
                "description": f"(the user's function) {s.description}",
                "parameters": s.parameters,
            }
            for s in self.specs
        ]
        return functions if self.only else [*own, *functions]


def offered_functions(run_input: Any, own: Iterable[str]) -> OfferedFunctions | None:
    """The functions a run's input offers (`tools`, `tool_choice` as the OpenAI door passes them),
    checked; None when it offers none or `tool_choice` is "none". AgentUsageError for a function
    that is not one Colony can offer, or whose name is one of the agent's own actions (`own`)."""
    if not isinstance(run_input, dict) or run_input.get("tools") is None:
        return None
    choice = run_input.get("tool_choice")
    if choice == "none":
        return None
    if choice not in (None, "auto", "required") and not isinstance(choice, dict):
        raise AgentUsageError("tool_choice must be none, auto, required or {function: {name}}")
    specs = tool_specs(run_input["tools"])
    taken = set(own) & {s.name for s in specs}
    if taken:
        raise AgentUsageError(
            f"tools: {sorted(taken)[0]!r} is the name of one of the agent's own actions; rename the function"
        )
    return OfferedFunctions(chosen(specs, choice), only=choice not in (None, "auto"))


def chosen(specs: list[ToolSpec], tool_choice: Any) -> list[ToolSpec]:
    """The functions `tool_choice` leaves: the one it names ({"function": {"name"}}), else all;
    AgentUsageError when it names one `specs` does not hold."""
    if not isinstance(tool_choice, dict):
        return specs
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    named = [s for s in specs if s.name == name]
    if not named:
        raise AgentUsageError(f"tool_choice names {str(name)[:64]!r}, which tools does not offer")
    return named
