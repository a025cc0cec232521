"""PageAffinityRouter: Ray Serve request router sending page-bound calls to the replica holding the pages.

Engine replicas publish what they hold through `record_routing_stats()` ({"resident": [...],
"swapped": [...], "agents": n}); the router reads it as `replica.routing_stats` and ranks the
candidates with `colony.vcm.placement.rank_replicas` (the same code the simulator runs). A call
names its pages with the keyword argument `page_ids`; calls without pages go to the least loaded.
A call carrying `target_replica` (the control plane addressing one replica) goes to that replica;
if it is not among the running ones the call is ranked as usual and the replica that gets it
refuses it with `ReplicaUnavailable`.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from colony.vcm.placement import ReplicaView, rank_replicas


def replica_view(replica: RunningReplica) -> ReplicaView:
    stats: dict[str, Any] = replica.routing_stats or {}
    return ReplicaView(
        replica.replica_id.unique_id,
        resident=set(stats.get("resident") or ()),
        swapped=set(stats.get("swapped") or ()),
        load=int(stats.get("agents", 0)),
    )


class PageAffinityRouter(FIFOMixin, RequestRouter):
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request else {}
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        target = kwargs.get("target_replica")
        if target in by_id:
            return [[by_id[target]]]
        page_ids = list(kwargs.get("page_ids") or [])
        ranked = rank_replicas([replica_view(r) for r in candidate_replicas], page_ids)
        return [[by_id[view.replica_id]] for view in ranked]
