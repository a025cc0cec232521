"""What the resource monitor tells each replica about the suspended page-bound agents it would
resume there: their pages, closest resumption first (`ReplicaPages.needed_soon`, docs/vcm.md).

Each round the monitor judges every suspended agent's condition anyway (`ResumptionMonitor._judge`);
how close an unmet condition is comes from what it reads for that, at no extra cost:
`children_done` counts the children done from their registry records in one round trip (fewer
reads than the one-by-one check it replaced), the pages resident anywhere come from the replica
views of the round. Closeness, 0 to 1 (`Judged.close`): 1 for a condition that holds (the agent
waits for room, or its resume failed this round), the fraction of children done, the fraction of
pages resident somewhere, 0.5 for a resource condition no replica has room for yet, 0 where nothing
says when (it waits to be asked for). `NeededSoonPublisher` leaves one entry per replica
(`AgentRegistry.put_needed_soon`): the pages of the agents whose pages are resident or swapped there
(an agent goes to the replica holding most of its pages), closest first, priority then FIFO among
equals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlackboardUnavailable
from colony.system.registry import (
    DONE_STATES,
    NEEDED_SOON_PAGES,
    NEEDED_SOON_TTL_SECONDS,
    AgentRegistry,
)
from colony.vcm.placement import ReplicaView

log = logging.getLogger(__name__)

WAITS_FOR_ROOM = 0.5  # closeness of an agent whose condition holds once a replica has room


@dataclass(frozen=True, slots=True)
class Judged:
    """A suspended agent's condition as judged this round: whether it holds, how close it is
    (0 to 1) and why, for the replicas' needed-soon lists."""

    met: bool
    close: float
    why: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """A page-bound agent left suspended this round: its pages and how close its resumption is."""

    agent_id: str
    pages: list[str]
    close: float
    why: str


async def children_done(
    registry: AgentRegistry, board_of: Callable[[str], Blackboard], child_ids: Sequence[str]
) -> tuple[int, int]:
    """(children done, children): done by their registry records (one round trip), and, for those
    the registry does not show done, by their lifecycle (the source of truth; a record may lag), in
    order until the first that is not done: the count is exact whenever it matters (all done),
    a lower bound otherwise."""
    if not child_ids:
        return 0, 0
    records = await registry.get_many(list(child_ids))
    done = 0
    undone: list[str] = []
    for child, record in zip(child_ids, records, strict=True):
        if record is not None and record.state in DONE_STATES:
            done += 1
        else:
            undone.append(child)
    for child in undone:
        lifecycle = await board_of(child).read(AgentStateProtocol.key("lifecycle"))
        value = lifecycle.value if lifecycle is not None and isinstance(lifecycle.value, dict) else {}
        if value.get("state") not in DONE_STATES:
            break
        done += 1
    return done, len(child_ids)


def pages_resident(views: Sequence[ReplicaView], pages: Sequence[str]) -> int:
    """How many of the pages some replica holds in its KV cache (the round's views)."""
    return sum(1 for page_id in pages if any(page_id in view.resident for view in views))


class NeededSoonPublisher:
    """Writes each replica's needed-soon entry from a round's waiting agents (see the module
    docstring); remembers what it last wrote, to write only changes."""

    def __init__(self, registry: AgentRegistry) -> None:
        self.registry = registry
        self._published: dict[str, tuple[tuple[str, ...], tuple[float, ...], float]] = {}

    async def publish(self, views: Sequence[ReplicaView], waiting: Sequence[Waiting]) -> None:
        """Tell each replica which pages the page-bound agents left suspended will need there
        (`ReplicaHost.paging.refresh_needed_soon` reads it, one read per heartbeat, whatever the
        number of suspended agents), closest resumption first (`waiting` comes highest priority
        first, FIFO among equals: the sort keeps that order among equally close agents), at most
        `NEEDED_SOON_PAGES` pages a replica; written when it changed or its entry is a third of
        `NEEDED_SOON_TTL_SECONDS` old (it expires if the control plane stops), deleted once empty.
        A preference only: a failed write is retried next round, never the round's end."""
        soon: dict[str, dict[str, Waiting]] = {}
        for agent in sorted(waiting, key=lambda w: -w.close):
            wanted = set(agent.pages)
            for view in views:
                held = soon.setdefault(view.replica_id, {})
                if len(held) < NEEDED_SOON_PAGES and wanted & (view.resident | view.swapped):
                    for page_id in agent.pages[: NEEDED_SOON_PAGES - len(held)]:
                        held.setdefault(page_id, agent)
        now = time.monotonic()
        try:
            for replica_id in sorted(set(soon) | set(self._published)):
                named = soon.get(replica_id, {})
                pages = tuple(named)
                close = tuple(named[p].close for p in pages)
                last = self._published.get(replica_id)
                fresh = last is not None and now - last[2] < NEEDED_SOON_TTL_SECONDS / 3
                if fresh and last is not None and (last[0], last[1]) == (pages, close):
                    continue
                if pages:
                    why = [f"{named[p].agent_id}: {named[p].why}" for p in pages]
                    await self.registry.put_needed_soon(
                        replica_id, list(pages), NEEDED_SOON_TTL_SECONDS, close=list(close), why=why
                    )
                    self._published[replica_id] = (pages, close, now)
                elif last is not None:
                    await self.registry.clear_needed_soon(replica_id)
                    del self._published[replica_id]
        except BlackboardUnavailable as exc:
            log.debug("pages needed soon not published this round: %s", exc)
