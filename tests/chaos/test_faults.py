"""Issue 12, items 4 and 6: the chaos suite. One real `colony up` cluster (2 engine replicas, the
embedded model, embedded Redis under the daemon's supervisor); for each fault, 45 runs are
submitted just before it is injected (20-30 of them still unfinished when it hits) and more during
it. Every accepted run must end (0 lost, 0 stuck, none failed), a new run must succeed within 15 s
of the fault's end, and the invariant checker must be clean afterwards. `benchmarks/chaos.py` is
the same harness, longer, printing a table."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import chaos

pytestmark = pytest.mark.timeout(900)

RESULTS: list[chaos.FaultResult] = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[chaos.ChaosCluster]:
    cluster = chaos.ChaosCluster(tmp_path_factory.mktemp("chaos"), replicas=2)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()
        if RESULTS:
            print("\n" + chaos.table(RESULTS))


@pytest.mark.parametrize("fault", list(chaos.FAULTS))
def test_every_accepted_run_ends_and_the_cluster_heals(cluster: chaos.ChaosCluster, fault: str) -> None:
    result = chaos.run_fault(cluster, fault, runs=45, settle_timeout=90, recovery_budget=45)
    RESULTS.append(result)
    unfinished = {r: s for r, s in result.statuses.items() if s not in chaos.TERMINAL}
    detail = f"\n{chaos.table([result])}\nunfinished: {unfinished}\nviolations: {result.violations}"
    assert result.accepted >= 45, detail  # the burst before the fault was accepted in full
    assert result.in_flight >= 1, detail  # the fault caught runs unfinished
    assert result.lost == 0, detail
    assert result.stuck == 0, detail
    assert result.recovery_s is not None and result.recovery_s <= chaos.RECOVERY_BAR_S, detail
    assert result.doctor_clean, detail
    # the `ask` run followed through the fault: its stream ended, nothing repeated (item 5)
    assert result.stream_problem is None, detail
    # and none failed: an outage or pause is waited out and the work it cut short redone, a dead
    # replica's agents are restored elsewhere (failing with a reason is allowed by the bar,
    # but nothing here has a reason to fail; before the redo, a Redis pause failed 1-2 runs in 30)
    assert result.failed == 0, detail


def test_the_restarted_daemon_supervises_redis_again(cluster: chaos.ChaosCluster) -> None:
    """After the daemon was killed and `colony up` ran again (the last fault above), the new daemon
    supervises the embedded redis-server: killed once more, it comes back and runs succeed."""
    if "daemon-restart" not in {r.fault for r in RESULTS}:
        chaos.daemon_restart(cluster)
    before = chaos.redis_restarts(cluster)
    chaos.redis_kill(cluster)
    assert chaos.wait_until(lambda: chaos.redis_restarts(cluster) == before + 1, 20)
    assert chaos.time_to_first_success(cluster, 30) is not None
