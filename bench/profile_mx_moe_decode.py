"""Kernel by kernel, the portable fused MoE's MXFP4 decode call on the GPU (V4-Flash experts, its default tiles):
one CUDA graph replay of moe_experts at each T, with each kernel's time (CUPTI), beside the replay's own time. Says
what the call is made of beyond its two GEMMs (the activation split; the route alignment and the final cast, both
from two tokens).

    python3 bench/profile_mx_moe_decode.py --json out/profile-mx-moe-decode.json [--tokens 1,8,64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dsv4hal.bench.timing import graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params
from dsv4hal.cuda_graphs import capture
from dsv4hal.demo.step_profile import profile_replay
from dsv4hal.kernels.triton import fused_moe as tmoe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="1,8,64")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = _experts_params("flash", 1, "mxfp4")
    w = tmoe.prepare_weights(_expert_weights(params, torch.device("cuda"), gen))
    e, h, k = params["E"], params["H"], params["top_k"]
    out: dict = {"command": "python3 bench/profile_mx_moe_decode.py --tokens " + args.tokens + " --json ...",
                 "device": torch.cuda.get_device_name(), "rows": []}
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5

        def call(x=x, ids=ids, tw=tw) -> torch.Tensor:  # noqa: ANN001
            return tmoe.moe_experts(x, ids, tw, w)

        replay_us = graph_us(call)
        graph, _ = capture(call, repeat=1)
        prof = profile_replay(graph)
        out["rows"].append({"T": t, "replay_us": replay_us, **prof})
        print(f"T={t}: replay {replay_us:.1f} us, kernels {prof['kernels_us']:.1f} us in {prof['kernel_launches']} "
              "launches: " + ", ".join(f"{r['kernel'][:40]} {r['us']:.1f}" for r in prof["top"]), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
