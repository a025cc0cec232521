"""What an agent import trusts: the imported agent's code (its blueprint) and identity come from
the target colony's own sources only, never from the document (docs/transfer.md, step 2).

The colony's catalog (a built-in, or an operator's `agents:` entry) builds the blueprint for the
agent's id; else the document's signed blueprint is taken when its HMAC verifies under this
colony's secret, and only then loaded, as a replica of this colony loads it. Anything else is
`ImportRejected`; a blueprint that does not verify is never unpickled.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from colony.agents.blueprint import AgentBlueprint, _verified_payload
from colony.agents.models import AgentMetadata
from colony.config import ColonySettings
from colony.errors import BlueprintTampered, ColonyError, ImportRejected
from colony.system.export_document import AgentExport


class Trusted(NamedTuple):
    """The imported agent's code and identity, from the target colony's trusted sources only."""

    text: str  # the signed blueprint stored for the agent
    origin: str  # "catalog:<name>" or "signed"
    metadata: AgentMetadata  # the blueprint's: role, type, priority, pages (never the document's)


def trusted_blueprint(doc: AgentExport, settings: ColonySettings, catalog: str | None) -> Trusted:
    """The blueprint from the target colony's trusted sources: the catalog agent `catalog` (else
    the document's catalog name), built here by the colony's own factory; else the document's
    signed blueprint when its HMAC verifies under this colony's secret (then, and only then, read
    like a replica of this colony reads it, for its metadata). ImportRejected otherwise.

    The document's own catalog name counts only when it is the agent's id: an export names the
    catalog agent it was (a catalog agent's id is its name), so a document cannot pick another
    kind (a `session` starter, a service) for an agent of its choosing; the operator's `catalog`
    argument can."""
    claimed = doc.blueprint.catalog if doc.blueprint.catalog == doc.agent_id else None
    name = catalog or claimed
    if name is not None:
        factory = _catalog_factory(name, settings)
        if factory is not None:
            try:
                blueprint = factory(doc.agent_id)
            except Exception as exc:  # the colony's own factory failed: say which
                raise ImportRejected(
                    f"catalog agent {name!r} could not build agent {doc.agent_id}: {exc}"
                ) from exc
            if not isinstance(blueprint, AgentBlueprint) or blueprint.metadata.agent_id != doc.agent_id:
                raise ImportRejected(
                    f"catalog agent {name!r} did not return a blueprint for agent {doc.agent_id!r} (its "
                    "factory must use the agent id it is called with)"
                )
            return Trusted(blueprint.to_text(), f"catalog:{name}", blueprint.metadata)
        if catalog is not None:
            raise ImportRejected(
                f"{catalog!r} is not a catalog agent of this colony (GET /v1/agents/catalog lists them)"
            )
    if doc.blueprint.signed is not None:
        try:
            _verified_payload(doc.blueprint.signed, None)
        except BlueprintTampered:
            pass
        else:
            return Trusted(doc.blueprint.signed, "signed", _signed_metadata(doc, doc.blueprint.signed))
    raise ImportRejected(
        f"agent {doc.agent_id}'s blueprint (its code) cannot be trusted here: it names no catalog agent of "
        "this colony and its signature does not verify under this colony's secret. Import it with "
        "catalog=<name> naming the catalog agent (GET /v1/agents/catalog) that builds this kind of agent, "
        "or between colonies that share one colony secret (COLONY_SECRET)"
    )


def _signed_metadata(doc: AgentExport, signed: str) -> AgentMetadata:
    """The metadata inside a signed blueprint that verified under this colony's secret: whoever
    signed it holds that secret, so it is loaded as every replica of this colony loads it."""
    try:
        blueprint = AgentBlueprint.from_text(signed)
    except Exception as exc:  # verified, but not loadable in this process (a module it lacks)
        raise ImportRejected(
            f"agent {doc.agent_id}'s signed blueprint verifies but cannot be loaded here ({exc}); import "
            "it with catalog=<name> naming the catalog agent that builds this kind of agent"
        ) from None
    if blueprint.metadata.agent_id != doc.agent_id:
        raise ImportRejected(
            f"the document's signed blueprint is agent {blueprint.metadata.agent_id}'s, not {doc.agent_id}'s"
        )
    return blueprint.metadata


def _catalog_factory(name: str, settings: ColonySettings) -> Any:
    from colony.system.catalog import BUILTIN_AGENTS, resolve_factory

    if name in BUILTIN_AGENTS:
        return BUILTIN_AGENTS[name]
    path = settings.agents.get(name)
    if path is None:
        return None
    try:
        return resolve_factory(name, path)
    except ColonyError as exc:
        raise ImportRejected(f"catalog agent {name!r} is not usable in this colony: {exc}") from exc
