"""Command line: `dsv4hal info`, `dsv4hal explain OP`, `dsv4hal conformance`, `dsv4hal bench`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsv4hal.errors import Dsv4HalError


def _info_for(args: argparse.Namespace, registry: Any) -> Any:
    from dsv4hal import hardware

    info = hardware.detect(registry.requirements())
    if args.simulate:
        libs = dict(info.libraries)
        for item in args.library or ():
            name, _, ver = item.partition("=")
            libs[name] = ver or "simulated"
        info = dataclasses.replace(hardware.simulated(args.simulate, libraries=libs),
                                   notes=(f"simulated {args.simulate}; libraries of this machine plus --library",))
    return info


def _select(args: argparse.Namespace) -> tuple[Any, Any]:
    from dsv4hal.platform import load_registry, select_platform

    registry = load_registry()
    info = _info_for(args, registry)
    return registry, select_platform(getattr(args, "platform", None), info=info, registry=registry)


def _platform_rows(registry: Any, info: Any, chosen: str) -> list[dict[str, Any]]:
    rows = []
    for name, spec in sorted(registry.platforms.items()):
        reasons = spec.claims(info)
        rows.append({"name": name, "plugin": spec.plugin, "version": registry.plugin_versions.get(spec.plugin, ""),
                     "description": spec.description, "priority": spec.priority, "fits": not reasons,
                     "selected": name == chosen, "reasons": reasons or ["fits this machine"]})
    return rows


def cmd_info(args: argparse.Namespace) -> int:
    registry, platform = _select(args)
    decisions = {op: d.to_json() for op, d in platform.default_decisions.items()}
    data = {
        "platform": platform.name, "platform_source": platform.platform_decision.source,
        "info": platform.info.to_json(),
        "platforms": _platform_rows(registry, platform.info, platform.name),
        "plugins": [{"name": n, "version": v} for n, v in sorted(registry.plugin_versions.items())],
        "plugin_errors": dict(registry.plugin_errors),
        "overrides": {"platform": platform.overrides.platform, "kernels": dict(platform.overrides.kernels),
                      "disabled_plugins": sorted(platform.overrides.disabled_plugins),
                      "strict": platform.overrides.strict},
        "ops": decisions,
    }
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    i = platform.info
    print(f"platform: {platform.name} ({platform.platform_decision.source})   machine: {i.summary()}")
    for note in i.notes:
        print(f"  note: {note}")
    print("platforms:")
    for row in data["platforms"]:
        mark = "*" if row["selected"] else ("+" if row["fits"] else "-")
        print(f"  {mark} {row['name']:<11} [{row['plugin']}] {'; '.join(row['reasons'])}")
    print("plugins: " + ", ".join(f"{p['name']} ({p['version']})" for p in data["plugins"]))
    for name, err in registry.plugin_errors.items():
        print(f"  FAILED {name}: {err}")
    print("ops (default case; * chosen, + eligible, - rejected):")
    for op, d in platform.default_decisions.items():
        print(f"  {op}")
        for c in d.candidates:
            mark = {"chosen": "*", "eligible": "+", "rejected": "-"}[c.status]
            why = f"  <- {'; '.join(c.reasons)}" if c.reasons else ""
            print(f"    {mark} {c.name:<28} p{c.priority:<4} {c.tier:<9}{why}")
    return 0


def _parse_case(items: Sequence[str] | None, default: Any) -> dict[str, object]:
    case = dict(default)
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep:
            raise Dsv4HalError(f"--case {item!r} is not key=value")
        value: object = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        if raw in ("True", "False", "None"):
            value = {"True": True, "False": False, "None": None}[raw]
        case[key] = value
    return case


def cmd_explain(args: argparse.Namespace) -> int:
    from dsv4hal.ops.catalog import OP_NAMES, OPS_BY_NAME

    if args.op not in OPS_BY_NAME:
        raise Dsv4HalError(f"unknown op {args.op!r}", remedy=f"valid ops: {', '.join(OP_NAMES)}")
    _, platform = _select(args)
    decision = platform.explain(args.op, _parse_case(args.case, OPS_BY_NAME[args.op].default_case))
    print(json.dumps(decision.to_json(), indent=2, default=str) if args.json else decision.explain())
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from dsv4hal.conformance.report import markdown
    from dsv4hal.conformance.runner import run_conformance

    def progress(i: int, n: int, cell: Any) -> None:
        if not args.quiet:
            err = "" if cell.max_error is None else f" err {cell.max_error:.3g}"
            print(f"[{i}/{n}] {cell.op} {cell.case} {cell.mode}: {cell.status}{err} {cell.implementation}",
                  file=sys.stderr, flush=True)

    ops = args.ops.split(",") if args.ops else None
    report = run_conformance(args.platform, ops=ops, progress=progress, cases=args.cases)
    if args.json:
        _write(args.json, json.dumps(report.to_json(), indent=1, default=str) + "\n")
    md = markdown(report)
    if args.markdown:
        _write(args.markdown, md)
    print(md if not args.quiet else "")
    counts = report.counts()
    print("conformance " + report.platform + ": " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return 0 if report.ok else 1


def _write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def cmd_bench(args: argparse.Namespace) -> int:
    from dsv4hal.bench.main import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsv4hal", description="DeepSeek-V4 kernel HAL")
    sub = p.add_subparsers(dest="cmd", required=True)

    def hw(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--platform", help="force a platform (like DSV4HAL_PLATFORM)")
        sp.add_argument("--simulate", metavar="ARCH", help="pretend the machine is ARCH (sm90, sm100, gfx942, ...)")
        sp.add_argument("--library", action="append", metavar="NAME[=VER]",
                        help="with --simulate: pretend this library is installed (repeatable)")

    sp = sub.add_parser("info", help="platform, detection, plugins and the kernel chosen per op")
    hw(sp)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_info)
    sp = sub.add_parser("explain", help="why an op gets its kernel")
    sp.add_argument("op")
    hw(sp)
    sp.add_argument("--case", action="append", metavar="KEY=VALUE", help="case feature (repeatable)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_explain)
    sp = sub.add_parser("conformance", help="run the conformance matrix against the reference")
    sp.add_argument("--platform")
    sp.add_argument("--ops", help="comma-separated subset of ops")
    sp.add_argument("--cases", metavar="REGEX", help="only cases whose name matches (re.search)")
    sp.add_argument("--json", metavar="PATH")
    sp.add_argument("--markdown", metavar="PATH")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_conformance)
    sp = sub.add_parser("demo", help="an engine-shaped DSV4 layer stack: prefill, then decode (small shapes)")
    sp.add_argument("--platform")
    sp.add_argument("--batch", type=int, default=2)
    sp.add_argument("--context", type=int, default=300)
    sp.add_argument("--steps", type=int, default=4)
    sp.add_argument("--size", choices=("small", "flash"), default="small",
                    help="layer dimensions: small (CPU) or V4-Flash (full size, on a GPU)")
    sp.add_argument("--fill", choices=("prefill", "random"), default="prefill",
                    help="prefill the prompts, or fill the caches with random rows (a synthetic long context)")
    sp.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                    help="capture the decode step in a CUDA graph (default: on a CUDA platform)")
    sp.add_argument("--compare-cpu", action="store_true",
                    help="also run the small config on the CPU reference and compare every layer's output")
    sp.add_argument("--json", metavar="PATH")
    sp.add_argument("--plot", metavar="PNG", help="per-op breakdown plot (graph mode)")
    sp.set_defaults(func=lambda a: __import__("dsv4hal.demo", fromlist=["main"]).main(a))
    sp = sub.add_parser("bench", help="benchmarks (GPU)")
    sp.add_argument("op", help="attention, pack_store, topk, or all")
    sp.add_argument("--json", metavar="PATH")
    sp.add_argument("--plot", metavar="PNG")
    sp.add_argument("--quick", action="store_true")
    sp.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except Dsv4HalError as exc:
        print(f"dsv4hal {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # e.g. an unknown --simulate arch, an unwritable output path
        print(f"dsv4hal {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
