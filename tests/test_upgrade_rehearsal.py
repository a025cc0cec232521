"""Issue 14 item 7: the upgrade rehearsal. A RayService upgrade replaces every replica; here it is
rehearsed on a real `colony up` cluster (2 engine replicas, the embedded model, embedded Redis).

While runs are in flight (echo, a few `ask`, and runs of an extra agent bound to a page), a new
Serve config is applied to the running Ray cluster the way KubeRay applies a changed
`serveConfigV2` in place: a separate process connects to the cluster (`ray.init(address=...)`, the
GCS address `colony up` records) and does what the Ray dashboard's `PUT /api/serve/applications/`
does (`serve_start` + `deploy_apps` with a `ServeDeploySchema`), with the application's args
changed (`replica_cpus`). Serve rebuilds the app and replaces every replica of every deployment.

Asserted: every replica id changed (EngineReplica, AgentSystem, ColonyAPI); every accepted run
succeeded (0 lost, 0 failed, 0 stuck); the agents (built-ins and the extra one) keep their ids and
are hosted on the new engine replicas; `colony doctor --run ...` exits 0; an `ask` run's event
stream followed across the upgrade ends with its terminal event; the `colony up` daemon still
serves, and `colony down` stops every process of its Ray cluster; the control plane's own
actor-table lookup (`ServeReplicas.liveness`, run in the helper process) says the old engine
replicas are dead and the new ones alive.

Kept cheap for CI (~78 s, was ~93 s): a few runs in flight rather than dozens, a 5 s overlap of the two
clusters, a 1.5 s heartbeat (the NewCluster takeover waits for heartbeats to expire), and the
second cluster's `colony up` started while the in-place test checks its runs.

The file is also the helper the test runs in a subprocess (`python tests/test_upgrade_rehearsal.py
actors|place|upgrade ...`), so the pytest process never joins the cluster's Ray.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import asyncio
import subprocess

import chaos
import pytest

from colony.blackboard.redis_server import EmbeddedRedis
from colony.client import ColonyClient
from colony.serve import cluster as cluster_mod

APP = "colony"
DEPLOYMENTS = ("EngineReplica", "AgentSystem", "ColonyAPI")
EXTRA_AGENT = "rehearsal-echo"
UPGRADED_REPLICA_CPUS = 0.45  # was serve.replica_cpus=0.5: a change of the app's args


def serve_config(host: str, port: int, replicas: int, replica_cpus: float) -> dict[str, Any]:
    """The Serve config an upgraded RayService carries (the shape of deployments/local-cpu.yaml and
    of the chart's serveConfigV2); settings come from the replicas' environment, as in a pod."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": APP,
                "route_prefix": "/",
                "import_path": "colony.serve.app:build_app",
                "args": {"replicas": replicas, "replica_cpus": replica_cpus},
                "deployments": [
                    {"name": "ColonyAPI", "ray_actor_options": {"num_cpus": 0.1}},
                    {"name": "AgentSystem", "ray_actor_options": {"num_cpus": 0.1}},
                    {
                        "name": "EngineReplica",
                        "num_replicas": replicas,
                        "ray_actor_options": {"num_cpus": replica_cpus},
                    },
                ],
            }
        ],
    }


# --- the helper process (connected to the cluster's Ray) ----------------------------------------


def _replica_actors() -> dict[str, list[str]]:
    """The Serve replica ids of the app, by deployment, from the named actors Serve starts
    (`SERVE_REPLICA::colony#<Deployment>#<id>`)."""
    import ray

    found: dict[str, list[str]] = {name: [] for name in DEPLOYMENTS}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"] if isinstance(actor, dict) else actor
        parts = name.removeprefix("SERVE_REPLICA::").split("#")
        if name.startswith("SERVE_REPLICA::") and len(parts) == 3 and parts[0] == APP and parts[1] in found:
            found[parts[1]].append(parts[2])
    return {name: sorted(ids) for name, ids in found.items()}


def _upgrade(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Apply `config` as the dashboard's `PUT /api/serve/applications/` does (the call KubeRay
    makes for a changed serveConfigV2), then wait until the app runs on replicas none of which is
    an old one, and every old replica is gone."""
    from ray import serve
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    before = _replica_actors()
    schema = ServeDeploySchema.model_validate(config)
    started = time.monotonic()
    client = serve_start(http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location)
    client.deploy_apps(schema)
    engines = config["applications"][0]["args"]["replicas"]
    wanted = {"EngineReplica": engines, "AgentSystem": 1, "ColonyAPI": 1}
    after: dict[str, list[str]] = {}
    status = ""
    while time.monotonic() - started < timeout:
        after = _replica_actors()
        app = serve.status().applications.get(APP)
        status = str(getattr(app.status, "value", app.status)) if app else "missing"
        replaced = all(len(after[d]) == wanted[d] and not set(after[d]) & set(before[d]) for d in DEPLOYMENTS)
        if status == "RUNNING" and replaced:
            break
        if status == "DEPLOY_FAILED":  # the new config cannot run: say why, from Serve's status
            from colony.serve.cluster import deploy_failure

            status = f"DEPLOY_FAILED: {deploy_failure(serve.status(), APP)}"
            break
        time.sleep(0.25)
    return {"before": before, "after": after, "status": status, "seconds": time.monotonic() - started}


def _place(blueprint_text: str) -> dict[str, Any]:
    """Place an agent through the AgentSystem deployment (what a hosted agent's spawn does)."""
    from ray import serve

    handle = serve.get_deployment_handle("AgentSystem", app_name=APP)
    result: dict[str, Any] = handle.place.remote(blueprint_text).result(timeout_s=60)
    return result


def _extra_blueprint(page_ids: list[str]) -> str:
    """An echo agent of our own, bound to `page_ids`, signed with the colony's secret (the helper
    runs with the cluster's COLONY_DATA_DIR, so it reads the same secret file)."""
    from colony import security
    from colony.agents import (
        Agent,
        AgentBlueprint,
        AgentMetadata,
        AgentRunCapability,
        AgentType,
        ScriptedActionPolicy,
    )
    from colony.config import load_settings
    from colony.system.builtin import RUNS_NAMESPACE, EchoCapability

    security.use_settings(load_settings())
    blueprint = AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=EXTRA_AGENT, agent_type=AgentType.SERVICE, role="echo", bound_pages=page_ids
        ),
        capabilities=[EchoCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "echo", "parameters": {"value": "$input"}}]
        ),
    )
    return blueprint.to_text()


def _liveness(replica_ids: list[str]) -> dict[str, Any]:
    """What the control plane's `ServeReplicas` (the real actor-table lookup) says of each
    EngineReplica id, and each one's state in the whole actor table."""
    from ray import serve

    from colony.config import load_settings
    from colony.serve.app import connect_registry
    from colony.serve.replicas import ServeReplicas

    handle = serve.get_deployment_handle("EngineReplica", app_name=APP)

    async def ask() -> dict[str, Any]:
        _board, registry = connect_registry(load_settings(), "rehearsal:liveness")
        directory = ServeReplicas(handle, registry)
        table = await asyncio.to_thread(directory._replica_actors)
        return {
            "liveness": await directory.liveness(replica_ids),
            "table": {r: table.get(r) for r in replica_ids},
        }

    return asyncio.run(ask())


def _helper(argv: list[str]) -> None:
    import ray

    command, address, payload = argv[0], argv[1], json.loads(argv[2])
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        if command == "actors":
            out: Any = _replica_actors()
        elif command == "place":
            out = _place(_extra_blueprint(payload["pages"]))
        elif command == "upgrade":
            out = _upgrade(payload["config"], payload["timeout"])
        elif command == "liveness":
            out = _liveness(payload["ids"])
        else:
            raise SystemExit(f"unknown command {command!r}")
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


pytestmark = pytest.mark.timeout(600)
REPLICAS = 2
POOL_MEMBER = re.compile(r".+\.[0-9a-f]{8}")  # a pool member's id: `<role>.<hex>` (colony.system.pools)


def helper(cluster: chaos.ChaosCluster, command: str, payload: dict[str, Any], timeout: float = 180) -> Any:
    """Run this file as the helper process against the cluster's Ray; its JSON result. A local
    `ray.init()` cluster (Ray >= 2.5x) requires Ray's auth token (~/.ray/auth_token); a process
    joining it by address must say so (`RAY_AUTH_MODE=token`), as a KubeRay operator's client does."""
    info = cluster.info()
    assert info.ray_address, "colony up recorded no Ray address in cluster.json"
    done = subprocess.run(
        [sys.executable, __file__, command, info.ray_address, json.dumps(payload)],
        cwd=cluster.workdir,
        env={**cluster.env, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0 and lines, f"helper {command} failed:\n{output}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """What both Ray clusters of a NewCluster upgrade share: one Redis (its own server, as the
    chart's Redis StatefulSet is, so stopping a cluster leaves it running) and the colony secret."""
    redis = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = redis.start().url
    try:
        yield {"COLONY_REDIS_URL": url, "COLONY_SECRET": "rehearsal-" + "s" * 32}
    finally:
        redis.stop()


START_TIMEOUT = 150  # serve.start_timeout_seconds of the clusters here
# serve.heartbeat_seconds of the clusters here (default 2): the NewCluster takeover waits for the
# old replicas' heartbeats to expire (5 periods), 7.5 s instead of 10 s of the test's wall time
HEARTBEAT_SECONDS = 1.5
OVERLAP_SECONDS = 5.0  # how long both clusters run side by side, sampled for agent moves


def _cluster(workdir: Path, shared: dict[str, str]) -> chaos.ChaosCluster:
    cluster = chaos.ChaosCluster(workdir, replicas=REPLICAS)
    cluster.env.update(
        {
            **shared,
            "COLONY_SERVE__START_TIMEOUT_SECONDS": str(START_TIMEOUT),
            "COLONY_SERVE__HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        }
    )
    return cluster


def _up(cluster: chaos.ChaosCluster) -> None:
    """`colony up`, waited for longer than its own start timeout: a cluster that does not come up
    is then stopped by `up` itself (its daemon, Ray), never left running by a killed `up`."""
    done = cluster.cli("up", timeout=START_TIMEOUT + 60)
    if done.returncode != 0:
        raise RuntimeError(f"colony up failed: {done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, shared: dict[str, str]) -> Iterator[chaos.ChaosCluster]:
    cluster = _cluster(tmp_path_factory.mktemp("upgrade"), shared)
    _up(cluster)
    try:
        yield cluster
    finally:
        cluster.down()


class Successor:
    """The NewCluster upgrade's second cluster, whose `colony up` (the slowest step, ~25 s) the
    in-place test starts in the background once its agents are re-hosted, while it checks its
    runs and doctor: the second cluster then comes up beside a settled first one, as in the
    NewCluster test (where its control plane must leave the first one's agents alone)."""

    def __init__(self, workdir: Path, shared: dict[str, str]) -> None:
        self.cluster = _cluster(workdir, shared)
        self.old_engines: set[str] = set()  # the first cluster's engine replicas, after its upgrade
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="successor-up", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            _up(self.cluster)
        except BaseException as exc:  # handed to the test that waits for the cluster
            self._error = exc

    def get(self) -> chaos.ChaosCluster:
        self.start()
        assert self._thread is not None
        self._thread.join(START_TIMEOUT + 90)
        if self._thread.is_alive():
            raise RuntimeError("the second cluster's colony up did not return")
        if self._error is not None:
            raise self._error
        return self.cluster


@pytest.fixture(scope="module")
def successor(tmp_path_factory: pytest.TempPathFactory, shared: dict[str, str]) -> Iterator[Successor]:
    successor = Successor(tmp_path_factory.mktemp("upgrade-new"), shared)
    try:
        yield successor
    finally:
        if successor._thread is not None:
            successor._thread.join(START_TIMEOUT + 90)
            successor.cluster.down()


def _hosted(client: ColonyClient) -> dict[str, str | None]:
    return {a["agent_id"]: a.get("replica") for a in client.agents()}


def _table(row: dict[str, Any]) -> str:
    head = (
        "| accepted | rejected | in flight | succeeded | failed | lost | stuck | upgrade s "
        "| recovery s | rehosted s |"
    )
    return "\n".join(
        [
            head,
            "|" + "---|" * 10,
            "| {accepted} | {rejected} | {in_flight} | {succeeded} | {failed} | {lost} | {stuck} "
            "| {upgrade_s:.1f} | {recovery_s} | {rehosted_s} |".format(**row),
        ]
    )


def test_an_upgrade_replaces_every_replica_and_loses_no_run(
    cluster: chaos.ChaosCluster, successor: Successor
) -> None:
    wall = time.monotonic()
    info = cluster.info()
    # a page for the extra agent to be bound to: one small file mapped from the folder `up` ran in
    source = cluster.workdir / "src"
    source.mkdir(exist_ok=True)
    (source / "notes.py").write_text('"""Notes kept across the upgrade."""\n\nLIMIT = 3\n')
    with cluster.client(timeout=60) as client:
        mapped = client.map_source(str(source))
        pages = [p["page_id"] for p in mapped.get("pages", [])] or list(mapped.get("page_ids", []))
        assert pages, mapped
        placed = helper(cluster, "place", {"pages": pages})
        assert placed["agent_id"] == EXTRA_AGENT
        before_agents = _hosted(client)
        old_engines = {r["replica_id"] for r in client.replicas()}
    assert {"echo", "ask", EXTRA_AGENT} <= set(before_agents), before_agents
    assert len(old_engines) == REPLICAS

    # runs in flight: a burst (echo and every 6th an `ask`), runs of the extra agent, one `ask`
    # followed over SSE, and a trickle of new submissions while the upgrade goes on
    load = chaos.Load(cluster, ask_every=6)
    load.burst(12)
    with cluster.client() as client:
        for n in range(3):
            load.add(client.submit(EXTRA_AGENT, {"extra": n})["run_id"])
    follower = chaos.StreamFollower(cluster).start(load)
    stop = threading.Event()
    trickle = load.trickle(stop, interval=1.0)
    upgrade_at = time.time()
    config = serve_config("127.0.0.1", int(info.url.rsplit(":", 1)[1]), REPLICAS, UPGRADED_REPLICA_CPUS)
    try:
        upgrade = helper(cluster, "upgrade", {"config": config, "timeout": 150}, timeout=240)
    finally:
        upgraded = time.monotonic()
        recovery = chaos.time_to_first_success(cluster, 45)
        stop.set()
        trickle.join(timeout=30)

    # every replica of every deployment was replaced, and the app runs the new config
    before, after = upgrade["before"], upgrade["after"]
    assert upgrade["status"] == "RUNNING", upgrade
    for deployment in DEPLOYMENTS:
        assert before[deployment] and after[deployment], upgrade
        assert not set(before[deployment]) & set(after[deployment]), (deployment, upgrade)
    assert set(before["EngineReplica"]) == old_engines
    new_engines = set(after["EngineReplica"])

    # the agents keep their ids and are hosted on the new engine replicas (none on an old one)
    def rehosted() -> bool:
        with cluster.client() as client:
            hosted = _hosted(client)
        return set(before_agents) <= set(hosted) and all(
            hosted[a] in new_engines for a in before_agents if before_agents[a] is not None
        )

    rehosted_ok = chaos.wait_until(rehosted, 60, step=0.5)
    rehosted_s = time.monotonic() - upgraded
    with cluster.client() as client:
        after_agents = _hosted(client)
    assert rehosted_ok, f"agents not re-hosted on {new_engines}: {after_agents}"
    successor.old_engines = new_engines
    successor.start()  # the NewCluster test's cluster comes up while the checks below run

    # the control plane's own lookup (ServeReplicas.liveness on this Ray cluster's actor table),
    # asked from the helper process while the runs settle
    seen: dict[str, Any] = {}
    ids = sorted(old_engines | new_engines)
    asking = threading.Thread(target=lambda: seen.update(helper(cluster, "liveness", {"ids": ids})))
    asking.start()

    # every accepted run ends, and succeeds
    result = chaos.FaultResult("upgrade", accepted=len(load.accepted), rejected=load.rejected)
    views = chaos.settle(cluster, list(load.accepted), result, 120, upgrade_at)
    result.stream_problem = follower.problem(views.get(follower.run_id or ""))
    row = {
        "accepted": result.accepted,
        "rejected": result.rejected,
        "in_flight": result.in_flight,
        "succeeded": result.succeeded,
        "failed": result.failed,
        "lost": result.lost,
        "stuck": result.stuck,
        "upgrade_s": upgrade["seconds"],
        "recovery_s": f"{recovery:.1f}" if recovery is not None else "never",
        "rehosted_s": f"{rehosted_s:.1f}",
    }
    print("\n" + _table(row))
    unfinished = {r: s for r, s in result.statuses.items() if s != "succeeded"}
    detail = f"\n{_table(row)}\nnot succeeded: {unfinished}\nreasons: {dict(result.reasons)}"
    assert result.in_flight >= 1, detail  # the upgrade caught runs unfinished
    assert result.lost == 0 and result.failed == 0 and result.stuck == 0, detail
    assert result.succeeded == result.accepted, detail
    assert recovery is not None, detail
    follow = views.get(follower.run_id or "", {})
    assert follow.get("updated_at", 0) >= upgrade_at, f"the followed run ended before the upgrade: {follow}"
    assert result.stream_problem is None, result.stream_problem

    # the old engine replicas are dead, the new ones alive (and the table lists the old ones as
    # DEAD actors): a lookup that found no actors would answer "elsewhere" for the new ones
    asking.join(120)
    assert seen.get("liveness") == {
        **dict.fromkeys(old_engines, "dead"),
        **dict.fromkeys(new_engines, "alive"),
    }, seen
    assert seen.get("table") == {
        **dict.fromkeys(old_engines, "DEAD"),
        **dict.fromkeys(new_engines, "ALIVE"),
    }, seen

    # the invariant checker is clean, with every accepted run named
    run_args = [arg for run_id in load.accepted for arg in ("--run", run_id)]
    doctor: subprocess.CompletedProcess[str] | None = None

    def clean() -> bool:
        nonlocal doctor
        doctor = cluster.cli("doctor", *run_args, timeout=60)
        return doctor.returncode == 0

    assert chaos.wait_until(clean, 30, step=1.0), doctor and (doctor.stdout + doctor.stderr)[-3000:]

    # the daemon `colony up` started still serves: status finds it, a run succeeds on the new app
    status = cluster.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    with cluster.client(timeout=60) as client:
        assert client.run(EXTRA_AGENT, {"after": True})["output"] == {"after": True}
    print(f"wall time of the rehearsal: {time.monotonic() - wall:.1f} s")


def _moves(samples: list[dict[str, str | None]]) -> list[str]:
    """Agents whose replica changed between consecutive samples of the registry."""
    moved = []
    for earlier, later in itertools.pairwise(samples):
        moved += [a for a, r in later.items() if a in earlier and earlier[a] and r and earlier[a] != r]
    return moved


def test_a_new_cluster_takes_over_the_old_ones_agents_and_runs(
    cluster: chaos.ChaosCluster, successor: Successor
) -> None:
    """KubeRay's other upgrade (a change to rayClusterConfig): a whole new Ray cluster with its own
    Serve app starts against the same Redis, traffic switches to it, the old cluster is deleted.
    While both run, neither control plane moves the other's agents (each sees the other's replicas
    only as heartbeats it cannot reach); once the old one is gone (`colony down` on it: daemon, Serve,
    Ray, every process of its session), the new one re-hosts its agents, same ids, and every
    accepted run succeeds."""
    old = cluster
    with old.client() as client:
        # the roles' agents (pool members, `<role>.<hex>`, come and go with the load: the pools'
        # sizing may stop an idle one while both clusters run, and that is no move)
        old_agents = {a: r for a, r in _hosted(client).items() if not POOL_MEMBER.fullmatch(a)}
    # this Ray cluster's engine replicas, from its actor table (the heartbeats in the shared Redis
    # list the second cluster's too, once it is up): as the in-place test found them, or asked
    old_engines = successor.old_engines or set(helper(old, "actors", {})["EngineReplica"])
    assert len(old_engines) == REPLICAS, old_engines
    new = successor.get()  # up already (started by the in-place test), or brought up now
    # both clusters run: sample who hosts what for a while; nothing may move
    samples = []
    overlap_until = time.monotonic() + OVERLAP_SECONDS
    while time.monotonic() < overlap_until:
        with new.client() as client:
            samples.append(_hosted(client))
        time.sleep(0.5)
    with new.client() as client:
        engines = {r["replica_id"] for r in client.replicas()}
    new_engines = engines - old_engines
    assert len(new_engines) == REPLICAS, engines
    moved = _moves(samples)
    assert not moved, f"agents moved between the clusters while both ran: {moved}"
    assert all(samples[-1].get(a) in old_engines for a, r in old_agents.items() if r), samples[-1]

    # runs in flight on the old cluster's agents, submitted to the new API (traffic switched)
    load = chaos.Load(new, ask_every=6)
    load.burst(10)
    with new.client() as client:
        for n in range(2):
            load.add(client.submit(EXTRA_AGENT, {"extra": n})["run_id"])
    follower = chaos.StreamFollower(new).start(load)
    stop = threading.Event()
    trickle = load.trickle(stop, interval=1.0)
    switched_at, started = time.time(), time.monotonic()
    old_info = old.info()
    downs: list[tuple[subprocess.CompletedProcess[str], float]] = []

    def delete_old() -> None:  # the old RayCluster is deleted; Redis is not its own
        down = old.cli("down")
        downs.append((down, time.monotonic() - started))

    deleting = threading.Thread(target=delete_old)
    try:
        deleting.start()  # the new cluster's take-over is watched while `colony down` runs

        def rehosted() -> bool:
            with new.client() as client:
                hosted = _hosted(client)
            return all(hosted.get(a) in new_engines for a, r in old_agents.items() if r)

        rehosted_ok = chaos.wait_until(rehosted, 60, step=0.5)
        rehosted_s = time.monotonic() - started
        deleting.join(120)
    finally:
        stop.set()
        trickle.join(timeout=30)
    assert downs, "colony down of the old cluster did not return"
    down, down_s = downs[0]
    assert down.returncode == 0, down.stderr
    gone = chaos.wait_until(lambda: not cluster_mod._session_members(old_info.pid, old_info.daemon_id), 30)
    assert gone, "colony down left processes of the upgraded cluster running"
    with new.client() as client:
        after_agents = _hosted(client)
    assert rehosted_ok, f"agents not re-hosted on the new cluster {new_engines}: {after_agents}"
    assert set(old_agents) <= set(after_agents)

    result = chaos.FaultResult("new-cluster", accepted=len(load.accepted), rejected=load.rejected)
    views = chaos.settle(new, list(load.accepted), result, 120, switched_at)
    result.stream_problem = follower.problem(views.get(follower.run_id or ""))
    row = {
        "accepted": result.accepted,
        "rejected": result.rejected,
        "in_flight": result.in_flight,
        "succeeded": result.succeeded,
        "failed": result.failed,
        "lost": result.lost,
        "stuck": result.stuck,
        "upgrade_s": down_s,
        "recovery_s": "-",
        "rehosted_s": f"{rehosted_s:.1f}",
    }
    print("\nNewCluster (upgrade s: the old cluster's `colony down`)\n" + _table(row))
    unfinished = {r: s for r, s in result.statuses.items() if s != "succeeded"}
    detail = f"\n{_table(row)}\nnot succeeded: {unfinished}\nreasons: {dict(result.reasons)}"
    assert result.in_flight >= 1, detail
    assert result.lost == 0 and result.failed == 0 and result.stuck == 0, detail
    assert result.stream_problem is None, result.stream_problem
    run_args = [arg for run_id in load.accepted for arg in ("--run", run_id)]
    doctor: subprocess.CompletedProcess[str] | None = None

    def clean() -> bool:
        nonlocal doctor
        doctor = new.cli("doctor", *run_args, timeout=60)
        return doctor.returncode == 0

    assert chaos.wait_until(clean, 30, step=1.0), doctor and (doctor.stdout + doctor.stderr)[-3000:]


if __name__ == "__main__":
    _helper(sys.argv[1:])
    sys.exit(0)
