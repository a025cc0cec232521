"""What a JSON value taken from outside (a run input, an imported document, a memory entry's data)
may hold once parsed: nesting depth, finite numbers (JSON has no NaN or Infinity; Python's parser
accepts them, Redis would store them, other clients could not read them back) and strings that are
valid Unicode (a lone surrogate cannot be encoded as UTF-8). Both sides of the API use it."""

from __future__ import annotations

import math
from typing import Any

# A place in the input, kept as a chain (parent place, key or index) and spelled out only for an
# error message: building the path text of every element would copy a long key into each of its
# children's paths (a 0.3 MB body could cost gigabytes).
Place = tuple[Any, str | int] | str


class InputTooDeep(ValueError):
    """A run input nests deeper than `api.max_input_depth`."""


def check_input(value: Any, max_depth: int, where: str = "input") -> None:
    """Refuse (ValueError naming the place) what a run input may not hold; see the module doc.
    Work and memory are linear in the number of elements, whatever the length of keys."""
    stack: list[tuple[Any, int, Place]] = [(value, 1, where)]
    while stack:
        item, depth, place = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise InputTooDeep(
                    f"{_spell(place)}: nested deeper than {max_depth} levels (api.max_input_depth)"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not is_utf8(key):
                        raise ValueError(f"{_spell(place)} (a key): {_SURROGATE}")
                    stack.append((child, depth + 1, (place, key)))
            else:
                stack.extend((child, depth + 1, (place, i)) for i, child in enumerate(item))
        elif isinstance(item, str):
            if not is_utf8(item):
                raise ValueError(f"{_spell(place)}: {_SURROGATE}")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{_spell(place)}: NaN and Infinity are not JSON numbers")


_SURROGATE = "a string holds a lone UTF-16 surrogate (not valid Unicode)"


def is_utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (no lone surrogates: what JSON parsing and os.walk's
    surrogate escapes let through)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _spell(place: Place) -> str:
    """The place as text (`input.a[3].b`), cut to a readable length."""
    parts: list[str] = []
    while isinstance(place, tuple):
        place, step = place
        parts.append(f"[{step}]" if isinstance(step, int) else f".{_short(step, 80)}")
    parts.append(place)
    return _short("".join(reversed(parts)))


def _short(path: str, keep: int = 200) -> str:
    """A place in the input, cut to a readable length (keys can be long)."""
    return path if len(path) <= keep else f"{path[: keep // 2]}...{path[-keep // 2 :]}"
