"""The API keeps its OpenAPI contract (issue 11, item 10): schemathesis's engine (the one its CLI
runs: examples, coverage, fuzzing and stateful phases, every check) against the real app over a
real Redis, with echo/ask agents served by a ReplicaHost. Zero failures, zero errors.

The app runs in this process under uvicorn on a loopback port, in a thread with its own event loop
(the Redis client and the agents live in that loop; schemathesis calls from its own threads).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_kit import ServedApi
from schemathesis.engine import Status, events, from_schema

from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import ask_blueprint, echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageTable

TOKEN = "contract-token"


class AppThread(ServedApi):
    """The API and its agents (echo, ask on a scripted engine), served over HTTP."""

    def __init__(self, redis_url: str, roots: list[Path]) -> None:
        settings = ColonySettings(
            redis_url=redis_url,
            colony_id=f"contract{uuid.uuid4().hex[:8]}",
            vcm={"allowed_roots": [str(r) for r in roots]},
        )
        super().__init__(settings, TOKEN, start_timeout=10)
        self.host: ReplicaHost | None = None
        self._client: Any = None

    async def start_services(self) -> ApiServices:
        settings = self.settings
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, "colony:contract", settings=settings.blackboard)
        self.host = ReplicaHost(settings, "replica-c", engine=ScriptedEngine(["Forty two."]))
        await self.host.start(board)
        await self.host.ensure_agent(echo_blueprint())
        await self.host.ensure_agent(ask_blueprint())
        assert self.host.registry is not None
        return ApiServices(
            runs=RunService(board, self.host.registry, settings=settings),
            registry=self.host.registry,
            token=TOKEN,
            pages=PageTable(board, settings=settings),
            vcm=settings.vcm,
        )

    async def stop_services(self) -> None:
        assert self.host is not None
        await self.host.close()
        await self._client.aclose()


@pytest.fixture
def served(redis_url: str, tmp_path: Path) -> Iterator[AppThread]:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("def a():\n    return 1\n")
    with AppThread(redis_url, [tmp_path]) as served:
        yield served


def describe(event: events.ScenarioFinished) -> list[str]:
    found = []
    for checks in event.recorder.checks.values():
        for check in checks:
            if check.status != Status.SUCCESS and check.failure_info is not None:
                failure = check.failure_info.failure
                found.append(
                    f"[{event.phase.value}] {event.label}: {check.name}: {failure.title} {failure.message}"
                    f"\n{check.failure_info.code_sample}"
                )
            elif check.status == Status.ERROR:
                found.append(f"[{event.phase.value}] {event.label}: {check.name}: error")
    return found


def test_schemathesis_finds_no_contract_failures(served: AppThread) -> None:
    config = schemathesis.Config.from_dict(
        {
            "base-url": served.url,
            "headers": {"Authorization": f"Bearer {TOKEN}"},
            "seed": 11,
            "max-failures": 50,
            "request-timeout": 15,
            "max-stream-events": 50,
            "generation": {"max-examples": 5, "database": "none"},
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": True, "max-steps": 6, "generation": {"max-examples": 4}},
            },
            "operations": [
                {
                    # memory blocks: a schema-valid request the block's state refuses (an undo with
                    # no edit of the agent's left, over the char limit, template fields its schema
                    # rejects) is the documented 422 naming the reason (colony.api.routes.blocks)
                    "include-path-regex": "/blocks",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422", "429"]
                        }
                    },
                },
                {
                    # a session about pages this colony refuses: a well-formed page id that is not
                    # in the page table, more pages than an embedded engine holds, pages leaving
                    # no prompt room: the documented 422 naming `pages` (colony.api.routes.sessions)
                    "include-path": "/v1/sessions",
                    "include-method": "POST",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422", "429"]
                        }
                    },
                },
                {
                    # an agent export document that is schema-valid but that this colony refuses:
                    # a blueprint it cannot trust (no catalog agent of it, a signature of another
                    # secret), another agent's document, one over context.max_export_bytes: the
                    # documented 422 naming the reason (colony.system.transfer)
                    "include-path": "/v1/agents/{agent_id}/import",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422", "429"]
                        }
                    },
                },
                {
                    # a session turn's message over its schema's 1,000,000 characters, written as
                    # JSON escapes, is over api.max_body_bytes (1 MiB) first: the guard's documented
                    # 413 before the body is read, which no schema can say
                    "include-path": "/v1/sessions/{session_id}/turns",
                    "checks": {
                        "negative_data_rejection": {
                            "expected-statuses": [
                                "400",
                                "401",
                                "403",
                                "404",
                                "405",
                                "406",
                                "409",
                                "413",
                                "415",
                                "422",
                                "428",
                                "429",
                                "5xx",
                            ]
                        }
                    },
                },
                {
                    # a well-formed Last-Event-ID past the run's newest event is refused with the
                    # documented 400 (RunService.check_event_id): no schema can say "not in the
                    # future", so for this one operation a 400 counts as an accepted answer too
                    "include-path": "/v1/runs/{run_id}/events",
                    # a stream of a real run lasts until its end (~1 s): fewer, to stay quick
                    "generation": {"max-examples": 2},
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "401", "403", "404", "409", "429"]
                        }
                    },
                },
            ],
            "workers": 1,
        }
    )
    schema = schemathesis.openapi.from_dict(served.app.openapi(), config=config)
    failures: list[str] = []
    errors: list[str] = []
    phases: dict[str, int] = {}
    scenarios = calls = 0
    started = time.monotonic()
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseFinished):
            print(f"phase {event.phase.name.value}: {event.status} at {time.monotonic() - started:.1f} s")
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            if event.status != Status.SKIP:
                phases[event.phase.value] = phases.get(event.phase.value, 0) + 1
            failures.extend(describe(event))
            calls += len(event.recorder.interactions)
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.format()}"[:2000])
        elif isinstance(event, events.FatalError):
            errors.append(f"fatal: {event.exception!r}")
    took = time.monotonic() - started
    print(f"{scenarios} scenarios, {calls} requests; non-skipped per phase: {phases}; {took:.1f} s")
    assert not errors, "\n".join(errors)
    assert not failures, "\n\n".join(failures)
    # every phase ran (stateful needs the links schemathesis infers from run ids)
    assert {"examples", "coverage", "fuzzing", "stateful"} <= set(phases), phases
    assert scenarios >= 40


def test_every_route_that_takes_a_body_documents_the_400_of_a_body_that_is_not_json() -> None:
    """A body that is not JSON (not UTF-8, cut off) is answered 400 before any route's own checks
    (colony.api.errors.http_error): every operation with a request body says so. The stateful
    fuzz found `POST .../checkpoints/{step}/restore` lacking it (a body of b'3\\xff')."""
    from colony.api.app import create_app

    async def unused() -> ApiServices:
        raise AssertionError("the document is built without services")

    spec = create_app(unused, token="t").openapi()
    lacking = [
        f"{method.upper()} {path}"
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation and "400" not in operation.get("responses", {})
    ]
    assert lacking == []
