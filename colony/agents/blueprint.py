"""Blueprints: serialisable specifications of agents, capabilities and policies.

`X.bind(**kwargs)` checks the names against X's constructor and pickles every value with
cloudpickle right there, so a spec that could not be shipped to another replica fails at bind
time with the offending argument named, not later at deployment. `local_instance(**injected)`
builds X with the bound kwargs plus what only the host knows (the agent, the blackboard).
"""

from __future__ import annotations

import base64
import inspect
from typing import Any, Generic, TypeVar

import cloudpickle
from pydantic import BaseModel, ConfigDict, Field

from colony.agents.models import AgentMetadata
from colony.errors import BlueprintError

T = TypeVar("T")


class Blueprint(Generic[T]):
    """A class plus constructor kwargs, checked to survive pickling."""

    def __init__(self, cls: type[T], kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.kwargs = dict(kwargs)
        _check_kwargs(cls, self.kwargs)

    def local_instance(self, **injected: Any) -> T:
        """Build the object here; `injected` supplies host-side dependencies (agent, blackboard, ...)."""
        accepted = inspect.signature(self.cls).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        extra = {k: v for k, v in injected.items() if takes_any or k in accepted}
        return self.cls(**{**self.kwargs, **extra})

    def __repr__(self) -> str:
        return f"Blueprint({self.cls.__qualname__}, {sorted(self.kwargs)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blueprint) and (self.cls, self.kwargs) == (other.cls, other.kwargs)

    __hash__ = None  # type: ignore[assignment]


INJECTED = frozenset({"agent", "blackboard"})  # supplied by the host at local_instance()


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

    def to_text(self) -> str:
        return base64.b64encode(self.to_bytes()).decode()

    @staticmethod
    def from_text(text: str) -> AgentBlueprint:
        blueprint = cloudpickle.loads(base64.b64decode(text))
        if not isinstance(blueprint, AgentBlueprint):
            raise BlueprintError("stored agent blueprint is not an AgentBlueprint")
        return blueprint
