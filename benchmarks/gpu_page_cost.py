"""What a page miss costs on a GPU, against a page hit, for Llama-shaped models.

Page affinity saves prefill: a request whose pages are cached on its replica prefills only its
question; one whose pages are not prefills them too. The affinity benchmarks count that in prefill
tokens (benchmarks/affinity_sim.py) or measure it on CPU replicas (affinity_e2e.py, affinity_live.py).
This one measures the price of a prefill token on a GPU, so those counts can be read as GPU time:

  miss   - the page (--page-tokens) and the question (--question-tokens) prefilled from nothing
  hit    - the question prefilled on top of the page's KV, already in GPU memory
  decode - one generated token after page and question (the cost a hit or miss is weighed against)

Weights are random (bf16): the time of a forward pass does not depend on their values, and nothing
is downloaded. The models are built from their published shapes (layers, width, heads), run through
transformers with PyTorch's SDPA kernels (by default causal attention aligned bottom right over
cached KV, as engines prefill: --attention lower-right), computing the last position's logits only.
Two clocks: the eager pass's wall time (median), which holds Python's kernel launches, and the
kernels' time summed by torch.profiler (mean), what an engine without launch gaps (CUDA graphs)
approaches. A serving engine (vLLM, with paged attention) is faster on each, so read the ratios,
not the milliseconds, as what carries over.

Needs a CUDA GPU, torch and transformers (none of them are Colony's dependencies):
  python benchmarks/gpu_page_cost.py [--models smollm2-135m,llama-1b,llama-8b]
                                     [--attention lower-right|sdpa]
                                     [--page-tokens 1024,4096] [--question-tokens 64] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # Published shapes (config.json of each model); weights random.
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
    },
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
    "llama-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
}


def _timed(fn: Any, repeats: int, device: str = "cuda") -> list[float]:
    import torch

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def _lower_right_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Causal attention of the new tokens over the cached and new ones, aligned at the bottom
    right (the last query sees every key), as a serving engine's prefix prefill does. PyTorch's
    `causal_lower_right` runs it in the flash or memory-efficient kernels; transformers' own SDPA
    path gives such a pass an explicit mask instead, which made a prefill over 4k cached tokens
    slower than one over none on an H200. Batch of one, no padding: the mask adds nothing."""
    import torch
    from torch.nn.attention.bias import causal_lower_right

    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    bias = causal_lower_right(query.shape[-2], key.shape[-2])
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def kernel_ms(fn: Any, repeats: int) -> float | None:
    """Mean GPU kernel time of one call (torch.profiler); None where no device time is recorded."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
    except RuntimeError as error:  # a profiler that cannot start leaves the wall clock alone
        print(f"  no kernel time: the profiler failed ({error})", flush=True)
        return None
    total_us = 0.0
    for event in prof.key_averages():
        value = getattr(event, "self_device_time_total", None)
        if value is None:
            value = getattr(event, "self_cuda_time_total", 0.0)
        total_us += float(value)
    return total_us / repeats / 1000


def _model(name: str, max_positions: int, device: str = "cuda", attention: str = "sdpa") -> Any:
    """A Llama-shaped model with random weights; attention "sdpa" (transformers') or "lower-right"
    (`_lower_right_sdpa`)."""
    import torch
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    if attention == "lower-right":
        AttentionInterface.register("lower-right", _lower_right_sdpa)
    config = LlamaConfig(**SHAPES[name], max_position_embeddings=max_positions, attn_implementation=attention)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def _tensors(cache: Any) -> list[tuple[Any, Any]]:
    """Copies of a cache's per-layer keys and values (the attribute names moved across versions)."""
    if hasattr(cache, "layers"):
        return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    pairs = zip(cache.key_cache, cache.value_cache, strict=True)
    return [(keys.clone(), values.clone()) for keys, values in pairs]


def cache_from(layers: list[tuple[Any, Any]]) -> Any:
    """A fresh transformers cache holding these per-layer keys and values (a copy on the device):
    a pass over it leaves `layers` as they were, so each timed pass starts from the same KV."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def measure(
    name: str,
    page_tokens: int,
    question_tokens: int,
    repeats: int,
    attention: str = "sdpa",
    device: str = "cuda",
) -> dict[str, Any]:
    """Milliseconds of a miss, a hit and a decode step for one model and page size: the eager
    pass's median wall time, and its kernels' mean time (`*_kernel_ms`; None off a GPU)."""
    import torch
    from transformers import DynamicCache

    model = _model(name, page_tokens + question_tokens + 16, device=device, attention=attention)
    vocab = SHAPES[name]["vocab_size"]
    page = torch.randint(0, vocab, (1, page_tokens), device=device)
    question = torch.randint(0, vocab, (1, question_tokens), device=device)
    whole = torch.cat([page, question], dim=1)
    with torch.inference_mode():
        page_cache = DynamicCache()
        model(page, past_key_values=page_cache, use_cache=True)
        page_layers = _tensors(page_cache)

        def fresh_page_cache() -> Any:
            return cache_from(page_layers)

        # only the last position's logits, as a serving engine computes them
        def miss() -> None:
            model(whole, use_cache=True, logits_to_keep=1)

        def hit() -> None:
            model(question, past_key_values=fresh_page_cache(), use_cache=True, logits_to_keep=1)

        def copy_only() -> None:
            fresh_page_cache()

        full_cache = DynamicCache()
        model(whole, past_key_values=full_cache, use_cache=True)
        full_layers = _tensors(full_cache)
        token = torch.randint(0, vocab, (1, 1), device=device)

        def decode() -> None:
            model(token, past_key_values=cache_from(full_layers), use_cache=True, logits_to_keep=1)

        miss_ms = statistics.median(_timed(miss, repeats, device))
        # The hit rebuilds a cache object from the page's tensors (a copy, on the GPU); that copy is
        # timed alone and taken off, so the hit is the question's prefill over cached KV.
        copy_ms = statistics.median(_timed(copy_only, repeats, device))
        hit_ms = max(statistics.median(_timed(hit, repeats, device)) - copy_ms, 0.0)
        decode_ms = max(statistics.median(_timed(decode, repeats, device)) - copy_ms, 0.0)
        kernels = {
            part: kernel_ms(fn, repeats) for part, fn in (("miss", miss), ("hit", hit), ("decode", decode))
        }
        copy_kernel = kernel_ms(copy_only, repeats) or 0.0
    by_kernels = {
        f"{part}_kernel_ms": None
        if value is None
        else round(max(value - (copy_kernel if part != "miss" else 0.0), 0.0), 2)
        for part, value in kernels.items()
    }
    return {
        **by_kernels,
        "model": name,
        "page_tokens": page_tokens,
        "question_tokens": question_tokens,
        "miss_ms": round(miss_ms, 2),
        "hit_ms": round(hit_ms, 2),
        "decode_ms": round(decode_ms, 2),
        "miss_over_hit": round(miss_ms / max(hit_ms, 1e-3), 1),
        "miss_in_decode_steps": round(miss_ms / max(decode_ms, 1e-3), 1),
        "prefill_tokens_per_s": round((page_tokens + question_tokens) / miss_ms * 1000),
    }


def add_attention_option(parser: argparse.ArgumentParser, default: str) -> None:
    """`--attention`: "sdpa" (transformers' path, which masks a prefill over cached KV explicitly)
    or "lower-right" (`_lower_right_sdpa`: causal attention aligned as engines prefill)."""
    parser.add_argument(
        "--attention",
        choices=["sdpa", "lower-right"],
        default=default,
        help="sdpa: transformers' path (an explicit mask over cached KV); lower-right: causal "
        "attention aligned bottom right, in the flash kernels, as serving engines prefill",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,llama-1b,llama-8b")
    parser.add_argument("--page-tokens", default="1024,4096")
    parser.add_argument("--question-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    add_attention_option(parser, "lower-right")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_page_cost needs a CUDA GPU (torch.cuda.is_available() is False)")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    rows = []
    for name in args.models.split(","):
        for page_tokens in (int(value) for value in args.page_tokens.split(",")):
            row = measure(name, page_tokens, args.question_tokens, args.repeats, args.attention)
            rows.append(row)
            torch.cuda.empty_cache()
            print(
                json.dumps(row)
                if args.json
                else f"{name:>13} page {page_tokens:>5}: miss {row['miss_ms']:>7} ms  hit "
                f"{row['hit_ms']:>6} ms  decode {row['decode_ms']:>6} ms  miss/hit "
                f"{row['miss_over_hit']:>5}x  miss = {row['miss_in_decode_steps']} decode steps  "
                f"prefill {row['prefill_tokens_per_s']} tok/s; kernels: miss {row['miss_kernel_ms']} ms  "
                f"hit {row['hit_kernel_ms']} ms  decode {row['decode_kernel_ms']} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
