"""Page affinity end to end: the same page-bound agents and runs through Colony, with the agents'
LLM calls served three ways, side by side in one invocation, each on a fresh `colony up`.

Interface (kept stable):

  python benchmarks/affinity_e2e.py --map DIR --trace FILE.jsonl --json OUT.json
      --variants ray-prefix colony [--replicas 2] [--slots 4] [--seed N]

- `--map DIR`: the folder the agents' pages come from (mapped with `POST /v1/vcm/sources`).
- `--trace FILE.jsonl`: one request a line, `{"at": seconds from start, "agent": id, "page": path
  relative to DIR, "question": text}`; one agent keeps one page; a request is submitted at `at`, or
  when that agent's previous run ended, whichever is later. Without `--trace` the benchmark writes
  one itself (`--workload sessions|zipf|team`, seeded by `--seed`; benchmarks/affinity_traces.py)
  and saves it beside OUT.json.
- OUT.json: `{"variants": {NAME: {"prefill_tokens", "prompt_tokens", "cached_ratio", "ttft_p50_s",
  "ttft_p99_s", "runs", "failed"}}, ...}` (and the settings, the trace, the offline optimum).

Each agent of the trace is a page-bound session (`POST /v1/sessions {"pages": [the page holding
the file]}`, docs/sessions.md), opened at its first request; each request is a turn
(`POST /v1/sessions/{id}/messages`, streamed). So placement by the AgentSystem, the run queue, the
session agents' prompts (the page, then the conversation), suspension to make room and prefetch
are all in the measured path. The variants differ only in where the agents' LLM calls go:

- `colony`: Colony's own engine replicas (the embedded model, `--slots` page slots each): a
  session runs on the replica holding its page and its turn reuses the page's KV cache from the
  page slot; routing and eviction use what Colony knows now (the page table, the agents hosted,
  each page's own request history, runs queued; never a request not yet submitted).
- `ray-prefix`: the agents' replicas call an OpenAI-compatible endpoint served by Ray Serve in the
  same cluster (an ingress, then `--replicas` LLM replicas of the same embedded model with
  automatic prefix caching, `--slots` slots each), the calls routed by Ray's
  `PrefixCacheAffinityRouter`, which reads the prompt of each call as it arrives: what a user who
  picks Ray Serve LLM for the model would run. Its only information is the prompts routed so far.
- `ray-prefix/paged`: the same Ray router in front of Colony's page engine (each call's page
  loaded into a page slot, `--slots` slots): Ray's routing with Colony's page cache.

Measured per variant (the engines' own counts, over the trace only): prompt tokens of every LLM
call, prefill tokens (tokens the engines computed: page loads plus uncached prompt tokens),
cached ratio (1 - prefill / prompt), TTFT p50/p99 (client side, from sending the message to the
first token of the reply: queueing, placement, page faults and prefill included), runs and failed
runs. Printed beside them: the offline optimum, Belady's fewest page loads on the same trace over
one pooled cache of every engine's slots (the whole future known), as a floor.

The engines each get `--threads` threads (1: two engines on 2 cores); replies are at most
`--reply-tokens` tokens (`context.session_reply_tokens`) so prefill, not decoding, dominates.
"""

# no `from __future__ import annotations`: FastAPI reads the ingress's parameter types in the
# replica, where this module's names are not importable (Ray pickles these classes by value)
import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# a local `ray.init()` cluster (what `colony up` starts) requires Ray's auth token
# (~/.ray/auth_token): this process joins it by address for the ray variants and says so, as
# tests/test_upgrade_rehearsal.py's helper does; read when ray is imported
os.environ.setdefault("RAY_AUTH_MODE", "token")

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from affinity_traces import WORKLOADS, TraceLine, generate, read_trace, text_files, write_trace

from colony.blackboard.redis_server import free_port
from colony.config import ColonySettings
from colony.inference import InferenceRequest, Page
from colony.inference.embedded import EmbeddedEngine
from colony.serve import cluster

VARIANTS = ("ray-prefix", "ray-prefix/paged", "colony")
LLM_ROUTE = "/llm"
PAGE_BLOCK = re.compile(r"^<page id=(pg-[0-9a-f]{16})>\n(.*)\n</page>$", re.S)


# -- the LLM app of the ray variants (defined here: Ray pickles it by value into its replicas) ----


@dataclass
class ChatCall:
    """One chat-completions call. Ray's prefix router reads `messages` (the whole prompt)."""

    messages: list[dict[str, Any]]
    body: dict[str, Any]


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16, health_check_period_s=5)
class LlmReplica:
    """The embedded model behind Ray's router: `prefix` mode sends the whole prompt to llama.cpp
    with automatic prefix caching (it picks the slot sharing the longest prefix); `paged` mode
    loads the call's page (the leading `<page id=...>` system block Colony's OpenAI engine sends)
    into a page slot, as Colony's engine replicas do. Counts what it computed into a stats file."""

    def __init__(self, mode: str, slots: int, threads: int, context: int, stats_dir: str) -> None:
        from colony.config import EngineSettings

        self.mode = mode
        settings = EngineSettings(
            page_slots=slots
            if mode == "paged"
            else slots - 1,  # prefix: every llama.cpp slot caches a prompt
            threads=threads,
            slot_context_tokens=context,
        )
        self.engine = EmbeddedEngine(settings, data_dir=tempfile.mkdtemp(prefix="llm-"), prompt_cache_mib=0)
        self.stats_file = Path(stats_dir) / f"llm-{os.getpid()}.json"
        self.pages: dict[str, Page] = {}

    async def _fetch(self, page_id: str) -> Page:
        return self.pages[page_id]

    async def chat(self, call: ChatCall) -> Any:
        try:
            if (
                self.mode == "paged"
                and call.messages
                and (m := PAGE_BLOCK.match(str(call.messages[0].get("content"))))
            ):
                async for chunk in self._paged(call, Page(page_id=m.group(1), text=m.group(2))):
                    yield chunk
            else:
                async for chunk in self._prefix(call):
                    yield chunk
        finally:
            stats = self.engine.stats()
            keep = ("requests", "prompt_tokens", "cached_tokens", "page_loads", "page_load_tokens")
            self.stats_file.write_text(json.dumps({k: getattr(stats, k) for k in keep}))

    async def _prefix(self, call: ChatCall) -> Any:
        body = {**call.body, "id_slot": -1, "cache_prompt": True, "stream_options": {"include_usage": True}}
        async for item in self.engine.raw_stream(body):  # counted in the engine's stats there
            yield item

    async def _paged(self, call: ChatCall, page: Page) -> Any:
        self.pages[page.page_id] = page
        request = InferenceRequest(
            messages=call.messages[1:],
            max_tokens=int(call.body.get("max_tokens") or 64),
            page_ids=[page.page_id],
            temperature=float(call.body.get("temperature", 0.0)),
        )
        async with self.engine.using_pages([page.page_id], self._fetch):
            async for chunk in self.engine.stream(request):
                usage = chunk.usage.model_dump() if chunk.usage else None
                choices = [
                    {"index": 0, "delta": {"content": chunk.text}, "finish_reason": chunk.finish_reason}
                ]
                yield {
                    "choices": choices if (chunk.text or chunk.finish_reason) else [],
                    **(
                        {
                            "usage": {
                                "prompt_tokens": usage["prompt_tokens"],
                                "completion_tokens": usage["completion_tokens"],
                                "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                            }
                        }
                        if usage
                        else {}
                    ),
                }


llm_api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
@serve.ingress(llm_api)
class LlmIngress:
    """`POST /v1/chat/completions` (OpenAI's format, streamed or not) in front of the LLM replicas,
    as Ray Serve LLM's OpenAI ingress stands in front of its LLM servers."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm.options(stream=True)

    @llm_api.post("/v1/chat/completions")
    async def completions(self, request: Request) -> Any:
        body = await request.json()
        chunks = self.llm.chat.remote(ChatCall(messages=body.get("messages") or [], body=body))
        if body.get("stream"):

            async def sse() -> Any:
                async for chunk in chunks:
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        text, usage, finish = [], {}, "stop"
        async for chunk in chunks:
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
        message = {"role": "assistant", "content": "".join(text)}
        return JSONResponse(
            {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
        )


def deploy_llm(args: argparse.Namespace, mode: str, stats_dir: Path, address: str) -> None:
    import ray
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    replicas = LlmReplica.options(
        num_replicas=args.replicas,
        request_router_config=RequestRouterConfig(request_router_class=PrefixCacheAffinityRouter),
    ).bind(mode, args.slots, args.threads, args.context, str(stats_dir))
    serve.run(LlmIngress.bind(replicas), name="colony-bench-llm", route_prefix=LLM_ROUTE)


# -- the driver ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    ttft: list[float] = field(default_factory=list)
    runs: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    # per request: [agent, seconds from the start it was sent, seconds its session took to open
    # (0 after the first), TTFT], for telling queueing from placement from prefill afterwards
    detail: list[list[Any]] = field(default_factory=list)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(url: str, token: str, lines: list[TraceLine], page_of: dict[str, str]) -> Outcome:
    """Submit the trace: each agent's requests in order, each at its `at` or after the agent's
    previous one ended; the agent's session opened at its first request."""
    outcome = Outcome()
    by_agent: dict[str, list[TraceLine]] = {}
    for line in sorted(lines, key=lambda item: item.at):
        by_agent.setdefault(line.agent, []).append(line)
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:

        async def agent(requests: list[TraceLine]) -> None:
            session: str | None = None
            for line in requests:
                await asyncio.sleep(max(0.0, line.at - (time.monotonic() - started)))
                outcome.runs += 1
                try:
                    sent, opening = time.monotonic() - started, 0.0
                    if session is None:
                        opened = await client.post("/v1/sessions", json={"pages": [page_of[line.page]]})
                        opening = time.monotonic() - started - sent
                        opened.raise_for_status()
                        session = opened.json()["session_id"]
                    ttft = await turn(client, session, line.question)
                    outcome.ttft.append(ttft)
                    outcome.detail.append([line.agent, round(sent, 3), round(opening, 3), round(ttft, 3)])
                except Exception as exc:  # counted and reported, the trace goes on
                    outcome.failed += 1
                    outcome.errors.append(f"{line.agent}: {exc!s:.200}")

        await asyncio.gather(*(agent(requests) for requests in by_agent.values()))
    return outcome


async def turn(client: httpx.AsyncClient, session: str, question: str) -> float:
    """One turn; seconds from sending it to the reply's first token (ValueError on an error event)."""
    sent = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", f"/v1/sessions/{session}/messages", json={"message": question}) as reply:
        reply.raise_for_status()
        async for raw in reply.aiter_lines():
            if not raw.startswith("data:"):
                continue
            event = json.loads(raw[5:])
            kind = event.get("event_type")
            if kind == "token" and first is None:
                first = time.perf_counter() - sent
            elif kind == "error":
                raise ValueError(f"turn failed: {event.get('data')}")
            elif kind == "message":
                break
    return first if first is not None else time.perf_counter() - sent


def colony_counts(url: str, token: str) -> dict[str, int]:
    """What Colony's engine replicas computed so far (their heartbeats' engine stats, summed)."""
    replicas = httpx.get(
        f"{url}/v1/replicas", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    return summed([r.get("stats", {}) for r in replicas])


def llm_counts(stats_dir: Path) -> dict[str, int]:
    """What the Ray-served LLM replicas computed so far (each writes its own counts)."""
    return summed([json.loads(p.read_text()) for p in sorted(stats_dir.glob("llm-*.json"))])


COUNTED = ("requests", "prompt_tokens", "cached_tokens", "page_loads", "page_load_tokens")


def summed(engines: list[dict[str, Any]]) -> dict[str, Any]:
    """The engines' counts summed, and each engine's calls (how the load was spread)."""
    totals: dict[str, Any] = {k: sum(int(e.get(k, 0)) for e in engines) for k in COUNTED}
    totals["per_engine"] = tuple(sorted(int(e.get("requests", 0)) for e in engines))
    return totals


def settle(read: Any, wait: float) -> dict[str, int]:
    """Counts once they stop moving (heartbeats carry them every `wait` seconds)."""
    last = read()
    for _ in range(20):
        time.sleep(wait)
        now = read()
        if now == last:
            return now
        last = now
    return last


def map_pages(url: str, token: str, root: Path, page_tokens: int) -> dict[str, str]:
    """Map the folder; each file's page (the first page holding it)."""
    mapped = httpx.post(
        f"{url}/v1/vcm/sources",
        json={"path": str(root), "page_tokens": page_tokens},
        headers={"Authorization": f"Bearer {token}"},
        timeout=300,
    )
    mapped.raise_for_status()
    page_of: dict[str, str] = {}
    for page in mapped.json()["pages"]:
        for span in page["files"]:
            page_of.setdefault(span["path"], page["page_id"])
    return page_of


def run_variant(name: str, args: argparse.Namespace, lines: list[TraceLine], work: Path) -> dict[str, Any]:
    data = work / name.replace("/", "-")
    stats_dir = data / "llm-stats"
    stats_dir.mkdir(parents=True)
    port = free_port()
    engine: dict[str, Any] = {
        "page_slots": args.slots,
        "threads": args.threads,
        "slot_context_tokens": args.context,
    }
    if name != "colony":  # the agents' replicas call the Ray-served endpoint
        engine = {
            "kind": "openai",
            "base_url": f"http://127.0.0.1:{port}{LLM_ROUTE}",
            "model": "smollm2",
            "timeout_seconds": 600,
            "warm_pages": False,  # Ray's router sees each page when a request sends it
        }
    settings = ColonySettings(
        data_dir=data,
        engine=engine,
        serve={"port": port, "num_cpus": 2, "replicas": args.replicas, "heartbeat_seconds": 0.5},
        vcm={"allowed_roots": [str(args.map)]},
        context={"session_reply_tokens": args.reply_tokens},
    )
    print(f"[{name}] colony up ({args.replicas} replicas)", file=sys.stderr, flush=True)
    info = cluster.up(settings, echo=False)
    try:
        if name != "colony":
            deploy_llm(args, "paged" if name.endswith("/paged") else "prefix", stats_dir, info.ray_address)
            read = lambda: llm_counts(stats_dir)  # noqa: E731
        else:
            read = lambda: colony_counts(info.url, info.token)  # noqa: E731
        page_of = map_pages(info.url, info.token, args.map, args.page_tokens)
        missing = sorted({line.page for line in lines} - set(page_of))
        if missing:
            raise SystemExit(f"trace pages not mapped under {args.map}: {missing[:5]}")
        before = settle(read, 0.6)
        started = time.monotonic()
        outcome = asyncio.run(drive(info.url, info.token, lines, page_of))
        wall = time.monotonic() - started
        after = settle(read, 0.6)
    finally:
        import ray

        if ray.is_initialized():  # this driver's connection to the cluster (ray variants)
            ray.shutdown()
        cluster.down(settings)
    spent = {k: after[k] - before[k] for k in COUNTED}
    earlier = list(before["per_engine"]) + [0] * (len(after["per_engine"]) - len(before["per_engine"]))
    per_engine = sorted(a - b for a, b in zip(after["per_engine"], earlier, strict=False))
    prefill = spent["page_load_tokens"] + spent["prompt_tokens"] - spent["cached_tokens"]
    for error in outcome.errors[:5]:
        print(f"[{name}] failed: {error}", file=sys.stderr)
    return {
        "prefill_tokens": prefill,
        "prompt_tokens": spent["prompt_tokens"],
        "cached_ratio": round(1.0 - prefill / max(1, spent["prompt_tokens"]), 4),
        "ttft_p50_s": round(statistics.median(outcome.ttft), 4) if outcome.ttft else None,
        "ttft_p99_s": round(quantile(outcome.ttft, 0.99), 4) if outcome.ttft else None,
        "runs": outcome.runs,
        "failed": outcome.failed,
        "llm_calls": spent["requests"],
        "page_loads": spent["page_loads"],
        "page_load_tokens": spent["page_load_tokens"],
        "calls_per_engine": per_engine,  # how evenly the engines were loaded (sorted)
        "requests_detail": outcome.detail,
        "wall_s": round(wall, 1),
    }


def belady_loads(lines: list[TraceLine], capacity: int) -> int:
    """Fewest page loads on the trace with `capacity` pages cached in one pool, the future known."""
    order = [line.page for line in sorted(lines, key=lambda item: item.at)]
    cache: set[str] = set()
    loads = 0
    for n, page in enumerate(order):
        if page in cache:
            continue
        loads += 1
        if len(cache) >= capacity:
            future = order[n + 1 :]
            cache.remove(max(cache, key=lambda p: future.index(p) if p in future else len(future) + 1))
        cache.add(page)
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--map", type=Path, required=True, help="the folder the pages come from")
    parser.add_argument("--trace", type=Path, help="the trace (JSON lines); generated when left out")
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4, help="page slots (cached prompts) per engine")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workload", choices=WORKLOADS, default="sessions", help="generated trace (no --trace)"
    )
    parser.add_argument("--requests", type=int, default=48, help="generated trace: requests")
    parser.add_argument("--agents", type=int, default=16, help="generated trace: agents (zipf, team)")
    parser.add_argument("--page-tokens", type=int, default=400, help="tokens a page holds at most")
    parser.add_argument("--context", type=int, default=2048, help="tokens of each engine slot")
    parser.add_argument("--reply-tokens", type=int, default=24, help="most tokens a reply takes")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per engine")
    args = parser.parse_args()
    args.map = args.map.resolve()
    if not args.map.is_dir():
        parser.error(f"--map {args.map} is not a folder")
    if args.trace is not None:
        try:
            lines = read_trace(args.trace)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        trace_name = str(args.trace)
    else:
        files = text_files(args.map)
        lines = generate(
            args.workload, args.map, files, seed=args.seed, requests=args.requests, agents=args.agents
        )
        generated = args.json.with_suffix(f".{args.workload}-{args.seed}.trace.jsonl")
        write_trace(generated, lines)
        trace_name = str(generated)
    work = Path(tempfile.mkdtemp(prefix="colony-affinity-e2e-"))
    results: dict[str, Any] = {}
    try:
        for name in args.variants:
            results[name] = run_variant(name, args, lines, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loads = belady_loads(lines, args.replicas * args.slots)
    optimum: dict[str, Any] = {"belady_page_loads": loads, "capacity_pages": args.replicas * args.slots}
    paged = [v for v in results.values() if v["page_loads"]]
    if paged:
        # Belady's loads at the page cost measured, plus the least prefill any page-mode variant
        # spent beside its page loads (new messages, replies, histories that left a slot)
        cost = sum(v["page_load_tokens"] for v in paged) / sum(v["page_loads"] for v in paged)
        rest = min(v["prefill_tokens"] - v["page_load_tokens"] for v in paged)
        optimum["prefill_floor_tokens"] = round(loads * cost + rest)
    out = {
        "variants": results,
        "trace": trace_name,
        "requests": len(lines),
        "agents": len({line.agent for line in lines}),
        "pages": len({line.page for line in lines}),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "offline_optimum": optimum,
    }
    args.json.write_text(json.dumps(out, indent=2))
    report(out)


def report(out: dict[str, Any]) -> None:
    print(f"{out['requests']} requests by {out['agents']} agents over {out['pages']} files ({out['trace']})")
    print(
        "{:<18} {:>9} {:>9} {:>12} {:>12} {:>7} {:>6} {:>6} {:>7}".format(
            "variant",
            "TTFT p50",
            "TTFT p99",
            "prefill tok",
            "prompt tok",
            "cached",
            "loads",
            "failed",
            "wall s",
        )
    )
    variants = out["variants"]
    for name, v in variants.items():
        p50 = f"{v['ttft_p50_s'] * 1000:.0f}ms" if v["ttft_p50_s"] is not None else "-"
        p99 = f"{v['ttft_p99_s'] * 1000:.0f}ms" if v["ttft_p99_s"] is not None else "-"
        print(
            f"{name:<18} {p50:>9} {p99:>9} {v['prefill_tokens']:>12,} {v['prompt_tokens']:>12,} "
            f"{v['cached_ratio']:>7.1%} {v['page_loads']:>6} {v['failed']:>6} {v['wall_s']:>7}"
        )
    optimum = out["offline_optimum"]
    print(
        f"offline optimum: {optimum['belady_page_loads']} page loads (Belady over one pooled cache of "
        f"{optimum['capacity_pages']} pages, the whole future known)"
    )
    ray_v = variants.get("ray-prefix")
    if "prefill_floor_tokens" in optimum and ray_v:
        floor = optimum["prefill_floor_tokens"]
        print(
            f"prefill floor ~{floor:,} tokens (those loads at the measured page cost, plus the least "
            f"other prefill measured): at most {ray_v['prefill_tokens'] / max(1, floor):.2f}x fewer than "
            "ray-prefix is possible on this trace"
        )
    ray_v, mine = variants.get("ray-prefix"), variants.get("colony")
    if ray_v and mine and mine["prefill_tokens"]:
        print(
            f"colony vs ray-prefix: {ray_v['prefill_tokens'] / mine['prefill_tokens']:.2f}x fewer prefill "
            f"tokens (goal >= 1.5x), TTFT p50 {mine['ttft_p50_s']} vs {ray_v['ttft_p50_s']} s (goal lower)"
        )


if __name__ == "__main__":
    main()
