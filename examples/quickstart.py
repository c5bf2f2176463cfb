"""Quick start for an engine author: one decode step of a C4 attention layer and its MoE on small CPU sizes.

    python3 examples/quickstart.py            # runs on whatever select_platform() picks, on its device

On a GPU machine the platform is the GPU's and the tensors go to "cuda" (ROCm too); the sizes stay small.
tests/tools/test_quickstart.py runs this file, so it stays in step with the API."""

from __future__ import annotations

import torch

import dsv4hal


def main(device: str | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    platform = dsv4hal.select_platform()  # once, before weights are packed
    device = device or ("cuda" if platform.info.is_gpu else "cpu")  # the tensors live where its kernels run
    print(platform.explain("sparse_attention_decode").explain())

    # --- attention: a 584-byte-a-token paged cache for the sliding window (page 256) and the C4 keys (page 64)
    batch, heads, context = 2, 64, 200  # decode tokens this step, query heads (64 or 128), tokens already cached
    swa_cache = dsv4hal.V4PagedCache.empty(num_pages=4, page_size=256, fp8=platform.info.fp8, device=device)
    c4_cache = dsv4hal.V4PagedCache.empty(num_pages=4, page_size=64, fp8=platform.info.fp8, device=device)

    # request r owns SWA slots [r * 512, r * 512 + 512) and C4 slots [r * 128, r * 128 + 128); store the history
    swa_slots = torch.arange(batch)[:, None] * 512 + torch.arange(context + 1)[None, :]  # [B, context + 1]
    c4_slots = torch.arange(batch)[:, None] * 128 + torch.arange(context // 4)[None, :]  # [B, context / 4]
    platform.ops.pack_store(torch.randn(swa_slots.numel(), 512, generator=g).bfloat16().to(device),
                            swa_slots.flatten().to(device), swa_cache)  # [N, 512] bf16 -> 584-byte records
    platform.ops.pack_store(torch.randn(c4_slots.numel(), 512, generator=g).bfloat16().to(device),
                            c4_slots.flatten().to(device), c4_cache)

    # this step's metadata: the last 128 tokens, newest first, padded with -1 to a multiple of 64; all C4 keys
    window = 128
    swa_indices = swa_slots[:, context - torch.arange(window)].int()  # [B, 128]
    swa_lengths = torch.full((batch,), window, dtype=torch.int32)
    c4_indices = torch.full((batch, 64), -1, dtype=torch.int32)  # an indexer's top-k would pick these
    c4_indices[:, : c4_slots.shape[1]] = c4_slots.int()
    c4_lengths = torch.full((batch,), c4_slots.shape[1], dtype=torch.int32)
    q = torch.randn(batch, heads, 512, generator=g).bfloat16()
    sink = torch.zeros(heads)  # per-head attention sink logit
    to = {"device": device}
    with platform.decode_step():  # lengths fixed for this step: plans are shared by the step's layers
        out, lse = platform.ops.sparse_attention_decode(
            q.to(**to), swa_cache, swa_indices.to(**to), swa_lengths.to(**to), sink.to(**to), 512 ** -0.5,
            extra_cache=c4_cache, extra_indices=c4_indices.to(**to), extra_lengths=c4_lengths.to(**to))

    # --- MoE: kernel choice fixes the weight layout, so weights are prepared once, at load
    experts, hidden, inter = 8, 256, 128
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.05  # fp32 master weights (gate over up)
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.05
    expert_weights = dsv4hal.quantize_experts(w13.to(device), w2.to(device), "mxfp4")  # a dsv4hal.ExpertWeights
    prepared = platform.ops.moe_experts.prepare_weights(expert_weights)  # kernel chosen, layout made
    print(prepared)  # which kernel and layout; no tensors

    x = torch.randn(batch, hidden, generator=g).bfloat16().to(device)
    topk_ids, topk_weights = platform.ops.moe_route(torch.randn(batch, experts, generator=g).to(device), top_k=2)
    y = platform.ops.moe_experts(x, topk_ids, topk_weights, prepared)  # runs that kernel, or a typed error
    print(f"attention out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}; moe out {tuple(y.shape)}")
    return {"out": out, "lse": lse, "moe": y}


if __name__ == "__main__":
    main()
