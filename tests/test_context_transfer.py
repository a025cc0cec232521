"""Agent export and import (colony.system.transfer, docs/transfer.md): an agent paused between the
steps of a scripted run, exported, imported into another Redis and resumed there finishes with the
same output as an uninterrupted run; a document's code is never trusted; ids, states and bounds are
checked. Real redis-servers (two), real ReplicaHosts and the resumption monitor; the HTTP routes
and the client over a served API."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import counter_blueprint
from api_kit import ServedApi

from colony import security
from colony.agents import AgentBlueprint, AgentRun
from colony.api.app import ApiServices
from colony.blackboard import Blackboard, BlackboardScope, create_redis, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.blackboard.redis_server import EmbeddedRedis
from colony.client import ColonyClient
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    ApiError,
    ContextError,
    ImportRejected,
    InvalidArgument,
)
from colony.inference.scripted import ScriptedEngine
from colony.memory.blocks import BlockType, NewBlock, block_store
from colony.memory.capability import register_scope
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import NewMemory
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService
from colony.system.transfer import export_agent, import_agent, json_bytes

AMOUNTS = (1, 2, 3, 4, 5)
STEPS = [{"action": "add", "parameters": {"amount": n}} for n in AMOUNTS]
DELAY = 0.4  # each step sleeps this long before it adds: the suspension lands in that sleep
TOKEN = "transfer-token"


def stepper(agent_id: str) -> AgentBlueprint:
    """The catalog factory of the target colony (`agents: {stepper: test_context_transfer:stepper}`)."""
    return counter_blueprint(agent_id, STEPS, delay=DELAY)


def settings_for(redis_url: str, name: str, **extra: Any) -> ColonySettings:
    return ColonySettings(redis_url=redis_url, colony_id=f"{name}{uuid.uuid4().hex[:8]}", **extra)


class Colony:
    """One colony on one Redis: a replica host and the resumption monitor."""

    def __init__(self, settings: ColonySettings, board: Blackboard, host: ReplicaHost) -> None:
        self.settings, self.board, self.host = settings, board, host
        assert host.registry is not None and host.runtime is not None
        self.registry, self.runtime = host.registry, host.runtime
        self.monitor = ResumptionMonitor(
            board, {host.replica_id: host}, host.registry, period=0.1, colony_id=settings.colony_id
        )

    def agent_board(self, agent_id: str) -> Blackboard:
        return self.runtime.agent_board(agent_id)


async def open_colony(redis_url: str, name: str, **extra: Any) -> tuple[Colony, Any]:
    settings = settings_for(redis_url, name, **extra)
    client = create_redis(redis_url, settings.blackboard)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}", settings=settings.blackboard)
    host = ReplicaHost(settings, f"r{name}", engine=ScriptedEngine())
    await host.start(board)
    return Colony(settings, board, host), client


@pytest.fixture
async def colonies(redis_url: str, private_redis: EmbeddedRedis) -> AsyncIterator[tuple[Colony, Colony]]:
    """A source colony on the session's redis-server, a target colony on a second redis-server
    (`agents: stepper` in its catalog)."""
    target_url = private_redis.start().url
    source, source_client = await open_colony(redis_url, "src")
    target, target_client = await open_colony(
        target_url, "dst", agents={"stepper": "test_context_transfer:stepper"}
    )
    yield source, target
    for colony, client in ((source, source_client), (target, target_client)):
        await colony.host.close()
        await client.aclose()


async def state_of(colony: Colony, agent_id: str) -> str:
    entry = await colony.agent_board(agent_id).read(Keys.key("lifecycle"))
    return str(entry.value["state"]) if entry is not None else ""


async def until_state(colony: Colony, agent_id: str, state: str) -> None:
    async with asyncio.timeout(10):
        while await state_of(colony, agent_id) != state:  # noqa: ASYNC110 (state lives in Redis)
            await asyncio.sleep(0.02)


async def run_of(colony: Colony, agent_id: str) -> AgentRun:
    entry = await colony.agent_board(agent_id).read(Keys.key("current_run"))
    assert entry is not None
    run = await colony.agent_board(agent_id).read(Keys.run_key(entry.value))
    assert run is not None
    return AgentRun.model_validate(run.value)


async def paused_mid_run(colony: Colony, agent_id: str, after_steps: int = 2) -> AgentRun:
    """Start the scripted run and suspend the agent once `after_steps` steps are persisted (the
    next step is then in its sleep, before it adds anything)."""
    await colony.host.ensure_agent(stepper(agent_id))
    await colony.runtime.start_run(agent_id, None)
    async with asyncio.timeout(30):
        while (await run_of(colony, agent_id)).steps < after_steps:  # noqa: ASYNC110 (in Redis)
            await asyncio.sleep(0.02)
    await colony.runtime.suspend(agent_id)
    run = await run_of(colony, agent_id)
    assert run.steps == after_steps and not run.done
    lifecycle = await colony.agent_board(agent_id).read(Keys.key("lifecycle"))
    assert lifecycle is not None and lifecycle.value["state"] == "suspended"
    return run


async def resumed_output(colony: Colony, agent_id: str, run_id: str) -> AgentRun:
    assert await colony.monitor.tick() == [agent_id]  # IMMEDIATE: the first round resumes it
    assert agent_id in colony.runtime.agent_ids
    return await colony.runtime.wait_for_run(agent_id, run_id, timeout=60)


async def test_paused_agent_moves_to_another_redis_and_finishes_like_an_uninterrupted_run(
    colonies: tuple[Colony, Colony],
) -> None:
    source, target = colonies
    await source.host.ensure_agent(stepper("reference"))
    reference = await source.runtime.get("reference").run(None)  # uninterrupted
    assert reference.status == "succeeded" and reference.output == sum(AMOUNTS)

    paused = await paused_mid_run(source, "mover")
    document = json.loads(json_bytes(await export_agent(source.board, "mover", settings=source.settings)))
    assert document["state"] == "suspended" and document["current_run"]["steps"] == 2
    assert document["capabilities"]["CounterCapability"]["state"] == {"total": 3}
    assert document["blueprint"]["catalog"] is None  # "mover" is no catalog agent of the source

    imported = await import_agent(
        target.board, document, settings=target.settings, registry=target.registry, catalog="stepper"
    )
    assert imported["state"] == "suspended" and imported["blueprint"] == "catalog:stepper"
    assert (imported["run_id"], imported["step"]) == (paused.run_id, 2)
    record = await target.registry.get("mover")
    assert record is not None and record.state == "suspended"

    finished = await resumed_output(target, "mover", paused.run_id)
    assert finished.status == "succeeded"
    assert finished.output == reference.output  # the same output as the uninterrupted run
    assert finished.steps == reference.steps
    # each step ran once: a step redone (or skipped) would change the total
    assert target.runtime.get("mover").get_capability("CounterCapability").total == sum(AMOUNTS)
    # the source still holds its own copy, suspended at step 2 (an export moves nothing)
    assert (await run_of(source, "mover")).steps == 2


# a checkpoint as a step writes one (the import refuses ring items that are not checkpoints)
CP_MARK = {
    "step": 1,
    "run_id": "r",
    "run": {"agent_id": "travel", "run_id": "r"},
    "lifecycle": "idle",
    "at": 1.0,
}
# a record as the action log writes one (the import refuses ring items that are not records)
LOG_MARK = {"run_id": "r", "step": 1, "kind": "action", "n": 0, "status": "started", "action": "mark"}


async def test_blocks_memory_and_context_state_travel(colonies: tuple[Colony, Colony]) -> None:
    source, target = colonies
    await paused_mid_run(source, "keeper", after_steps=1)
    blocks = block_store(source.board.redis, source.settings)
    await blocks.create("keeper", NewBlock(label="notes", content="the sky is green here"))
    await blocks.create("keeper", NewBlock(label="journal", block_type=BlockType.LOG))
    await blocks.log_append("keeper", "journal", {"event": "started"})
    scope = MemoryScope.agent_working("keeper", colony_id=source.settings.colony_id)
    memory = MemoryStore(source.board, source.settings)
    await memory.write(scope, NewMemory(content="the password is swordfish", tags=frozenset({"secret"})))
    await register_scope(source.agent_board("keeper"), scope)
    # checkpoint ring and action log as their parts keep them (a ring each), archived outputs
    async with source.agent_board("keeper").transaction() as tx:
        tx.ring_push(Keys.key("checkpoints"), [CP_MARK], 10)
        tx.ring_push(Keys.key("action_log"), [LOG_MARK], 100)
        tx.write(Keys.archived_output_key("ab" * 32), {"output": "big"})

    document = await export_agent(source.board, "keeper", settings=source.settings)
    assert [b["label"] for b in document["blocks"]] == ["journal", "notes"]
    # (other parts of colony.context may have stored their own items in these rings: all travel)
    stored = {
        name: await source.agent_board("keeper").ring(Keys.key(name))
        for name in ("checkpoints", "action_log")
    }
    assert stored["checkpoints"][-1] == CP_MARK
    assert stored["action_log"][-1] == LOG_MARK
    assert document["parts"]["checkpoints"]["ring"] == stored["checkpoints"]
    # signed by the source's secret, which the target shares here: accepted without a catalog name
    imported = await import_agent(target.board, document, settings=target.settings, registry=target.registry)
    assert imported["blueprint"] == "signed" and imported["memory_entries"] == 1

    board = target.agent_board("keeper")
    assert await board.ring(Keys.key("checkpoints")) == stored["checkpoints"]
    assert await board.ring(Keys.key("action_log")) == stored["action_log"]
    assert (await board.read(Keys.archived_output_key("ab" * 32))).value == {"output": "big"}
    source_context = await source.agent_board("keeper").ring(Keys.key("context"))
    assert await board.ring(Keys.key("context")) == source_context
    metadata = (await board.read(Keys.key("metadata"))).value
    assert metadata["colony_id"] == target.settings.colony_id  # re-rooted in the target colony
    target_blocks = block_store(board.redis, target.settings)
    notes = (await target_blocks.read("keeper", "notes")).content
    assert notes == (await blocks.read("keeper", "notes")).content and "the sky is green here" in notes
    journal = await target_blocks.read("keeper", "journal")
    assert [e["event"] for e in journal.entries or []] == ["started"]
    target_scope = MemoryScope.agent_working("keeper", colony_id=target.settings.colony_id)
    entries = await MemoryStore(target.board, target.settings).entries(target_scope)
    assert [(e.content, set(e.tags)) for e in entries] == [("the password is swordfish", {"secret"})]
    # and it resumes and finishes its run (the rest of the script) on the target
    finished = await resumed_output(target, "keeper", imported["run_id"])
    assert finished.output == sum(AMOUNTS)


class Marker:
    """What a hostile document's blueprint would unpickle to: it writes a file if it ever runs."""

    path = ""

    def __reduce__(self) -> Any:
        return (Path(self.path).write_text, ("code from the document ran",))


async def test_a_document_never_brings_code_the_target_does_not_trust(
    colonies: tuple[Colony, Colony], tmp_path: Path
) -> None:
    source, target = colonies
    await paused_mid_run(source, "intruder", after_steps=1)
    document = await export_agent(source.board, "intruder", settings=source.settings)
    marker = tmp_path / "ran"
    Marker.path = str(marker)
    payload = base64.b64encode(pickle.dumps(Marker()))
    other_key = b"another colony's secret, not this one".ljust(32, b"!")
    forged = f"cbp1.{security.sign(payload, other_key)}.{payload.decode()}"
    tampered = document["blueprint"]["signed"][:-8] + "AAAAAAA="
    for signed in (forged, tampered, "a pickle without a signature"):
        hostile = {**document, "blueprint": {"catalog": None, "signed": signed}}
        with pytest.raises(ImportRejected, match="cannot be trusted here"):
            await import_agent(target.board, hostile, settings=target.settings, registry=target.registry)
    assert not marker.exists()
    # nothing was written for the refused agent: no state, no registry record
    assert await target.agent_board("intruder").read(Keys.key("lifecycle")) is None
    assert await target.registry.get("intruder") is None
    # a catalog name the target does not have is refused too, with what to do
    with pytest.raises(ImportRejected, match="not a catalog agent of this colony"):
        await import_agent(
            target.board, document, settings=target.settings, registry=target.registry, catalog="nosuch"
        )


async def test_export_refuses_a_running_agent_and_import_a_live_id(colonies: tuple[Colony, Colony]) -> None:
    source, target = colonies
    with pytest.raises(AgentNotFound):
        await export_agent(source.board, "ghost", settings=source.settings)
    await source.host.ensure_agent(stepper("busy"))
    await source.runtime.start_run("busy", None)
    await until_state(source, "busy", "running")
    with pytest.raises(AgentStateConflict, match="suspend it"):
        await export_agent(source.board, "busy", settings=source.settings)
    await source.runtime.wait_for_run("busy", (await run_of(source, "busy")).run_id, timeout=30)
    await until_state(source, "busy", "idle")  # the run is stored done just before the agent turns idle
    document = await export_agent(source.board, "busy", settings=source.settings)  # idle now: fine
    assert document["state"] == "idle"

    def imported() -> Any:
        return import_agent(target.board, document, settings=target.settings, registry=target.registry)

    # an id the registry places on a replica, even with no state here, is live too
    phantom = {
        **document,
        "agent_id": "phantom",
        "metadata": {**document["metadata"], "agent_id": "phantom"},
        "current_run": {**document["current_run"], "agent_id": "phantom"},
    }
    await target.registry.put(AgentRecord(agent_id="phantom", state="idle", replica="rdst"))
    with pytest.raises(AgentStateConflict, match="phantom is live in this colony"):
        await import_agent(
            target.board, phantom, settings=target.settings, registry=target.registry, catalog="stepper"
        )
    # (busy's signed blueprint does not make an agent "phantom": a signed blueprint is its own agent's)
    with pytest.raises(ImportRejected, match="signed blueprint is agent busy's, not phantom's"):
        await import_agent(target.board, phantom, settings=target.settings, registry=target.registry)

    await imported()
    with pytest.raises(AgentStateConflict, match="replace=true"):
        await imported()  # suspended here: only with replace
    await target.monitor.tick()  # resumed: hosted (idle) on the target's replica
    assert "busy" in target.runtime.agent_ids
    with pytest.raises(AgentStateConflict, match="never overwritten while a replica hosts it"):
        await import_agent(
            target.board, document, settings=target.settings, registry=target.registry, replace=True
        )
    await target.runtime.suspend("busy")
    again = await import_agent(
        target.board, document, settings=target.settings, registry=target.registry, replace=True
    )
    assert again["replaced"] is True


async def test_malformed_and_oversized_documents_are_refused(colonies: tuple[Colony, Colony]) -> None:
    source, target = colonies
    await paused_mid_run(source, "shape", after_steps=1)
    document = await export_agent(source.board, "shape", settings=source.settings)

    async def refused(doc: Any, match: str, settings: ColonySettings | None = None) -> None:
        with pytest.raises(ImportRejected, match=match):
            await import_agent(
                target.board, doc, settings=settings or target.settings, registry=target.registry
            )

    await refused([1, 2], "JSON object")
    await refused({**document, "format": "something-else"}, "not a colony-agent-export version 1")
    await refused({**document, "agent_id": "../../etc"}, "agent_id")
    await refused({**document, "capabilities": {"a:b": {"state": {}}}}, "capabilities")
    await refused(
        {**document, "metadata": {**document["metadata"], "agent_id": "other"}}, "metadata.agent_id"
    )
    await refused({**document, "policy_state": {"x": float("nan")}}, "NaN")
    forged_log = {"action_log": {"ring": [{"run_id": "r", "step": 1, "kind": "exec", "result": {}}]}}
    await refused({**document, "parts": forged_log}, r"parts\.action_log\.ring\[0\]")
    forged_checkpoint = {
        "checkpoints": {"ring": [{"step": 1, "run_id": "r", "run": {}, "lifecycle": "idle", "at": 0}]}
    }
    await refused({**document, "parts": forged_checkpoint}, r"parts\.checkpoints\.ring\[0\]")
    deep: Any = 0
    for _ in range(200):
        deep = [deep]
    await refused({**document, "policy_state": {"deep": deep}}, "nested deeper")
    small = target.settings.model_copy(
        update={"context": target.settings.context.model_copy(update={"max_export_bytes": 1024})}
    )
    await refused(document, "over context.max_export_bytes", small)
    small_source = source.settings.model_copy(update={"context": small.context})
    with pytest.raises(ContextError, match=r"over 1024 bytes \(context\.max_export_bytes\)"):
        await export_agent(source.board, "shape", settings=small_source)
    assert await target.registry.get("shape") is None


class TransferApi(ServedApi):
    """The API over one colony's Redis (its registry in the colony scope, as the control plane's)."""

    async def start_services(self) -> ApiServices:
        settings = self.settings
        assert settings.redis_url
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, "bootstrap", settings=settings.blackboard)
        colony = board.scoped(scope_id(BlackboardScope.COLONY, colony_id=settings.colony_id))
        registry = AgentRegistry(colony, settings=settings)
        return ApiServices(
            runs=RunService(board, registry, settings=settings, colony_id=settings.colony_id),
            registry=registry,
            token=self.token,
            settings=settings,
        )

    async def stop_services(self) -> None:
        await self._client.aclose()


async def test_http_export_import_and_resume(colonies: tuple[Colony, Colony]) -> None:
    source, target = colonies
    paused = await paused_mid_run(source, "wanderer")
    with (
        TransferApi(source.settings, TOKEN) as source_api,
        TransferApi(target.settings, TOKEN) as target_api,
        ColonyClient(source_api.url, TOKEN) as from_client,
        ColonyClient(target_api.url, TOKEN) as to_client,
    ):
        document = await asyncio.to_thread(from_client.transfer.export_agent, "wanderer")
        assert document["agent_id"] == "wanderer" and document["current_run"]["steps"] == 2
        for call, status in (
            (lambda: from_client.transfer.export_agent("nobody"), 404),
            (lambda: from_client.transfer.export_agent("bad:id"), 422),
            (lambda: to_client.transfer.import_agent({"format": "nope", "agent_id": "wanderer"}), 422),
            (lambda: to_client.transfer.import_agent({**document, "agent_id": "other"}), 422),
            (lambda: to_client.transfer.import_agent(document, catalog="nosuch"), 422),
        ):
            with pytest.raises(ApiError) as caught:
                await asyncio.to_thread(call)
            assert caught.value.status == status
        # a document posted to another agent's path is refused: an agent keeps its id
        response = await asyncio.to_thread(to_client._api.http.post, "/v1/agents/other/import", json=document)
        assert response.status_code == 422 and "not other's" in response.json()["error"]["message"]
        with pytest.raises(InvalidArgument, match="no agent_id"):
            to_client.transfer.import_agent({"format": "colony-agent-export"})
        imported = await asyncio.to_thread(to_client.transfer.import_agent, document, catalog="stepper")
        assert imported["state"] == "suspended" and imported["step"] == 2
        with pytest.raises(ApiError) as caught:
            await asyncio.to_thread(to_client.transfer.import_agent, document, catalog="stepper")
        assert caught.value.status == 409
    finished = await resumed_output(target, "wanderer", paused.run_id)
    assert finished.status == "succeeded" and finished.output == sum(AMOUNTS)


async def live_view(colony: Colony, agent_id: str) -> dict[str, Any]:
    """What an import must never touch when it is refused: the agent's rings (checkpoints, action
    log, context), its stored state entries, its block and its memory."""
    board = colony.agent_board(agent_id)
    names = ("blueprint", "metadata", "current_run", "policy_state")
    entries = await board.read_many([Keys.key(n) for n in names])
    scope = MemoryScope.agent_working(agent_id, colony_id=colony.settings.colony_id)
    memory = await MemoryStore(colony.board, colony.settings).entries(scope)
    notes = await block_store(board.redis, colony.settings).read(agent_id, "notes")
    return {
        **{n: await board.ring(Keys.key(n)) for n in ("checkpoints", "action_log", "context")},
        **{n: (e.value if e is not None else None) for n, e in zip(names, entries, strict=True)},
        "notes": notes.content,
        "memory": sorted(e.content for e in memory),
    }


async def suspended_with_state(colony: Colony, agent_id: str) -> dict[str, Any]:
    """An agent of `colony` that ran a three-step run, with a block and a memory entry, suspended
    (IMMEDIATE: the monitor's next round resumes it); and its export, whose block and memory say
    something else (an older or foreign copy of the same id)."""
    await colony.host.ensure_agent(counter_blueprint(agent_id, STEPS[:3]))
    run = await colony.runtime.start_run(agent_id, None)
    await colony.runtime.wait_for_run(agent_id, run.run_id, timeout=30)
    board = colony.agent_board(agent_id)
    await block_store(board.redis, colony.settings).create(
        agent_id, NewBlock(label="notes", content="LIVE block content", char_limit=1000)
    )
    scope = MemoryScope.agent_working(agent_id, colony_id=colony.settings.colony_id)
    await MemoryStore(colony.board, colony.settings).write(scope, NewMemory(content="live memory"))
    await register_scope(board, scope)
    assert await colony.host.suspend_agent(agent_id, "test", {"kind": "immediate"})
    record = await colony.registry.get(agent_id)
    assert record is not None and record.state == "suspended"
    document = await export_agent(colony.board, agent_id, settings=colony.settings)
    for block in document["blocks"]:
        block["content"] = "DOCUMENT block content"
    for scope_doc in document["memory"]:
        for entry in scope_doc["entries"]:
            entry.update(content="document memory", entry_id="doc-entry")
    return document


async def test_a_replace_refused_because_the_agent_resumed_leaves_it_as_it_was(
    colonies: tuple[Colony, Colony], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor resumes the suspended agent after the import checked it was free and before its
    state commit: the import is refused (409) and the live agent keeps its checkpoints, action log,
    context, state, block and memory exactly as they were (nothing is written before the fence)."""
    _, target = colonies
    document = await suspended_with_state(target, "victim")
    before = await live_view(target, "victim")
    assert before["checkpoints"] and before["action_log"] and before["notes"].strip() == "LIVE block content"
    assert before["memory"] == ["live memory"]

    from colony.system import transfer

    check_free = transfer._check_free
    resumed: list[str] = []

    async def then_resumed(*args: Any, **kwargs: Any) -> None:
        await check_free(*args, **kwargs)
        resumed.extend(await target.monitor.tick())  # the monitor's round lands in the window

    monkeypatch.setattr(transfer, "_check_free", then_resumed)
    with pytest.raises(AgentStateConflict, match="during the import"):
        await import_agent(
            target.board, document, settings=target.settings, registry=target.registry, replace=True
        )
    assert resumed == ["victim"] and "victim" in target.runtime.agent_ids
    assert await live_view(target, "victim") == before
    assert await state_of(target, "victim") == "idle"  # resumed, with its run done: idle, not suspended


async def test_an_imported_agent_cannot_be_resumed_before_its_blocks_and_memory_are_written(
    colonies: tuple[Colony, Colony], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the import's state commit is in, the agent has no blueprint and no resumption condition
    until its blocks and memory are written: neither the monitor nor an explicit resume can host it
    in that window. Then it resumes with the document's blocks and memory."""
    _, target = colonies
    document = await suspended_with_state(target, "mover")

    from colony.system import transfer

    import_blocks = transfer._import_blocks
    attempts: list[Any] = []

    async def resumed_meanwhile(*args: Any, **kwargs: Any) -> None:
        attempts.append(await target.monitor.tick())  # the monitor finds nothing to resume
        with pytest.raises(AgentNotFound, match="no restorable agent"):
            await target.host.resume_agent("mover")  # an explicit resume cannot restore it
        attempts.append("refused")
        await import_blocks(*args, **kwargs)

    monkeypatch.setattr(transfer, "_import_blocks", resumed_meanwhile)
    imported = await import_agent(
        target.board, document, settings=target.settings, registry=target.registry, replace=True
    )
    assert attempts == [[], "refused"] and imported["replaced"] is True
    assert "mover" not in target.runtime.agent_ids
    assert await target.monitor.tick() == ["mover"]  # IMMEDIATE, once the import is done
    view = await live_view(target, "mover")
    assert view["notes"].strip() == "DOCUMENT block content"
    assert "document memory" in view["memory"]
    assert view["checkpoints"] == document["parts"]["checkpoints"]["ring"]


async def test_who_an_imported_agent_is_comes_from_its_trusted_blueprint(
    colonies: tuple[Colony, Colony],
) -> None:
    """A document cannot make its agent a session agent, a service, a child of another agent or a
    higher priority: role, type and priority are the trusted blueprint's (catalog factory or a
    verified signed blueprint), and the parent is dropped."""
    source, target = colonies
    await paused_mid_run(source, "poser", after_steps=1)
    document = await export_agent(source.board, "poser", settings=source.settings)
    claims = {"role": "session", "agent_type": "service", "parent_id": "boss", "priority": 99}
    document["metadata"] = {**document["metadata"], **claims}
    twin = json.loads(json.dumps(document).replace('"poser"', '"twin"'))
    twin["blueprint"] = {"catalog": None, "signed": None}
    for doc, catalog in ((document, None), (twin, "stepper")):  # a signed blueprint; the catalog's
        agent_id = doc["agent_id"]
        imported = await import_agent(
            target.board, doc, settings=target.settings, registry=target.registry, catalog=catalog
        )
        assert imported["blueprint"] == ("signed" if catalog is None else "catalog:stepper")
        record = await target.registry.get(agent_id)
        assert record is not None and (record.role, record.agent_type) == ("counter", "unbound")
        stored = (await target.agent_board(agent_id).read(Keys.key("metadata"))).value
        assert (stored["role"], stored["agent_type"], stored["parent_id"], stored["priority"]) == (
            "counter",
            "unbound",
            None,
            0,
        )
    resumed = await target.monitor.tick()
    assert sorted(resumed) == ["poser", "twin"]
    for agent_id in resumed:
        hosted = target.runtime.get(agent_id).metadata
        assert (hosted.role, hosted.parent_id) == ("counter", None)
    # nor pick a catalog kind for itself: its catalog name counts only when it is its own id
    chooser = json.loads(json.dumps(document).replace('"poser"', '"chooser"'))
    chooser["blueprint"] = {"catalog": "session", "signed": None}
    with pytest.raises(ImportRejected, match="cannot be trusted here"):
        await import_agent(target.board, chooser, settings=target.settings, registry=target.registry)
    assert await target.registry.get("chooser") is None


async def test_an_import_of_an_id_another_import_is_writing_is_refused(
    colonies: tuple[Colony, Colony], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two imports of one id with replace=true, the second entirely inside the first's window
    (between its two commits): the second is refused, 409, while the first's mark (within its
    lease) is on the lifecycle, so the documents never mix; the first lands and resumes."""
    _, target = colonies
    document = await suspended_with_state(target, "contested")

    from colony.system import transfer

    import_blocks = transfer._import_blocks
    overtaken: list[Exception] = []

    async def another_import(*args: Any, **kwargs: Any) -> None:
        if not overtaken:
            try:
                await import_agent(
                    target.board, document, settings=target.settings, registry=target.registry, replace=True
                )
            except AgentStateConflict as exc:
                overtaken.append(exc)
            else:
                overtaken.append(AssertionError("the second import was let in"))
        await import_blocks(*args, **kwargs)

    monkeypatch.setattr(transfer, "_import_blocks", another_import)
    imported = await import_agent(
        target.board, document, settings=target.settings, registry=target.registry, replace=True
    )
    assert isinstance(overtaken[0], AgentStateConflict) and "being imported" in str(overtaken[0])
    assert imported["replaced"] is True
    assert await target.monitor.tick() == ["contested"]
    assert (await live_view(target, "contested"))["notes"].strip() == "DOCUMENT block content"


async def test_the_profile_is_left_out_of_exports_and_recorded_again_where_the_agent_lands(
    colonies: tuple[Colony, Colony],
) -> None:
    """An export carries no profile (a reader of format version 1 knows no such field); the
    imported agent records its own when it is hosted (the console's agent view shows it)."""
    source, target = colonies
    paused = await paused_mid_run(source, "profiled")
    held = (await source.agent_board("profiled").read(Keys.key("metadata"))).value
    assert held["profile"]["agent_class"] and held["profile"]["actions"]
    document = await export_agent(source.board, "profiled", settings=source.settings)
    assert "profile" not in document["metadata"]
    await import_agent(
        target.board, document, settings=target.settings, registry=target.registry, catalog="stepper"
    )
    assert (await target.agent_board("profiled").read(Keys.key("metadata"))).value["profile"] is None
    assert (await resumed_output(target, "profiled", paused.run_id)).status == "succeeded"
    landed = (await target.agent_board("profiled").read(Keys.key("metadata"))).value
    assert landed["profile"] == held["profile"]
