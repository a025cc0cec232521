"""What is wrong with a configuration, said in words a user can act on: the settings a key or a
variable names (with the closest valid one for a typo), a rejected value shown bounded, and a
config file's size once its YAML aliases are expanded. Generic over the settings models, so
colony.config's `load_settings` can hold each of its sources to them."""

from __future__ import annotations

import difflib
import reprlib
import types
import typing
from typing import Any

from pydantic import BaseModel


def describe(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "(root)"
    return f"{where}: {error.get('msg', 'invalid')} (got {reprlib.repr(error.get('input'))})"  # bounded


MAX_CONFIG_NODES = 100_000  # values of a config file, its aliases expanded


def nodes(value: Any, limit: int = MAX_CONFIG_NODES) -> int:
    """How many values `value` holds, its shared parts (YAML aliases) counted each time they are
    used; stops counting past `limit`."""
    count, stack = 0, [value]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple | set):
            stack.extend(node)
    return count


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The settings section (a BaseModel) a field holds, seen through `X | None`; None for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_of(arg)
            if found is not None:
                return found
    return None


def setting_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], bool]:
    """Every valid key path, e.g. ("serve",) and ("serve", "replicas"), mapped to whether it is a
    section (a nested model) rather than a leaf."""
    paths: dict[tuple[str, ...], bool] = {}
    for name, field in model.model_fields.items():
        section = section_of(field.annotation)
        paths[(*prefix, name)] = section is not None
        if section is not None:
            paths.update(setting_paths(section, (*prefix, name)))
    return paths


def closest(word: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def unknown_keys(data: dict[Any, Any], model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[str]:
    """Keys of a YAML mapping (or keyword overrides) that name no setting, each with the closest
    valid key: nested sections ignore unknown keys, so a typo there would otherwise pass silently."""
    problems = []
    fields = model.model_fields
    for key, value in data.items():
        path = ".".join((*prefix, str(key)))
        if key not in fields:
            siblings = [".".join((*prefix, name)) for name in fields]
            problems.append(f"{path}: unknown setting{closest(path, siblings)}")
            continue
        section = section_of(fields[key].annotation)
        if section is not None and isinstance(value, dict):
            problems.extend(unknown_keys(value, section, (*prefix, str(key))))
    return problems
