"""Checkpoints, undo and restore over real HTTP (ColonyClient), through an in-process control plane
over two replica hosts on a real redis-server: the listing, undo of a hosted idle agent (suspended,
rewritten, resumed: its run re-plans from the checkpoint), restore of a suspended one, and the
refusals (running 409, nothing to undo 409, unknown checkpoint or agent 404, bad body 422)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from agent_kit import counter_blueprint
from api_kit import ServedApi
from test_context_checkpoints import STEPS, NotifyCapability

from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.client import ColonyClient
from colony.config import ColonySettings, ContextSettings, ServeSettings
from colony.errors import ApiError
from colony.inference.scripted import ScriptedEngine
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TOKEN = "checkpoint-token"


class ControlledApi(ServedApi):
    """The API with a control plane over two replica hosts (scripted engines), served over HTTP."""

    def __init__(self, redis_url: str) -> None:
        settings = ColonySettings(
            redis_url=redis_url,
            colony_id=f"cpk{uuid.uuid4().hex[:8]}",
            serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
            context=ContextSettings(checkpoints_kept=5),
        )
        super().__init__(settings, TOKEN)
        self.hosts: dict[str, ReplicaHost] = {}
        self.control: ControlPlane | None = None
        self._client: Any = None

    async def start_services(self) -> ApiServices:
        settings = self.settings
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, "colony:checkpoints", settings=settings.blackboard)
        self.hosts = {n: ReplicaHost(settings, n, engine=ScriptedEngine(["ok"])) for n in ("ra", "rb")}
        self.control = ControlPlane(board, self.hosts, settings)
        for host in self.hosts.values():
            host.spawner = self.control.place
            await host.start(board)
        self.control.start()
        ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        return ApiServices(
            runs=RunService(board, self.control.registry, settings=settings, **ids),
            registry=self.control.registry,
            token=TOKEN,
            control=self.control,
            settings=settings,
        )

    async def stop_services(self) -> None:
        if self.control is not None:
            await self.control.close()
        for host in self.hosts.values():
            await host.close()
        await self._client.aclose()

    def hosted(self, agent_id: str) -> Any:
        """The hosted copy of the agent (None when no replica hosts it)."""
        for host in self.hosts.values():
            if host.runtime is not None and agent_id in host.runtime.agent_ids:
                return host.runtime.get(agent_id)
        return None

    def place(
        self, agent_id: str, steps: list[dict[str, Any]], delay: float = 0.0, serve: str | None = None
    ) -> None:
        assert self.control is not None
        blueprint = counter_blueprint(
            agent_id, steps, delay=delay, extra=[NotifyCapability.bind(delay=delay)], serve_namespace=serve
        )
        self.call(lambda: self.control.place(blueprint))

    def run(self, agent_id: str, wait: bool = True) -> Any:
        """Begin a run of the hosted agent (and wait for its end)."""
        agent = self.hosted(agent_id)
        runtime = agent.host
        run = self.call(lambda: runtime.start_run(agent_id, None))
        if wait:
            return self.call(lambda: runtime.wait_for_run(agent_id, run.run_id, timeout=30))
        return run

    def wait_done(self, agent_id: str, timeout: float = 20.0) -> Any:
        """The hosted agent once its current run is done."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            agent = self.hosted(agent_id)
            if agent is not None and agent.current_run is not None and agent.current_run.done:
                return agent
            time.sleep(0.05)
        raise AssertionError(f"the run of {agent_id} did not end in {timeout} s")


@pytest.fixture
def served(redis_url: str) -> Iterator[ControlledApi]:
    with ControlledApi(redis_url) as served:
        yield served


def totals(agent: Any) -> tuple[int, int]:
    return agent.get_capability("CounterCapability").total, agent.get_capability("NotifyCapability").sent


def refused(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_checkpoints_undo_and_restore_over_http(served: ControlledApi) -> None:
    served.place("http-ck", STEPS)
    assert served.run("http-ck").output == "done"
    with ColonyClient(served.url, TOKEN) as client:
        listed = client.context.checkpoints("http-ck")
        assert [c["step"] for c in listed] == [3, 4, 5, 6, 7]
        assert [c["effects"] for c in listed][4] == ["external"] and all(c["size"] > 0 for c in listed)
        assert set(listed[0]) == {
            "step",
            "run_id",
            "request_id",
            "at",
            "lifecycle",
            "run_status",
            "size",
            "calls",
            "effects",
        }

        # undo a hosted idle agent: suspended, rewritten, resumed; step 7 runs again
        report = client.context.undo("http-ck")
        assert (report["step"], report["discarded"], report["kept"]) == (6, [7], [3, 4, 5, 6])
        assert (report["reruns"], report["rerun_when"]) == ([7], "now")  # says step 7 runs again, now
        assert [c["action"] for c in report["not_undone"]] == ["notify"]
        assert report["record"]["agent_id"] == "http-ck"
        assert report["state"] != "suspended" and report["record"]["replica"] in ("ra", "rb")
        agent = served.wait_done("http-ck")
        assert agent.current_run.output == "done" and totals(agent) == (22, 1)
        assert [c["step"] for c in client.context.checkpoints("http-ck")] == [3, 4, 5, 6, 7]

        # a suspended agent is rewritten only, and says what it cannot undo
        client._api.http.post("/v1/agents/http-ck/suspend").raise_for_status()
        report = client.context.restore("http-ck", 5)
        assert (report["step"], report["discarded"], report["state"]) == (5, [6, 7], "suspended")
        (call,) = report["not_undone"]
        assert (call["action"], call["effects"], call["step"]) == ("notify", ["external"], 7)
        assert served.hosted("http-ck") is None
        client._api.http.post("/v1/agents/http-ck/resume").raise_for_status()
        agent = served.wait_done("http-ck")
        assert agent.current_run.output == "done" and totals(agent) == (22, 1)  # 15 + 7, notified again

        # refusals
        missing = refused(lambda: client.context.restore("http-ck", 1))
        assert missing.status == 404 and "kept steps" in str(missing)
        assert refused(lambda: client.context.undo("nobody")).status == 404
        assert refused(lambda: client.context.checkpoints("nobody")).status == 404
        bad = client._api.http.post("/v1/agents/http-ck/checkpoints/5/restore", json={"mode": "rewind"})
        assert bad.status_code == 422 and "mode" in bad.text
        other_run = refused(lambda: client.context.restore("http-ck", 3, run_id="run-elsewhere"))
        assert other_run.status == 404
        report = client.context.restore("http-ck", 3, run_id=listed[0]["run_id"])
        assert report["discarded"] == [4, 5, 6, 7]
        assert served.wait_done("http-ck").current_run.output == "done"


def test_running_agent_and_nothing_to_undo_are_409(served: ControlledApi) -> None:
    served.place("http-busy", [{"action": "add", "parameters": {"amount": 1}}] * 4, delay=0.4)
    with ColonyClient(served.url, TOKEN) as client:
        assert refused(lambda: client.context.undo("http-busy")).status == 409  # no step yet: nothing to undo
        run = served.run("http-busy", wait=False)
        time.sleep(0.6)
        busy = refused(lambda: client.context.undo("http-busy"))
        assert busy.status == 409 and "wait for its run to end or suspend it" in str(busy)
        agent = served.wait_done("http-busy")
        assert agent.current_run.run_id == run.run_id and agent.current_run.output == 4  # untouched
        report = client.context.restore("http-busy", 0, mode="replay")  # the run's beginning
        assert report["discarded"] == [1, 2, 3, 4] and report["mode"] == "replay"
        agent = served.wait_done("http-busy")
        assert agent.current_run.output == 4


def test_checkpoint_request_ids_resolve_to_http_runs(served: ControlledApi) -> None:
    served.place("http-served", STEPS, serve="runs")
    with ColonyClient(served.url, TOKEN) as client:
        submitted = client.submit("http-served", {"go": 1})
        deadline = time.monotonic() + 30
        while client.get(submitted["run_id"])["status"] != "succeeded":
            assert time.monotonic() < deadline, "the HTTP run did not end"
            time.sleep(0.1)
        listed = client.context.checkpoints("http-served")
        assert listed and {c["request_id"] for c in listed} == {submitted["run_id"]}
        assert all(c["run_id"] != submitted["run_id"] for c in listed)  # the agent's own run id
        for c in listed[-1:]:  # the id a checkpoint names is one GET /v1/runs/{id} knows
            assert client.get(c["request_id"])["status"] == "succeeded"
        missing = refused(lambda: client.get(listed[-1]["run_id"]))
        assert missing.status == 404 and "request_id" in str(missing)  # and says which id to use
