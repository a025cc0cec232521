"""Which tenant an agent belongs to, read from its id: one colony serves many tenants.

The colony's own tenant (its `tenant_id` setting, the "home" tenant, which the deployment's API
token acts for) names its agents as before. Every other tenant's agents carry the tenant in their
id: `t.<tenant>.<name>` (`t.acme.echo`, `t.acme.session-0123456789abcdef`), so that:

- ownership needs no lookup (an id says whose it is, on every route, before anything is read);
- ids are scoped: tenant `b` cannot name, create or collide with an agent of tenant `a` (its ids
  start with `t.b.`), and every id of another tenant answers 404 whether that agent exists or not;
- an agent's children get its prefix (`prefix_of(parent)`), so what an agent starts stays its
  tenant's.

Ids starting `t.` are reserved for this: the home tenant may not make one, and one that does not
read `t.<tenant>.<name>` with a valid tenant belongs to nobody (no token sees it).
"""

from __future__ import annotations

import re

TENANT_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
TENANT_RULE = "1-32 characters: lower-case letters, digits and '-' (starting with a letter or digit)"
MARK = "t."  # the start of every id of a tenant other than the colony's own
NOBODY = "\x00"  # the tenant of a malformed reserved id: no principal's
_TENANT = re.compile(TENANT_PATTERN)
MAX_ID = 128  # agent ids are at most this long (colony.wire.ids), prefix included


def is_tenant_name(text: str) -> bool:
    return bool(_TENANT.match(text))


def tenant_of(agent_id: str, home: str) -> str:
    """The tenant owning `agent_id` in a colony whose own tenant is `home`."""
    if not agent_id.startswith(MARK):
        return home
    name, dot, rest = agent_id[len(MARK) :].partition(".")
    if dot and rest and _TENANT.match(name) and name != home:
        return name
    return NOBODY


def prefix(tenant: str, home: str) -> str:
    """What the ids of `tenant`'s agents start with ("" for the colony's own tenant)."""
    return "" if tenant == home else f"{MARK}{tenant}."


def prefix_of(agent_id: str, home: str) -> str:
    """The prefix of `agent_id`'s tenant: what the ids of the agents it starts begin with."""
    tenant = tenant_of(agent_id, home)
    return "" if tenant in (home, NOBODY) else prefix(tenant, home)


def owned_id(tenant: str, home: str, name: str) -> str:
    """`name` as an id of `tenant`: unchanged for the home tenant, or when it is a tenant's id
    already (`t.`...: the caller checks whose, `tenant_of`); ValueError when the result is too
    long for an id."""
    start = prefix(tenant, home)
    agent_id = name if name.startswith(MARK) or not start else f"{start}{name}"
    if len(agent_id) > MAX_ID:
        raise ValueError(f"{agent_id[:40]!r}...: an agent id is at most {MAX_ID} characters with its tenant")
    return agent_id


def local_name(agent_id: str, home: str) -> str:
    """`agent_id` without its tenant's prefix (what the tenant asked for: `echo` for `t.acme.echo`)."""
    return agent_id[len(prefix_of(agent_id, home)) :]
