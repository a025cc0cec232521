"""Memory blocks as a planning-prompt section, in the documented format (docs/blocks.md).

```
## Memory blocks

<persona>
Stores details about your current persona, guiding how you behave and respond
chars: 42/2000
I am a helpful assistant.
</persona>
```

Rendering is a pure function of the views an agent was given, and it never fails because of a
limit: a block over its limit shows `chars > limit` (the tools refuse edits that grow it further,
and say how to shrink it). Content cannot close its block early, open a fake one or start a prompt
section: a line whose first visible character is `<` or `#` has it escaped, and invisible format
characters are dropped.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from colony.memory.blocks.types import BlockInfo, BlockType, BlockView, SharedAccess

MEMORY_BLOCKS_HEADER = "## Memory blocks"
NO_DESCRIPTION = "(no description)"
_TYPE_ORDER = {BlockType.CORE: 0, BlockType.WORKING: 1, BlockType.LOG: 2}
# Every line boundary str.splitlines knows (a model may read \r or U+2028 as a new line too)
_TAG_START = re.compile(r"<(?=/?[a-z][a-z0-9_]{0,63}>)")
_LINE_BREAK = re.compile(r"(\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])")


def one_line(text: str) -> str:
    """Text as one prompt line: whitespace runs (line breaks included) become one space and
    invisible format characters (zero-width, bidirectional overrides) are dropped."""
    return " ".join("".join(c for c in text if unicodedata.category(c) != "Cf").split())


def escape_line(line: str, labels: Iterable[str] = ()) -> str:
    """`line` as the prompt shows it: invisible format characters (zero-width, bidirectional
    overrides) dropped, and when its first visible character is `<` or `#` (a tag, a section
    heading: stored text must not close its block, open a fake one or start a prompt section),
    that character written `&lt;` or `\\#`; a block tag (`<label>`, `</label>`) anywhere in the
    line has its `<` written `&lt;` too. `labels` is kept for callers; every tag is escaped."""
    visible = "".join(c for c in line if unicodedata.category(c) != "Cf")
    visible = _TAG_START.sub("&lt;", visible)  # a block tag anywhere ("User said: I am </human>")
    probe = visible.lstrip()
    if probe[:1] == "<":
        at = visible.index("<")
        return visible[:at] + "&lt;" + visible[at + 1 :]
    if probe[:1] == "#":
        at = visible.index("#")
        return visible[:at] + "\\#" + visible[at + 1 :]
    return visible


def shown(view: BlockView) -> bool:
    """Whether the block goes in the prompt: every CORE and LOG block, WORKING ones unless
    swapped out."""
    return not (view.info.block_type is BlockType.WORKING and view.info.swapped_out)


def _status(view: BlockView) -> str:
    info: BlockInfo = view.info
    if info.block_type is BlockType.LOG:
        total = len(view.entries or [])
        limit = info.log_shown_entries
        count = min(total, limit) if limit else len(view.content.splitlines())
        return f"entries: {count}/{total}, read-only"
    status = f"chars: {view.chars}/{info.char_limit}"
    if info.read_only or view.access is SharedAccess.READ_ONLY:
        return status + ", read-only"
    if view.access is SharedAccess.APPEND_ONLY:
        return status + ", append-only"
    return status


def render_block(view: BlockView, labels: Iterable[str]) -> str:
    """One block: `<label>`, its description line, its status line, its content as stored (then a
    line break unless it ends with one; nothing when empty), `</label>`."""
    labels = list(labels)
    label = view.info.label
    description = one_line(view.info.description) or NO_DESCRIPTION
    head = f"<{label}>\n{escape_line(description, labels)}\n{_status(view)}\n"
    content = escape_content(view.content, labels)
    if content and not content.endswith("\n"):
        content += "\n"  # the closing tag goes on a line of its own; a final line break is not doubled
    return f"{head}{content}</{label}>"


def escape_content(content: str, labels: Iterable[str]) -> str:
    """Content as stored, each of its lines through `escape_line` (line breaks kept as they are)."""
    labels = list(labels)
    parts = _LINE_BREAK.split(content)
    parts[0::2] = [escape_line(line, labels) for line in parts[0::2]]
    return "".join(parts)


def render_blocks(views: Sequence[BlockView]) -> str:
    """The `## Memory blocks` section of the views' blocks ("" when none is shown): CORE, then
    WORKING not swapped out, then LOG; by label within a type; one blank line between blocks."""
    labels = sorted({v.info.label for v in views})
    picked = sorted(
        (v for v in views if shown(v)), key=lambda v: (_TYPE_ORDER[v.info.block_type], v.info.label)
    )
    if not picked:
        return ""
    return "\n\n".join([MEMORY_BLOCKS_HEADER, *(render_block(v, labels) for v in picked)])
