"""The agents every colony starts with, by name: the built-ins, and the operator's own agents named
in the `agents:` settings (`name: "package.module:factory"`).

A user agent is built exactly like a built-in: a factory called with the agent id returns an
`AgentBlueprint`, the control plane places it when the colony starts, and runs reach it through
`POST /v1/runs` by that name. The import path is operator configuration and trusted like the code
of the image itself: importing it runs the package's code in every replica. Nothing a request
carries ever chooses what is imported; requests can only name an agent that is already placed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import cast

from colony.agents import AgentBlueprint
from colony.agents.models import RunServing
from colony.config import ColonySettings, PoolSettings
from colony.errors import ConfigError
from colony.system.analyze import analyze_blueprint
from colony.system.assistant import assistant_blueprint
from colony.system.builtin import ask_blueprint, echo_blueprint, session_starter_blueprint
from colony.system.research import research_blueprint

AgentFactory = Callable[[str], AgentBlueprint]

BUILTIN_AGENTS: dict[str, AgentFactory] = {
    "echo": echo_blueprint,
    "ask": ask_blueprint,
    "analyze": analyze_blueprint,
    "assistant": assistant_blueprint,
    "research": research_blueprint,
    "session": session_starter_blueprint,
}

_INSTALL_HINT = (
    "install the package where Colony runs (the image: a `FROM colony` image that pip-installs it, "
    "docker/README.md; a local `colony up`: the venv, or its folder on PYTHONPATH)"
)


def _problem(name: str, path: str, what: str) -> ConfigError:
    return ConfigError(f"user agent agents.{name} = {path!r}: {what}")


def resolve_factory(name: str, path: str) -> AgentFactory:
    """Import `package.module:factory` and return the factory; `ConfigError` naming the setting and
    the fix when the module does not import or has no such callable."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise _problem(
            name, path, f"cannot import module {module_name!r} (no module named {missing!r}); {_INSTALL_HINT}"
        ) from exc
    except Exception as exc:  # the package's own code failed while importing
        raise _problem(
            name, path, f"importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise _problem(name, path, f"module {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise _problem(
            name, path, f"{attribute!r} is a {type(factory).__name__}, not a function returning a blueprint"
        )
    return cast(AgentFactory, factory)


def build_blueprint(name: str, factory: AgentFactory, path: str = "") -> AgentBlueprint:
    """`factory(name)`, checked: it must return an `AgentBlueprint` whose agent id is `name` (the id
    runs address), else `ConfigError` saying what it returned."""
    where = path or getattr(factory, "__qualname__", repr(factory))
    try:
        blueprint = factory(name)
    except Exception as exc:
        raise _problem(name, where, f"the factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(blueprint, AgentBlueprint):
        raise _problem(
            name,
            where,
            f"the factory returned a {type(blueprint).__module__}.{type(blueprint).__qualname__}; "
            "it must return a colony.agents.AgentBlueprint",
        )
    if blueprint.metadata.agent_id != name:
        raise _problem(
            name,
            where,
            f"the factory returned a blueprint for agent {blueprint.metadata.agent_id!r}; it must use the "
            f"agent id it is called with ({name!r}), e.g. AgentMetadata(agent_id=agent_id)",
        )
    return blueprint


def user_agents(agents: Mapping[str, str]) -> dict[str, AgentFactory]:
    """The factories of the `agents:` settings, imported; `ConfigError` listing the first problem
    (a name taken by a built-in, a module that does not import, no such factory)."""
    factories: dict[str, AgentFactory] = {}
    for name, path in agents.items():
        if name in BUILTIN_AGENTS:
            raise _problem(
                name,
                path,
                f"{name!r} is a built-in agent ({', '.join(sorted(BUILTIN_AGENTS))}) and cannot be "
                "replaced; give the user agent another name",
            )
        factories[name] = resolve_factory(name, path)
    return factories


def catalog_names(agents: Mapping[str, str]) -> list[str]:
    """The catalog's names, built-ins first, then the `agents:` settings' (`agents`): what the API
    may know of the catalog without importing a user agent's package."""
    return [*BUILTIN_AGENTS, *(name for name in agents if name not in BUILTIN_AGENTS)]


def pool_serving(pool: PoolSettings) -> RunServing:
    """A built-in pool's serving declaration from its settings (`runs.echo_pool`, `runs.ask_pool`)."""
    if pool.min_size > pool.max_size:
        raise ConfigError(
            f"a pool's min_size ({pool.min_size}) exceeds its max_size ({pool.max_size}) "
            "(runs.echo_pool / runs.ask_pool); raise max_size or lower min_size"
        )
    return RunServing(mode="pool", **pool.model_dump())


def colony_blueprints(settings: ColonySettings) -> dict[str, AgentBlueprint]:
    """Every agent the colony starts with, built: the built-ins (the echo and ask pools sized by
    the settings), then the user agents, each checked (`ConfigError` on the first bad one)."""
    blueprints = {name: make(name) for name, make in BUILTIN_AGENTS.items()}
    for name, pool in (("echo", settings.runs.echo_pool), ("ask", settings.runs.ask_pool)):
        blueprints[name] = blueprints[name].model_copy(update={"serving": pool_serving(pool)})
    blueprints["session"] = session_starter_blueprint(
        "session", max_tokens=settings.context.session_reply_tokens
    )
    for name, factory in user_agents(settings.agents).items():
        blueprints[name] = build_blueprint(name, factory, settings.agents[name])
    return blueprints


def catalog_factories(settings: ColonySettings) -> dict[str, AgentFactory]:
    """Every catalog name with its factory: the built-ins, then the operator's `agents:` (what an
    agent may start as a child, colony.system.collaborate)."""
    return {**BUILTIN_AGENTS, **user_agents(settings.agents)}


def tenant_blueprint(settings: ColonySettings, name: str, agent_id: str) -> AgentBlueprint:
    """Catalog agent `name` as another tenant's own instance `agent_id` (`t.<tenant>.<name>`,
    colony.wire.tenants): built by the same factory, so it behaves as the colony's, but its state,
    memory and runs are its tenant's. A pooled built-in (echo, ask; an `agents:` pool) runs as one
    agent per tenant (the pool manager sizes the colony's own pools only). `KeyError` for a name
    not in the catalog."""
    factories = catalog_factories(settings) if name in settings.agents else BUILTIN_AGENTS
    if name == "session":
        blueprint = session_starter_blueprint(agent_id, max_tokens=settings.context.session_reply_tokens)
    else:
        blueprint = build_blueprint(agent_id, factories[name], settings.agents.get(name, ""))
    return blueprint.model_copy(update={"serving": RunServing()})
