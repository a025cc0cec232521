"""Trusted blueprints only: a stored blueprint is unpickled only when its HMAC (colony secret)
verifies; a tampered, unsigned or foreign-key blueprint is refused before unpickling, and an
agent restored from one ends FAILED with the reason instead of running."""

from __future__ import annotations

import base64
import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import cloudpickle
import pytest
from agent_kit import counter_blueprint

from colony import security
from colony.agents import AgentBlueprint, LocalAgentRuntime
from colony.agents.blueprint import SIGNED_PREFIX
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings
from colony.errors import BlueprintTampered, ConfigError
from colony.inference.scripted import ScriptedEngine
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]
KEY_A = security.resolve_secret(ColonySettings(secret="a" * 32))
KEY_B = security.resolve_secret(ColonySettings(secret="b" * 32))


class MakesMarker:
    """An attacker's payload: unpickling it creates `path` (as `os.system(...)` would run a command)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


def attacker_payload(marker: Path) -> bytes:
    return base64.b64encode(cloudpickle.dumps(MakesMarker(marker)))


def forged_texts(marker: Path) -> dict[str, str]:
    """Every way an attacker with Redis write access but without the secret could store a payload."""
    payload = attacker_payload(marker)
    return {
        "unsigned (the pre-signing format)": payload.decode(),
        "no signature": f"{SIGNED_PREFIX}.{payload.decode()}",
        "wrong signature": f"{SIGNED_PREFIX}{'0' * 64}.{payload.decode()}",
        "signed with another secret": f"{SIGNED_PREFIX}{security.sign(payload, KEY_B)}.{payload.decode()}",
        "not text": 12345,  # type: ignore[dict-item]
    }


def test_honest_round_trip_keeps_the_whole_blueprint() -> None:
    blueprint = counter_blueprint("honest", STEPS)
    text = blueprint.to_text(key=KEY_A)
    assert text.startswith(SIGNED_PREFIX)
    back = AgentBlueprint.from_text(text, key=KEY_A)
    assert back.metadata.agent_id == "honest"
    assert back.agent_class is blueprint.agent_class
    assert back.capabilities == blueprint.capabilities
    # the default key (this process's colony secret) works the same way
    assert AgentBlueprint.from_text(blueprint.to_text()).metadata.agent_id == "honest"


def test_a_flipped_byte_in_the_pickle_is_refused() -> None:
    text = counter_blueprint("flip", STEPS).to_text(key=KEY_A)
    signature, payload = text[len(SIGNED_PREFIX) :].split(".", 1)
    raw = bytearray(base64.b64decode(payload))
    raw[len(raw) // 2] ^= 0x01
    tampered = f"{SIGNED_PREFIX}{signature}.{base64.b64encode(bytes(raw)).decode()}"
    with pytest.raises(BlueprintTampered, match="signature does not match the colony secret"):
        AgentBlueprint.from_text(tampered, key=KEY_A)


def test_an_attackers_payload_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for how, text in forged_texts(marker).items():
        with pytest.raises(BlueprintTampered, match="refused") as refused:
            AgentBlueprint.from_text(text, key=KEY_A)
        assert "not unpickled" in str(refused.value), how
        assert not marker.exists(), f"{how}: the payload ran"
    # the payload is live: unpickled, it does create the marker (so the check above means something)
    cloudpickle.loads(base64.b64decode(attacker_payload(marker)))
    assert marker.is_dir()


def test_a_different_secret_is_refused() -> None:
    text = counter_blueprint("foreign", STEPS).to_text(key=KEY_B)
    AgentBlueprint.from_text(text, key=KEY_B)
    with pytest.raises(BlueprintTampered, match="another colony secret"):
        AgentBlueprint.from_text(text, key=KEY_A)


def test_in_kubernetes_the_secret_must_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(ConfigError, match="set COLONY_SECRET from a Secret"):
        security.resolve_secret(ColonySettings(data_dir=tmp_path, secret=None))
    assert not (tmp_path / "secret").exists()
    assert security.resolve_secret(ColonySettings(data_dir=tmp_path, secret="k" * 32))
    mounted = tmp_path / "mounted"  # a Secret mounted as a file
    mounted.write_text("m" * 40 + "\n")
    assert security.resolve_secret(
        ColonySettings(secret=None, secret_file=mounted)
    ) == security.resolve_secret(ColonySettings(secret="m" * 40))


def test_secret_file_is_generated_private_reused_and_per_colony(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # CI may run in a pod
    one = ColonySettings(data_dir=tmp_path / "one", secret=None)
    first = security.resolve_secret(one)
    path = tmp_path / "one" / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert security.resolve_secret(ColonySettings(data_dir=tmp_path / "one", secret=None)) == first
    other = security.resolve_secret(ColonySettings(data_dir=tmp_path / "two", secret=None))
    assert other != first
    text = counter_blueprint("per-colony", STEPS).to_text(key=first)
    with pytest.raises(BlueprintTampered):
        AgentBlueprint.from_text(text, key=other)
    # a configured secret (COLONY_SECRET) wins over the file; a short one is refused
    assert security.resolve_secret(ColonySettings(data_dir=tmp_path / "one", secret="c" * 20)) != first
    with pytest.raises(ConfigError, match="at least 16"):
        security.resolve_secret(ColonySettings(secret="short"))
    assert security.resolve_secret(ColonySettings(data_dir=tmp_path / "one", secret="")) == first  # unset
    path.chmod(0o644)  # loosened by hand: tightened again before use
    assert security.resolve_secret(one) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def _store(board: Blackboard, text: str) -> None:
    await board.write(AgentStateProtocol.key("blueprint"), text, created_by="attacker")


async def test_restore_of_a_tampered_agent_fails_it_with_the_reason(
    runtime: LocalAgentRuntime, tmp_path: Path
) -> None:
    await runtime.spawn(counter_blueprint("victim", STEPS, delay=5.0))
    run = await runtime.start_run("victim", 3)  # in flight when the agent is suspended
    await runtime.suspend("victim")
    board = runtime.agent_board("victim")
    stored = await board.read(AgentStateProtocol.key("blueprint"))
    assert stored.value.startswith(SIGNED_PREFIX)  # what goes to Redis is signed
    marker = tmp_path / "pwned"
    await _store(board, forged_texts(marker)["wrong signature"])
    with pytest.raises(BlueprintTampered):
        await runtime.resume("victim")
    assert not marker.exists()
    assert "victim" not in runtime.agent_ids
    lifecycle = await board.read(AgentStateProtocol.key("lifecycle"))
    assert lifecycle.value["state"] == "failed"
    assert "signature does not match" in lifecycle.value["reason"]
    assert lifecycle.value["previous"] == "suspended"
    stored_run = await board.read(AgentStateProtocol.run_key(run.run_id))
    assert stored_run.value["status"] == "failed" and "refused" in stored_run.value["error"]


async def test_refusal_holds_when_the_other_agent_keys_are_garbage_too(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(counter_blueprint("wrecked", STEPS))
    await runtime.suspend("wrecked")
    board = runtime.agent_board("wrecked")
    await _store(board, "garbage")
    await board.write(AgentStateProtocol.key("current_run"), "no such run", created_by="attacker")
    with pytest.raises(BlueprintTampered, match="no signature"):
        await runtime.resume("wrecked")
    lifecycle = await board.read(AgentStateProtocol.key("lifecycle"))
    assert lifecycle.value["state"] == "failed" and "no signature" in lifecycle.value["reason"]


async def test_an_honest_agent_survives_suspend_and_resume(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(counter_blueprint("honest-agent", STEPS))
    await runtime.get("honest-agent").run(4)
    await runtime.suspend("honest-agent")
    agent = await runtime.resume("honest-agent")
    assert agent.get_capability("CounterCapability").total == 4


@pytest.fixture
async def hosts(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[ReplicaHost, ResumptionMonitor]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"sig{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "ra", engine=ScriptedEngine())
    await host.start(bb)
    monitor = ResumptionMonitor(bb, {"ra": host}, host.registry, period=0.1, colony_id=settings.colony_id)
    yield host, monitor
    await host.close()


async def test_monitor_resumption_of_a_tampered_agent_ends_failed_in_the_registry(
    hosts: tuple[ReplicaHost, ResumptionMonitor], tmp_path: Path
) -> None:
    host, monitor = hosts
    await host.ensure_agent(counter_blueprint("mark", STEPS))
    await host.ensure_agent(counter_blueprint("bystander", STEPS))
    await host.runtime.suspend("mark")  # IMMEDIATE: the next monitor round resumes it
    await host.runtime.suspend("bystander")
    marker = tmp_path / "pwned"
    await _store(host.runtime.agent_board("mark"), forged_texts(marker)["unsigned (the pre-signing format)"])
    assert await monitor.tick() == ["bystander"]  # the refusal does not stop the round
    assert not marker.exists()
    record = await host.registry.get("mark")
    assert record.state == "failed" and record.replica is None
    lifecycle = await host.runtime.agent_board("mark").read(AgentStateProtocol.key("lifecycle"))
    assert lifecycle.value["state"] == "failed" and "no signature" in lifecycle.value["reason"]
    assert await monitor.tick() == []  # not retried
    assert "mark" not in host.runtime.agent_ids
    # placing it again (ensure_agent with an honest blueprint) does not run the stored one either
    with pytest.raises(BlueprintTampered):
        await host.ensure_agent(counter_blueprint("mark", STEPS).to_text())
    assert not marker.exists()
