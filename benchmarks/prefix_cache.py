"""Cold vs warm time-to-first-token for page-prefixed requests on the embedded engine.

For pages of increasing size, side by side in one run:
  cold  - the page prefilled into a slot (load_page: what a request pays when the page is not cached)
  warm  - a request naming the resident page (its prefix served from the slot's KV cache)
  swap  - the page's KV state restored from disk (swap_in_page) - the second cache tier
and the cached fraction of the warm request's prompt.

Usage: python benchmarks/prefix_cache.py [--sizes 200 600 1500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile

from colony.config import EngineSettings
from colony.inference import InferenceRequest, Page
from colony.inference.embedded import EmbeddedEngine


def page_of(tokens: int, page_id: str) -> Page:
    # ~14 tokens per line with SmolLM2's tokenizer
    lines = max(1, tokens // 14)
    return Page(
        page_id=page_id, text=" ".join(f"Line {i}: step_{i}(x) returns x plus {i * 3}." for i in range(lines))
    )


async def measure(sizes: list[int], repeats: int) -> list[dict[str, float]]:
    engine = EmbeddedEngine(
        EngineSettings(page_slots=2, slot_context_tokens=max(sizes) * 2 + 512),
        data_dir=tempfile.mkdtemp(prefix="colony-bench-"),
    )
    await engine.start()
    rows = []
    try:
        for size in sizes:
            cold, warm, swap, fractions, prompt_tokens = [], [], [], [], 0
            for r in range(repeats):
                page = page_of(size, f"bench-{size}-{r}")
                load = await engine.load_page(page)
                cold.append(load.seconds)
                prompt_tokens = load.prompt_tokens
                request = InferenceRequest(
                    prompt="What does step_1 return?", page_ids=[page.page_id], max_tokens=4
                )
                response = await engine.generate(request)
                warm.append(response.timings.ttft)
                fractions.append(response.usage.cached_fraction)
                await engine.swap_out_page(page.page_id)
                swap.append((await engine.swap_in_page(page.page_id)).seconds)
                await engine.evict_page(page.page_id)
            rows.append(
                {
                    "page_tokens": prompt_tokens,
                    "cold_ttft_s": statistics.median(cold),
                    "warm_ttft_s": statistics.median(warm),
                    "swap_in_s": statistics.median(swap),
                    "speedup": statistics.median(cold) / statistics.median(warm),
                    "cached_fraction": statistics.median(fractions),
                }
            )
    finally:
        await engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 600, 1500])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.sizes, args.repeats))
    print(
        f"{'page tokens':>12} {'cold TTFT':>10} {'warm TTFT':>10} {'swap-in':>9} {'speedup':>8} {'cached':>7}"
    )
    for row in rows:
        print(
            f"{row['page_tokens']:>12.0f} {row['cold_ttft_s']:>9.3f}s {row['warm_ttft_s']:>9.3f}s "
            f"{row['swap_in_s']:>8.3f}s {row['speedup']:>7.1f}x {row['cached_fraction']:>6.1%}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
