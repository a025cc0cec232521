"""Aspect-oriented hooks: `@hookable` join points intercepted by BEFORE / AROUND / AFTER hooks.

Order of one call: BEFORE hooks (by priority, then registration) -> AROUND hooks (the first is
the outermost) wrapping the method -> AFTER hooks. A BEFORE hook may change `ctx.args`/`ctx.kwargs`;
an AROUND hook calls `await proceed()` (or not, to short-circuit); an AFTER hook may return a
replacement result. Registries are per agent, so hooks of one agent never fire for another.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

HOOKABLE_ATTR = "__colony_hookable__"
HOOK_HANDLER_ATTR = "__colony_hook_handler__"


class HookType(StrEnum):
    BEFORE = "before"
    AROUND = "around"
    AFTER = "after"


@dataclass
class HookContext:
    """One intercepted call: the instance, the join point's name and the (mutable) arguments."""

    instance: Any
    join_point: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


class Pointcut:
    """Which join points a hook applies to; combine with `&`, `|` and `~`."""

    def __init__(self, predicate: Callable[[Any, str], bool], description: str) -> None:
        self._predicate = predicate
        self.description = description

    def matches(self, instance: Any, method_name: str) -> bool:
        return self._predicate(instance, method_name)

    @classmethod
    def pattern(cls, glob: str) -> Pointcut:
        """`"Class.method"` globs, matched against every class in the instance's MRO."""

        def predicate(instance: Any, method: str) -> bool:
            return any(fnmatch.fnmatchcase(f"{k.__name__}.{method}", glob) for k in type(instance).__mro__)

        return cls(predicate, glob)

    @classmethod
    def for_class(cls, klass: type, method: str = "*") -> Pointcut:
        return cls(
            lambda instance, m: isinstance(instance, klass) and fnmatch.fnmatchcase(m, method),
            f"{klass.__name__}.{method}",
        )

    @classmethod
    def for_instance(cls, obj: Any, method: str = "*") -> Pointcut:
        return cls(
            lambda instance, m: instance is obj and fnmatch.fnmatchcase(m, method), f"<{obj!r}>.{method}"
        )

    def __and__(self, other: Pointcut) -> Pointcut:
        return Pointcut(lambda i, m: self.matches(i, m) and other.matches(i, m), f"({self} & {other})")

    def __or__(self, other: Pointcut) -> Pointcut:
        return Pointcut(lambda i, m: self.matches(i, m) or other.matches(i, m), f"({self} | {other})")

    def __invert__(self) -> Pointcut:
        return Pointcut(lambda i, m: not self.matches(i, m), f"~{self}")

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class Hook:
    pointcut: Pointcut
    kind: HookType
    fn: Callable[..., Any]
    priority: int
    order: int
    owner: Any = None


class HookRegistry:
    """Hooks of one agent."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []
        self._counter = itertools.count()

    def register(
        self,
        pointcut: Pointcut,
        kind: HookType,
        fn: Callable[..., Any],
        *,
        priority: int = 0,
        owner: Any = None,
    ) -> Hook:
        hook = Hook(pointcut, HookType(kind), fn, priority, next(self._counter), owner)
        self._hooks.append(hook)
        return hook

    def unregister(self, hook: Hook) -> None:
        self._hooks.remove(hook)

    def unregister_owner(self, owner: Any) -> None:
        """Drop every hook a capability registered (on its removal)."""
        self._hooks = [h for h in self._hooks if h.owner is not owner]

    def matching(self, instance: Any, method: str, kind: HookType) -> list[Hook]:
        found = [h for h in self._hooks if h.kind is kind and h.pointcut.matches(instance, method)]
        return sorted(found, key=lambda h: (-h.priority, h.order))

    def __len__(self) -> int:
        return len(self._hooks)


def _registry_of(instance: Any) -> HookRegistry | None:
    registry = getattr(instance, "hooks", None)
    if isinstance(registry, HookRegistry):
        return registry
    agent = getattr(instance, "agent", None)
    registry = getattr(agent, "hooks", None)
    return registry if isinstance(registry, HookRegistry) else None


async def _maybe_await(value: Any) -> Any:
    return await value if isinstance(value, Awaitable) else value


def hookable(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Make an async method a join point of the owning agent's HookRegistry."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        registry = _registry_of(self)
        if registry is None or not len(registry):
            return await method(self, *args, **kwargs)
        ctx = HookContext(self, f"{type(self).__name__}.{name}", args, kwargs)
        for hook in registry.matching(self, name, HookType.BEFORE):
            await _maybe_await(hook.fn(ctx))

        async def innermost() -> Any:
            return await method(self, *ctx.args, **ctx.kwargs)

        call = innermost
        for hook in reversed(registry.matching(self, name, HookType.AROUND)):
            call = functools.partial(_around, hook.fn, ctx, call)
        result = await call()
        for hook in registry.matching(self, name, HookType.AFTER):
            replaced = await _maybe_await(hook.fn(ctx, result))
            if replaced is not None:
                result = replaced
        return result

    setattr(wrapper, HOOKABLE_ATTR, True)
    return wrapper  # type: ignore[return-value]


async def _around(fn: Callable[..., Any], ctx: HookContext, proceed: Callable[[], Awaitable[Any]]) -> Any:
    return await _maybe_await(fn(ctx, proceed))


@dataclass(frozen=True)
class HookHandlerSpec:
    pointcut: Pointcut
    kind: HookType
    priority: int


def hook_handler(
    pointcut: Pointcut | str, kind: HookType = HookType.BEFORE, *, priority: int = 0
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Mark a capability method as a hook; it is registered when the capability joins an agent."""
    spec = HookHandlerSpec(
        Pointcut.pattern(pointcut) if isinstance(pointcut, str) else pointcut, kind, priority
    )

    def mark(fn: Callable[P, R]) -> Callable[P, R]:
        setattr(fn, HOOK_HANDLER_ATTR, spec)
        return fn

    return mark
