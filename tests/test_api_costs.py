"""What a hostile request may cost the API: checking a run input is linear in its size (a long key
is not copied into every element's path), and request metrics have a fixed set of label values
(an unauthenticated client cannot mint a label per request)."""

from __future__ import annotations

import json
import time
import tracemalloc
import uuid

import httpx
from test_api import AUTH, api  # noqa: F401 - `api` is a fixture

from colony import metrics
from colony.config import ApiSettings
from colony.wire.input_check import check_input


def peak_bytes_of_check(value: object) -> tuple[int, float]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        check_input(value, 32)
        return tracemalloc.get_traced_memory()[1], time.perf_counter() - started
    finally:
        tracemalloc.stop()


def test_checking_an_input_with_a_long_key_is_linear() -> None:
    # 50 kB key over 2,000 items: building every element's path text would take 100 MB
    peak, _ = peak_bytes_of_check({"k" * 50_000: [0] * 2_000})
    assert peak < 5 * 1024 * 1024, peak
    # a body of the largest size the API accepts: a huge key over 200,000 items
    value = {"k" * 440_000: [0] * 200_000}
    assert len(json.dumps({"agent": "echo", "input": value})) <= ApiSettings().max_body_bytes
    peak, seconds = peak_bytes_of_check(value)
    assert peak < 50 * 1024 * 1024 and seconds < 5, (peak, seconds)


def test_an_error_still_names_the_place() -> None:
    value = {"k" * 1_000: [0, {"b": [float("nan")]}]}
    try:
        check_input(value, 32)
    except ValueError as exc:
        message = str(exc)
    else:
        raise AssertionError("NaN passed the check")
    assert message.startswith("input.kkk") and message.split(":")[0].endswith("[1].b[0]"), message
    assert len(message) < 300
    try:
        check_input({"a": [{"\ud800": 1}]}, 32)
    except ValueError as exc:
        assert str(exc).startswith("input.a[0] (a key): a string holds a lone UTF-16 surrogate")
    else:
        raise AssertionError("a lone surrogate passed the check")


def http_label_values() -> tuple[set[str], set[str]]:
    samples = next(iter(metrics.HTTP_REQUESTS.collect())).samples
    return {s.labels["method"] for s in samples}, {s.labels["route"] for s in samples}


async def test_http_metric_labels_come_from_fixed_sets(api) -> None:  # noqa: F811
    client, _ = api
    odd = [f"X{uuid.uuid4().hex[:8].upper()}" for _ in range(20)]
    for method in odd:  # unauthenticated, any method token
        assert (await client.request(method, "/v1/agents")).status_code in (401, 405)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    assert (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).status_code == 404
    assert (await client.request("BREW", f"/v1/runs/{run_id}", headers=AUTH)).status_code == 405
    assert (await client.get(f"/no/such/{run_id}", headers=AUTH)).status_code == 404
    methods, routes = http_label_values()
    assert methods <= metrics.HTTP_METHODS | {"OTHER"} and "OTHER" in methods, methods
    assert not any(m in methods for m in odd)
    assert "/v1/runs/{run_id}" in routes
    assert not any(run_id in route for route in routes), routes
    text = (await client.get("/metrics", headers=AUTH)).text
    assert 'method="OTHER"' in text and "BREW" not in text
    assert isinstance(client, httpx.AsyncClient)
