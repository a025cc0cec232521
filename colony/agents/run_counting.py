"""Which runs an agent counts as ended (`AgentRunCapability`'s `cap.counting`): a run submitted
over the HTTP API (its request written by the API) is counted in `colony_runs_completed_total` and
`colony_run_duration_seconds` by the agent whose create-only answer stored its result, so each is
counted once in the cluster, when it ends, whether or not anyone reads it (docs/metrics.md). A run
the API ends itself (cancelled, timed out) is counted by the API process whose result write did it
(`RunService._finish`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from colony import metrics
from colony.agents.run_claims import API_INDEXED_WRITER, API_WRITER

if TYPE_CHECKING:
    from colony.blackboard import BlackboardEntry

REQUESTS_NOTED = 1024  # HTTP runs being served whose submit time a capability keeps (the newest)


class RunCounting:
    """The HTTP runs an `AgentRunCapability` serves, noted when read and counted when answered (once);
    held by the capability as `cap.counting`."""

    def __init__(self) -> None:
        self._api_requests: OrderedDict[str, float] = OrderedDict()  # request id -> submit time

    def noted(self, request_id: str) -> bool:
        """Whether the request was noted as an HTTP run being served."""
        return request_id in self._api_requests

    def note(self, request_id: str, request: BlackboardEntry | None) -> None:
        """Remember when an HTTP run's request was written (Redis' clock), to count its end."""
        if request is None or not isinstance(request.value, dict):
            return
        if request.created_by not in (API_WRITER, API_INDEXED_WRITER):
            return  # another agent's request (an AgentHandle's): not a run of the API
        self._api_requests[request_id] = request.created_at
        self._api_requests.move_to_end(request_id)
        while len(self._api_requests) > REQUESTS_NOTED:
            self._api_requests.popitem(last=False)

    def count_answer(self, request_id: str, status: str) -> None:
        """This copy stored the request's result: an HTTP run ended, counted here (once)."""
        requested = self._api_requests.pop(request_id, None)
        if requested is not None:
            metrics.run_ended(status, time.time() - requested)
