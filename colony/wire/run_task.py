"""What a run was asked, read from its input: the `task` field, or for a chat's input (`{"messages":
[{role, content}, ...]}`, as `POST /openai/v1/chat/completions` sends it) the conversation.

One reading for everyone who needs it: the planner's task, the answer's question, and what memory
records as the user's words (the last `user` message, verbatim: never the JSON around it, nor a
`tool` message, a function's result, which whoever runs the function wrote). The input comes from
a client: what is not a message of text is skipped, and the text is bounded.
"""

from __future__ import annotations

import json
from typing import Any

MAX_TASK_CHARS = 20_000  # a conversation rendered as a task is cut (from its start) to this
ROLE_NAMES = {"user": "User", "assistant": "Assistant", "tool": "Function result"}


def chat_messages(run_input: Any) -> list[tuple[str, str]] | None:
    """The (role, text) of a chat input's messages of text, in order; None for another input."""
    held = run_input.get("messages") if isinstance(run_input, dict) else None
    if not isinstance(held, list) or "task" in run_input:
        return None
    return [
        (m["role"], m["content"])
        for m in held
        if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
    ]


def user_words(run_input: Any) -> str | None:
    """What the user said in this run: its `task` text, a chat's last user message, or a text
    input; None when the input holds no words of the user's."""
    if isinstance(run_input, str):
        return run_input
    if isinstance(run_input, dict) and isinstance(run_input.get("task"), str):
        return str(run_input["task"])
    said = [text for role, text in chat_messages(run_input) or () if role == "user"]
    return said[-1] if said else None


def task_text(run_input: Any) -> str:
    """The task a run was given, as text: its `task` field; a chat's conversation (one user
    message: its text; more: the exchange so far, the last message last, system messages left to
    the agent's own goals); else the input as JSON."""
    if isinstance(run_input, dict) and isinstance(run_input.get("task"), str):
        return str(run_input["task"])
    chat = chat_messages(run_input)
    if chat is not None:
        turns = [(role, text) for role, text in chat if role != "system"]
        if len(turns) == 1:
            return turns[0][1][-MAX_TASK_CHARS:]
        if turns:
            # (a message's own lines indented: no text can start a line that reads as another turn)
            lines = [
                f"{ROLE_NAMES.get(role, role.title())}: {text}".replace("\n", "\n  ") for role, text in turns
            ]
            return "Conversation so far:\n" + "\n".join(lines)[-MAX_TASK_CHARS:]
    return run_input if isinstance(run_input, str) else json.dumps(run_input, default=str)


def task_value(run_input: Any) -> Any:
    """The task as memory records it (a run's turn, a skill's task): the user's words where the
    input has them, else the `task` field or the input itself."""
    words = user_words(run_input)
    if words is not None:
        return words
    return run_input.get("task", run_input) if isinstance(run_input, dict) else run_input
