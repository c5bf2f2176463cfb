"""The conformance cases of every op that takes indices (the CPU-sized ones, eager) on the selected platform: the
program `dsv4hal run memcheck-index-ops` runs under compute-sanitizer. Exit code 0 when every cell passed."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

INDEX_OPS = frozenset({
    "pack_store", "dequant_gather", "sparse_attention_decode", "sparse_attention_prefill", "indexer_topk",
    "indexer_store", "indexer_logits", "indexer_q_prep", "compress", "compress_decode", "moe_route", "moe_experts",
    "build_attention_metadata", "offload_fetch"})


def main(argv: list[str] | None = None) -> int:
    import dsv4hal
    from dsv4hal.conformance.runner import load_catalog, run_cell
    from dsv4hal.output_paths import write_json

    ap = argparse.ArgumentParser(prog="python3 -m dsv4hal.runner.index_op_cells", description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the counts and the failed cells here (default: not written)")
    args = ap.parse_args(argv)
    platform = dsv4hal.select_platform()
    cells = [run_cell(platform, s, b, "eager") for s, b in load_catalog(INDEX_OPS)
             if not s.gpu_only and "eager" in s.modes and "eager" not in s.unreachable]
    counts = dict(collections.Counter(c.status for c in cells))
    failed = [{"op": c.op, "case": c.case, "implementation": c.implementation, "detail": str(c.detail)[:300]}
              for c in cells if c.status == "fail"]
    print(f"{platform.name}: {counts}")
    if args.json:
        write_json(args.json, {"platform": platform.name, "summary": counts, "failed": failed})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
