"""Blueprints: serialisable specifications of agents, capabilities and policies.

`X.bind(**kwargs)` checks the names against X's constructor and pickles every value with
cloudpickle right there, so a spec that could not be shipped to another replica fails at bind
time with the offending argument named, not later at deployment. `local_instance(**injected)`
builds X with the bound kwargs plus what only the host knows (the agent, the blackboard).

`AgentBlueprint.to_text()` is what goes to Redis and between replicas: the pickle, base64, and an
HMAC-SHA256 of it under the colony secret (colony/security.py). `from_text()` checks the HMAC in
constant time before unpickling and refuses anything else with `BlueprintTampered`: whoever can
write Redis can change data, but cannot make a replica run code of their own.
"""

from __future__ import annotations

import base64
import functools
import inspect
import logging
import re
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import cloudpickle
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from colony import security
from colony.agents.models import AgentMetadata, AgentRun, RunServing, RunStatus
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlueprintError, BlueprintTampered

if TYPE_CHECKING:
    from colony.blackboard import Blackboard, BlackboardEntry

T = TypeVar("T")
log = logging.getLogger(__name__)


class Blueprint(Generic[T]):
    """A class plus constructor kwargs, checked to survive pickling."""

    def __init__(self, cls: type[T], kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.kwargs = dict(kwargs)
        _check_kwargs(cls, self.kwargs)

    def local_instance(self, **injected: Any) -> T:
        """Build the object here; `injected` supplies host-side dependencies (agent, blackboard, ...)."""
        accepted = _parameters(self.cls)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        extra = {k: v for k, v in injected.items() if takes_any or k in accepted}
        return self.cls(**{**self.kwargs, **extra})

    def __repr__(self) -> str:
        return f"Blueprint({self.cls.__qualname__}, {sorted(self.kwargs)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blueprint) and (self.cls, self.kwargs) == (other.cls, other.kwargs)

    __hash__ = None  # type: ignore[assignment]


INJECTED = frozenset({"agent", "blackboard"})  # supplied by the host at local_instance()


@functools.lru_cache(maxsize=512)
def _parameters(cls: type) -> MappingProxyType[str, inspect.Parameter]:
    """A class's constructor parameters, computed once per class: every spawn and restore builds
    each capability through `local_instance`, and `inspect.signature` is slow (bounded: a class
    unpickled by value is a new object each time)."""
    return inspect.signature(cls).parameters


def _check_kwargs(cls: type, kwargs: dict[str, Any]) -> None:
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = sorted(
        name
        for name, p in params.items()
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and name not in INJECTED
        and name not in kwargs
    )
    if missing:
        raise BlueprintError(f"{cls.__qualname__}.bind() is missing required argument(s) {missing}")
    if not takes_any:
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise BlueprintError(
                f"{cls.__qualname__}.bind() got unknown argument(s) {unknown}; it takes {sorted(params)}"
            )
    for name, value in kwargs.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise BlueprintError(
                f"{cls.__qualname__}.bind(): argument {name!r} ({type(value).__name__}) cannot be pickled, "
                "so the "
                f"blueprint could not travel to another replica: {type(exc).__name__}: {exc}"
            ) from None


class Bindable:
    """Mixin giving a class `bind(**kwargs) -> Blueprint[cls]`."""

    @classmethod
    def bind(cls: type[T], **kwargs: Any) -> Blueprint[T]:  # type: ignore[misc]
        return Blueprint(cls, kwargs)


class ResourceRequirements(BaseModel):
    """What an agent needs from the replica that hosts it."""

    cpu: float = Field(0.1, ge=0)
    memory_mb: int = Field(256, ge=0)
    max_tokens: int = Field(4096, ge=0)
    required_pages: list[str] = Field(default_factory=list)
    preferred_pages: list[str] = Field(default_factory=list)


class CapabilitySpec(BaseModel):
    """A capability blueprint with the actions it contributes (None = all)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    blueprint: Blueprint[Any]
    include_actions: list[str] | None = None
    exclude_actions: list[str] | None = None


class AgentBlueprint(BaseModel):
    """A whole agent: class, metadata, capabilities, policy and resources."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    agent_class: Any = Field(description="the Agent subclass")
    metadata: AgentMetadata = Field(default_factory=AgentMetadata)
    capabilities: list[Blueprint[Any] | CapabilitySpec] = Field(
        default_factory=list, description="capability blueprints, optionally with action filters"
    )
    action_policy: Blueprint[Any] | None = None
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    serving: RunServing = Field(
        default_factory=RunServing,
        description="how the role's runs are served: one agent (single) or a pool; docs/scaling.md",
    )
    agent_kwargs: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        from colony.agents.base import Agent  # here: base imports this module

        if not (isinstance(self.agent_class, type) and issubclass(self.agent_class, Agent)):
            raise BlueprintError(f"agent_class must be an Agent subclass, got {self.agent_class!r}")
        try:
            self.to_bytes()
        except Exception as exc:
            raise BlueprintError(
                f"agent blueprint for {self.agent_class!r} cannot be pickled: {exc}"
            ) from None

    def to_bytes(self) -> bytes:
        return cloudpickle.dumps(self)

    def to_text(self, *, key: bytes | None = None) -> str:
        """The signed text form: `cbp1.<hmac hex>.<base64 pickle>` (key: the colony secret's)."""
        payload = base64.b64encode(self.to_bytes())
        return f"{SIGNED_PREFIX}{security.sign(payload, key)}.{payload.decode()}"

    @staticmethod
    def from_text(text: str, *, key: bytes | None = None) -> AgentBlueprint:
        """Verify the HMAC of a `to_text()` form, then (only then) unpickle it."""
        payload = _verified_payload(text, key)
        blueprint = cloudpickle.loads(base64.b64decode(payload, validate=True))
        if not isinstance(blueprint, AgentBlueprint):
            raise BlueprintError("stored agent blueprint is not an AgentBlueprint")
        return blueprint


SIGNED_PREFIX = "cbp1."
_SIGNED = re.compile(r"cbp1\.([0-9a-f]{64})\.([A-Za-z0-9+/]*={0,2})")
_REFUSED_HINT = (
    "It was not unpickled. Either someone who can write Redis changed it, or it was written by a "
    "process with another colony secret (every process of a colony needs the same COLONY_SECRET or "
    "<data_dir>/secret file; see docs/agents.md, Trusted blueprints)."
)


def _verified_payload(text: object, key: bytes | None) -> bytes:
    """The base64 pickle of a signed blueprint text, or BlueprintTampered."""
    if not isinstance(text, str) or not text.startswith(SIGNED_PREFIX):
        raise BlueprintTampered(f"agent blueprint refused: it carries no signature. {_REFUSED_HINT}")
    match = _SIGNED.fullmatch(text)
    if match is None:
        raise BlueprintTampered(f"agent blueprint refused: its signed form is malformed. {_REFUSED_HINT}")
    payload = match.group(2).encode("ascii")
    if not security.verify(payload, match.group(1), key):
        raise BlueprintTampered(
            f"agent blueprint refused: its signature does not match the colony secret. {_REFUSED_HINT}"
        )
    return payload


async def fail_refused_agent(
    board: Blackboard,
    agent_id: str,
    reason: str,
    lifecycle: BlackboardEntry | None,
    current_run_id: str | None,
) -> None:
    """An agent whose stored blueprint is refused ends FAILED with the reason (its unfinished run
    too), so the registry, the monitor and whoever waits on the run see why it will not run again,
    instead of it being retried for ever or left looking suspended."""
    keys = AgentStateProtocol
    try:  # whoever changed the blueprint may have changed these keys too: best effort
        run_e = await board.read(keys.run_key(current_run_id)) if isinstance(current_run_id, str) else None
        run = AgentRun.model_validate(run_e.value) if run_e is not None else None
    except (ValidationError, ValueError) as exc:
        log.warning("agent %s: its current run %r is unreadable (%s)", agent_id, current_run_id, exc)
        run = None
    if run is not None and not run.done:
        run.status, run.error, run.finished_at = RunStatus.FAILED, reason, time.time()
        await board.write(keys.run_key(current_run_id), run.model_dump(mode="json"), created_by=agent_id)
    value = lifecycle.value if lifecycle is not None else None
    previous = value.get("state") if isinstance(value, dict) else None
    if previous != "failed":
        await board.write(
            keys.key("lifecycle"),
            {"state": "failed", "since": time.time(), "reason": reason, "previous": previous},
            created_by=agent_id,
        )


def serving_of(blueprint: AgentBlueprint | None) -> RunServing:
    """The blueprint's serving declaration; the default one for none, and for a blueprint stored
    (pickled) before the field existed, which unpickles without it."""
    serving = getattr(blueprint, "serving", None) if blueprint is not None else None
    return serving if isinstance(serving, RunServing) else RunServing()
