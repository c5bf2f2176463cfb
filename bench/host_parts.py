"""Where a bound call's host time goes, part by part, on this machine: the bound sparse_attention_decode (flash-c4,
T = 1, the bench's arguments as keywords) with its kernel swapped for a no-op, against the parts it is made of
(the memo key, the memo lookup, the case, the case key, the compile check, one tensor's metadata reads); and
moe_experts at one token, bound and its kernel on the prepared payload (on a GPU), then both with a no-op kernel.
Each part is timed in turns with the others (bench.timing.host_us_interleaved: rounds of 2000 calls, each keeping
its fastest round), so a drifting host hits all alike.

    python3 bench/host_parts.py --json out/host-parts.json [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import platform as host
import sys
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op
from dsv4hal.bench.timing import host_us_interleaved
from dsv4hal.ops import memo as memo_mod
from dsv4hal.ops.memo import metadata_key, split_key


def _noop(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache=None,  # noqa: ANN001, ANN202
          extra_indices=None, extra_lengths=None):
    return None


def _args(dev: str) -> dict[str, object]:
    i32 = dict(dtype=torch.int32, device=dev)
    return dict(q=torch.zeros(1, 64, 512, dtype=torch.bfloat16, device=dev),
                swa_cache=dsv4hal.V4PagedCache.empty(4, 256, device=dev), swa_indices=torch.zeros(1, 128, **i32),
                swa_lengths=torch.full((1,), 128, **i32), sink=torch.zeros(64, device=dev), softmax_scale=512 ** -0.5,
                extra_cache=dsv4hal.V4PagedCache.empty(4, 64, device=dev), extra_indices=torch.zeros(1, 512, **i32),
                extra_lengths=torch.full((1,), 512, **i32))


def _forget_checks(op: object) -> None:
    """After a memo entry was swapped for a no-op: the op's tensor checks, which kept the real kernel, start over
    (the next call finds the memo's no-op and checks it in)."""
    from dsv4hal.ops.memo import TensorChecks

    op._checks = TensorChecks()  # type: ignore[attr-defined]


def _moe_parts(platform: object, dev: str) -> dict[str, object]:
    """moe_experts at T = 1 (V4-Flash MXFP4 experts, prepared for 64 tokens as the demo does): the bound call and
    its kernel on the payload, then both with the kernel swapped for a no-op."""
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

    gen = torch.Generator(device=dev).manual_seed(0)
    params = _experts_params("flash", 1, "mxfp4")
    op = platform.ops.moe_experts  # type: ignore[attr-defined]
    prepared = op.prepare_weights(_expert_weights(params, torch.device(dev), gen), tokens=64)
    x = torch.randn(1, params["H"], device=dev, generator=gen).bfloat16()
    ids = torch.arange(params["top_k"], device=dev, dtype=torch.int32)[None]
    tw = torch.rand(1, params["top_k"], device=dev, generator=gen)
    kernel = op._prepared_kernel((x, ids, tw, prepared), {})
    real = {"moe_experts bound, validated": lambda: op(x, ids, tw, prepared),
            "moe_experts kernel on the payload": lambda: kernel(x, ids, tw, prepared.payload)}
    us = host_us_interleaved(real) if dev == "cuda" else {}
    op(x, ids, tw, prepared)
    for k in list(op._memo):  # the memo hit runs a no-op on the payload
        op._memo[k] = op._on_payload(lambda *a, **kw: None)
    _forget_checks(op)
    us.update(host_us_interleaved({"moe_experts bound, no-op kernel": lambda: op(x, ids, tw, prepared),
                                   "no-op called with the payload": lambda: (lambda *a: None)(x, ids, tw,
                                                                                             prepared.payload)},
                                  calls=2000, rounds=15))
    return {"implementation": prepared.implementation, "us": us}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    platform = dsv4hal.select_platform()
    args = _args(a.device)
    impl = platform.ops.sparse_attention_decode.decide(platform.ops.sparse_attention_decode.case_of(**args)).chosen.name
    op, fast = (bound_op(platform, "sparse_attention_decode", impl, validate=v) for v in (True, False))
    case = op.case_of(**args)
    key = metadata_key((), args)
    op._memo[key] = _noop  # the memo hit runs the no-op: what remains is the bound call's own cost
    _forget_checks(op)
    fast._by_case[tuple(case.items())] = (fast._by_case.get(tuple(case.items()), (op.decide(case),))[0], _noop)
    case_key = op.definition.key
    if case_key is not None:  # the unvalidated call's lookup by the op's case key runs the no-op too
        fast._by_key[case_key(**args)] = _noop
    _forget_checks(fast)
    op(**args)  # checks the memo's no-op in
    memo, by_case, by_key, q, checks = op._memo, fast._by_case, fast._by_key, args["q"], op._checks
    fns = {
        "no-op kernel called with the keywords": lambda: _noop(**args),
        "bound, validated (memo hit)": lambda: op(**args),
        "bound, validate=False": lambda: fast(**args),
        "memo key": lambda: metadata_key((), args),
        "memo key + lookup": lambda: memo.get(metadata_key((), args)),
        "split key": lambda: split_key((), args),
        "split key + tensor checks": lambda: checks.find(*split_key((), args)),
        "case": lambda: op.case_of(**args),
        "case + lookup": lambda: by_case.get(tuple(op.case_of(**args).items())),
        **({"case key + lookup": lambda: by_key.get(case_key(**args))} if case_key is not None else {}),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "q.dtype, q.shape, q.stride(), q.device": lambda: (q.dtype, q.shape, q.stride(), q.device),
    }
    us = host_us_interleaved(fns, calls=2000, rounds=15)
    base = us["no-op kernel called with the keywords"]
    out = {"command": f"python3 bench/host_parts.py --device {a.device} --json ...", "platform": platform.name,
           "kernel": impl, "python": sys.version.split()[0], "cpu": host.processor() or host.machine(),
           "torch": torch.__version__, "us": us,
           "added_over_noop_us": {k: v - base for k, v in us.items() if k.startswith("bound")},
           # whether the validated calls were answered by the C++ checks: the checks were on, and they hold the
           # no-op for these arguments
           "tensor_checks": {"on": memo_mod._TensorGuards is not None,
                             "found": checks.find(*split_key((), args)) is _noop,
                             "kept": sum(len(v) for v in checks._by_key.values())}}
    out["moe_experts"] = _moe_parts(platform, a.device)
    for k, v in {**us, **out["moe_experts"]["us"]}.items():
        print(f"{k:45s} {v:7.3f} us")
    print("tensor checks:", out["tensor_checks"])
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
