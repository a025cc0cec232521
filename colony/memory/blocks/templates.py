"""Block templates: persona, human, scratchpad, organization and custom blocks from YAML.

A template fixes a block's type, default description and character limit, and a JSON schema of the
fields its initial content is written from ("Name: Ada\\nTraits: curious, kind"). Fields are
validated before anything is stored, so a typo in a blueprint fails at once with the field named,
not later as an odd prompt. The packaged templates live in templates.yaml; an operator file (same
shape) adds templates or replaces packaged ones of the same name.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import referencing
import yaml
from jsonschema import exceptions as schema_errors
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from colony.errors import InvalidArgument
from colony.memory.blocks.types import MAX_DESCRIPTION_CHARS, BlockType, Label, NewBlock

PACKAGED = "templates.yaml"
MAX_TEMPLATE_FILE_BYTES = 1_000_000
MAX_SCHEMA_CHARS = 20_000
TOO_DEEP = "nested deeper than 32 levels"
# the fields of one block, as JSON: they render to the initial content, itself at most
# blocks.max_edit_chars (and one request's 80,000 characters), so more is never needed
MAX_FIELDS_CHARS = 80_000
# NewBlock fields a caller may set over a template's defaults
OVERRIDABLE = (
    "description",
    "block_type",
    "char_limit",
    "read_only",
    "content",
    "log_max_entries",
    "log_shown_entries",
)


class BlockTemplate(BaseModel):
    """One template: what a block made from it looks like, and the schema of its fields
    (`fields_schema` None: the caller gives one, as for `custom`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Label
    block_type: BlockType = BlockType.WORKING
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] = ""
    char_limit: Annotated[int, Field(ge=1)] | None = None
    read_only: bool = False
    fields_schema: dict[str, Any] | None = Field(None, alias="schema")


REGEX_KEYWORDS = frozenset({"pattern", "patternProperties", "format"})


def _regex_keyword(node: Any, depth: int = 0) -> str | None:
    """The first keyword of `node` (a schema, walked to a bounded depth) that runs a regular
    expression when validating (`format` too: some formats are checked by regexes)."""
    if depth > 32:
        return TOO_DEEP
    if isinstance(node, dict):
        for key, value in node.items():
            if key in REGEX_KEYWORDS and not (key == "format" and not isinstance(value, str)):
                return str(key)
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                value = list(value.values())  # names of fields, not keywords
            found = _regex_keyword(value, depth + 1)
            if found is not None:
                return found
    elif isinstance(node, list):
        for item in node:
            found = _regex_keyword(item, depth + 1)
            if found is not None:
                return found
    return None


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A fields schema: a JSON schema of an object, valid for its draft, of bounded size."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidArgument(f"{where}: the fields schema must be a JSON schema with type 'object'")
    if len(json.dumps(schema, default=str)) > MAX_SCHEMA_CHARS:
        raise InvalidArgument(f"{where}: the fields schema is longer than {MAX_SCHEMA_CHARS} characters")
    regex = _regex_keyword(schema)
    if regex == TOO_DEEP:
        raise InvalidArgument(f"{where}: the fields schema is {TOO_DEEP}; write it flatter")
    if regex is not None:
        raise InvalidArgument(
            f"{where}: the fields schema uses {regex!r}; regular expressions are not accepted in a "
            "caller's schema (a backtracking pattern can stall the server); use enum, maxLength or type"
        )
    try:
        validator_for(schema).check_schema(schema)
    except schema_errors.SchemaError as exc:
        raise InvalidArgument(
            f"{where}: the fields schema is not a valid JSON schema: {exc.message}"
        ) from None
    return schema


def _parse(text: str, where: str) -> dict[str, BlockTemplate]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("templates"), dict):
        raise InvalidArgument(f"{where} must hold a mapping `templates:` of template name -> template")
    out: dict[str, BlockTemplate] = {}
    for name, body in raw["templates"].items():
        if not isinstance(body, dict):
            raise InvalidArgument(f"{where}: template {name!r} must be a mapping")
        try:
            template = BlockTemplate.model_validate({**body, "name": name})
        except ValidationError as exc:
            raise InvalidArgument(f"{where}: template {name!r} is not valid: {_first_error(exc)}") from None
        if template.fields_schema is not None:
            check_schema(template.fields_schema, f"{where}: template {name!r}")
        out[template.name] = template
    return out


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or '(template)'}: {err['msg']}"


@functools.lru_cache(maxsize=1)
def _packaged() -> dict[str, BlockTemplate]:
    text = resources.files("colony.memory.blocks").joinpath(PACKAGED).read_text(encoding="utf-8")
    return _parse(text, f"colony/memory/blocks/{PACKAGED}")


@functools.lru_cache(maxsize=16)
def _with_operator_file(path: str, _stamp: tuple[int, int]) -> dict[str, BlockTemplate]:
    file = Path(path)
    if file.stat().st_size > MAX_TEMPLATE_FILE_BYTES:
        raise InvalidArgument(f"template file {path} is larger than {MAX_TEMPLATE_FILE_BYTES} bytes")
    return {**_packaged(), **_parse(file.read_text(encoding="utf-8"), f"template file {path}")}


def load_templates(path: str | Path | None = None) -> dict[str, BlockTemplate]:
    """The packaged templates, plus those of the operator file `path` (which replace packaged ones
    of the same name). Cached; an operator file is read again when it changes."""
    if path is None:
        return dict(_packaged())
    file = Path(path).expanduser()
    try:
        stat = file.stat()
    except OSError as exc:
        raise InvalidArgument(f"template file {file} cannot be read: {exc.strerror}") from None
    return dict(_with_operator_file(str(file.resolve()), (stat.st_mtime_ns, stat.st_size)))


def validate_fields(template: str, schema: dict[str, Any], fields: dict[str, Any]) -> None:
    """Raise InvalidArgument naming the first field that does not fit `schema`. References only
    resolve inside the schema (`#/...`): nothing is fetched."""
    validator = validator_for(schema)(schema, registry=referencing.Registry())
    try:
        errors = sorted(validator.iter_errors(fields), key=lambda e: list(e.absolute_path))
    except referencing.exceptions.Unresolvable as exc:
        raise InvalidArgument(
            f"template {template!r}: the fields schema refers to {exc}, which is not in the schema; "
            "only local references (#/...) are resolved"
        ) from None
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(fields)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidArgument(
            f"fields of template {template!r} are not valid: {where}: {first.message}{more}"
        )


def _title(field: str) -> str:
    words = field.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def render_fields(fields: dict[str, Any], schema: dict[str, Any]) -> str:
    """Fields as initial content, one `Title: value` line each, in the schema's order (fields the
    schema does not name after, by name); empty values are left out."""
    order = list((schema.get("properties") or {}).keys())
    names = [n for n in order if n in fields] + sorted(n for n in fields if n not in order)
    lines = []
    for name in names:
        value = fields[name]
        if value is None or value == "" or value == []:
            continue
        lines.append(f"{_title(name)}: {_value(value)}")
    return "\n".join(lines)


def apply_template(
    name: str,
    fields: dict[str, Any] | None = None,
    label: str | None = None,
    *,
    schema: dict[str, Any] | None = None,
    templates_path: str | Path | None = None,
    **overrides: Any,
) -> NewBlock:
    """A NewBlock from template `name`: `fields` validated against its schema (a `custom` template
    takes the schema as `schema=`) and rendered as the initial content; `label` defaults to the
    template's name; `overrides` set other NewBlock fields (description, char_limit, ...)."""
    templates = load_templates(templates_path)
    template = templates.get(name)
    if template is None:
        raise InvalidArgument(
            f"unknown block template {name!r}; known templates: {', '.join(sorted(templates))}"
        )
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise InvalidArgument(
            f"apply_template takes no {', '.join(unknown)}; it sets: {', '.join(OVERRIDABLE)}"
        )
    if template.fields_schema is not None and schema is not None:
        raise InvalidArgument(f"template {name!r} has its own fields schema; pass no schema=")
    fields_schema = template.fields_schema or (
        check_schema(schema, f"template {name!r}") if schema is not None else None
    )
    if fields_schema is None:
        raise InvalidArgument(f"template {name!r} needs the JSON schema of its fields (schema=...)")
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise InvalidArgument(f"fields of template {name!r} must be a mapping of field name -> value")
    if len(json.dumps(fields, default=str)) > MAX_FIELDS_CHARS:
        raise InvalidArgument(
            f"fields of template {name!r} are longer than {MAX_FIELDS_CHARS} characters as JSON"
        )
    validate_fields(name, fields_schema, fields)
    body: dict[str, Any] = {
        "label": label or template.name,
        "description": template.description,
        "block_type": template.block_type,
        "char_limit": template.char_limit,
        "read_only": template.read_only,
        "content": render_fields(fields, fields_schema),
        "template": template.name,
        **overrides,
    }
    limit = body["char_limit"]
    if limit is not None and body["block_type"] != BlockType.LOG and len(body["content"]) > limit:
        raise InvalidArgument(
            f"the fields of template {name!r} come to {len(body['content'])} characters; the block's "
            f"limit is {limit}: shorten them or pass a larger char_limit"
        )
    try:
        return NewBlock.model_validate(body)
    except ValidationError as exc:
        raise InvalidArgument(f"block from template {name!r} is not valid: {_first_error(exc)}") from None
