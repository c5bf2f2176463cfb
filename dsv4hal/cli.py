"""Command line: `dsv4hal info`, `dsv4hal explain OP`, `dsv4hal conformance`, `dsv4hal bench`, `dsv4hal run`, ..."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsv4hal.cli_args import add_demo_parser, number
from dsv4hal.collectives import COLLECTIVES
from dsv4hal.errors import Dsv4HalError
from dsv4hal.kernels import native_glue
from dsv4hal.ops.buckets import DECODE_TOKEN_CLASSES, MOE_TOKEN_CLASSES
from dsv4hal.output_paths import check_output
from dsv4hal.progress import Progress


def _info_for(args: argparse.Namespace, registry: Any) -> Any:
    from dsv4hal import hardware

    if getattr(args, "library", None) and not args.simulate:
        raise Dsv4HalError("--library only applies to a simulated machine",
                           remedy="add --simulate ARCH (sm90, sm100, gfx942, ...), or drop --library")
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
    return registry, select_platform(getattr(args, "platform", None), info=info, registry=registry,
                                     lock=getattr(args, "lock", None))


def _platform_rows(registry: Any, info: Any, chosen: str) -> list[dict[str, Any]]:
    rows = []
    for name, spec in sorted(registry.platforms.items()):
        reasons = spec.claims(info)
        rows.append({"name": name, "plugin": spec.plugin, "version": registry.plugin_versions.get(spec.plugin, ""),
                     "description": spec.description, "priority": spec.priority, "fits": not reasons,
                     "selected": name == chosen, "reasons": reasons or ["fits this machine"]})
    return rows


def cmd_info(args: argparse.Namespace) -> int:
    from dsv4hal.cli_tables import collective_decisions, decision_lines

    registry, platform = _select(args)
    decisions = {op: d.to_json() for op, d in platform.default_decisions.items()}
    collectives = collective_decisions(platform)
    data = {
        "platform": platform.name, "platform_source": platform.platform_decision.source,
        "info": platform.host_info.to_json(),  # the machine (the CPU platform judges its kernels by a CPU view)
        "platforms": _platform_rows(registry, platform.host_info, platform.name),
        "plugins": [{"name": n, "version": v} for n, v in sorted(registry.plugin_versions.items())],
        "plugin_errors": dict(registry.plugin_errors),
        "overrides": {"platform": platform.overrides.platform, "kernels": dict(platform.overrides.kernels),
                      "disabled_plugins": sorted(platform.overrides.disabled_plugins),
                      "strict": platform.overrides.strict},
        "ops": decisions,
        "collectives": {op: d if isinstance(d, str) else d.to_json() for op, d in collectives.items()},
        "lock": platform.lock.describe() if platform.lock else None,
        "native_glue": native_glue.status(),
    }
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    i = platform.host_info
    print(f"platform: {platform.name} ({platform.platform_decision.source})   machine: {i.summary()}")
    for note in dict.fromkeys((*i.notes, *platform.info.notes)):
        print(f"  note: {note}")
    print("platforms:")
    for row in data["platforms"]:
        mark = "*" if row["selected"] else ("+" if row["fits"] else "-")
        print(f"  {mark} {row['name']:<11} [{row['plugin']}] {'; '.join(row['reasons'])}")
    print("plugins: " + ", ".join(f"{p['name']} ({p['version']})" for p in data["plugins"]))
    print(f"lock: {data['lock'] or 'none (static priorities; DSV4HAL_LOCK or --lock loads one)'}")
    for name, err in registry.plugin_errors.items():
        print(f"  FAILED {name}: {err}")
    g = data["native_glue"]
    print(f"native glue: {native_glue.MODE_ENV}={g['mode']} (C++ call glue, built at first use; loaded: "
          f"{', '.join(g['built']) or 'none yet'})")
    for name, why in g["not_in_use"].items():
        print(f"  not in use: {name}: {why}")
    print("ops (default case; * chosen, + eligible, - rejected):")
    print("\n".join(decision_lines(platform.default_decisions)))
    print("collective ops (backends, default case on this platform; dsv4hal explain OP --case KEY=VALUE):")
    print("\n".join(decision_lines(collectives)))
    return 0



# Case features whose values are a closed set (others: a non-negative int, a bool, or a word, as the default is).
CASE_CHOICES: dict[str, tuple[object, ...]] = {
    "fp8": ("e4m3fn", "e4m3fnuz"), "h_q": (64, 128), "compress_ratio": (0, 4, 128), "ratio": (4, 128),
    "format": ("mxfp4", "fp8_block"), "tokens": MOE_TOKEN_CLASSES, "size": ("small", "large")}
# An op whose feature of that name takes another set: sparse attention's tokens tells one query row from more
OP_CASE_CHOICES: dict[tuple[str, str], tuple[object, ...]] = {
    ("sparse_attention_decode", "tokens"): DECODE_TOKEN_CLASSES,
    ("sparse_attention_decode", "extra_class"): ("short", "long"),
    **{(c.name, k): v for c in COLLECTIVES for k, v in c.choices.items()}}
# Features a call may leave out (written None): those whose default is None (moe_experts' fp8 for FP4 weights) and
# these, which an SWA-only attention layer (no extra cache) has as None
CASE_ABSENT: frozenset[tuple[str, str]] = frozenset(
    ("sparse_attention_decode", k) for k in ("extra_page_size", "extra_width", "extra_class"))


def case_choices(op: str, key: str) -> tuple[object, ...] | None:
    """The closed set of values of an op's case feature, or None where it is open."""
    return OP_CASE_CHOICES.get((op, key), CASE_CHOICES.get(key))


def _expected(choices: tuple[object, ...] | None, default: object) -> str:
    """What a --case value of this feature may be, for the error's remedy."""
    if choices:
        return ", ".join(map(str, choices))
    if isinstance(default, bool):
        return "true or false"
    return "a non-negative integer" if isinstance(default, int) else "a word"


def _case_value(op: str, key: str, raw: str, default: object) -> object:
    """`raw` read as the type of the default case's value; a typed error naming the valid values otherwise."""
    choices = case_choices(op, key)
    absent = default is None or (op, key) in CASE_ABSENT
    if raw == "None":
        if absent:  # a feature the call leaves out, as its case function gives it
            return None
        raise Dsv4HalError(f"--case {key}=None is not valid for {op}: its calls always have a {key}",
                           remedy=f"{key} takes {_expected(choices, default)} (default {default})")
    value: object
    if isinstance(default, bool):
        value = {"true": True, "1": True, "false": False, "0": False}.get(raw.lower())
        ok = value is not None
    elif isinstance(default, int):
        try:
            value = int(raw)
            ok = value >= 0
        except ValueError:
            value, ok = raw, False
    else:
        value, ok = raw, bool(raw)
    if ok and choices is not None and value not in choices:
        ok = False
    if not ok:
        raise Dsv4HalError(f"--case {key}={raw!r} is not valid for {op}",
                           remedy=f"{key} takes {_expected(choices, default)}{', None' if absent else ''} "
                                  f"(default {default})")
    return value


def _parse_case(items: Sequence[str] | None, default: Any, op: str = "",
                alternates: Sequence[Any] = ()) -> dict[str, object]:
    """--case KEY=VALUE items over the default case; keys of the op's alternate cases are accepted too."""
    case = dict(default)
    known = dict(default)
    for alt in alternates:
        known.update({k: v for k, v in alt.items() if k not in known})
    for item in items or ():
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise Dsv4HalError(f"--case {item!r} is not key=value", remedy=f"case keys of {op}: {_keys(default)}")
        if key not in known:
            raise Dsv4HalError(f"--case key {key!r} is not a case feature of {op}",
                               remedy=f"case keys of {op}: {_keys(known)} (dsv4hal explain --help lists all)")
        case[key] = _case_value(op, key, raw.strip(), known[key])
    return case


def _keys(case: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items()) or "(none)"


def cmd_explain(args: argparse.Namespace) -> int:
    _, platform = _select(args)
    if args.op in platform.registry.collectives:  # a collective op: its backends, the case as this platform sees it
        default, alternates = platform.collective_case(args.op), ()
    else:
        spec = platform.ops[args.op].spec  # an unknown op: UnknownOpError listing the platform's ops
        default, alternates = spec.default_case, spec.alternate_cases
    decision = platform.explain(args.op, _parse_case(args.case, default, args.op, alternates))
    print(json.dumps(decision.to_json(), indent=2, default=str) if args.json else decision.explain())
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from dsv4hal.conformance.report import markdown
    from dsv4hal.conformance.runner import run_conformance

    def progress(i: int, n: int, cell: Any) -> None:
        bar.total = n
        err = "" if cell.max_error is None else f" err {cell.max_error:.3g}"
        text = f"{cell.op} {cell.case} {cell.mode}: {cell.status}{err} {cell.implementation}"
        bar.update(text)
        if cell.status == "fail" and bar.animated:
            bar.write(f"FAIL {text}")

    for path in (args.json, args.markdown):
        check_output(path)
    ops = args.ops.split(",") if args.ops is not None else None
    with Progress(None, "conformance", enabled=not args.quiet) as bar:
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


def _bench_names() -> list[str]:
    from dsv4hal.bench.main import BENCHES

    return list(BENCHES)


def cmd_bench(args: argparse.Namespace) -> int:
    from dsv4hal.bench.main import run_bench

    check_output(args.json)
    check_output(args.plot, plot=True)
    return run_bench(args)


def _case_keys_help() -> str:
    from dsv4hal.ops.catalog import OPS

    lines = ["case keys (--case KEY=VALUE) per op, with the default case:"]
    for o in OPS:
        extra = {k: v for alt in o.alternate_cases for k, v in alt.items() if k not in o.default_case}
        lines.append(f"  {o.name:<26} {_keys(o.default_case)}" + (f" (also: {', '.join(extra)})" if extra else ""))
    lines += [f"  {c.name:<26} {_keys(c.default_case)} (collective; device, group_backend: the platform's)"
              for c in COLLECTIVES]
    lines.append("closed sets: " + "; ".join(f"{k} in {{{', '.join(map(str, v))}}}" for k, v in CASE_CHOICES.items())
                 + "".join(f"; {op}'s {k} in {{{', '.join(map(str, v))}}}" for (op, k), v in OP_CASE_CHOICES.items()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from dsv4hal import __version__

    p = argparse.ArgumentParser(prog="dsv4hal", description="DeepSeek-V4 kernel HAL")
    p.add_argument("--version", action="version", version=f"dsv4hal {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log plugin loading and platform choice (-v), and every kernel decision (-vv) to stderr "
                        "(default: warnings only)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def hw(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--platform", help="force a platform (like DSV4HAL_PLATFORM)")
        sp.add_argument("--simulate", metavar="ARCH", help="pretend the machine is ARCH (sm90, sm100, gfx942, ...)")
        sp.add_argument("--library", action="append", metavar="NAME[=VER]",
                        help="with --simulate: pretend this library is installed (repeatable)")
        sp.add_argument("--lock", metavar="PATH", help="follow this lock file from `dsv4hal tune` (like DSV4HAL_LOCK)")

    sp = sub.add_parser("info", help="platform, detection, plugins and the kernel chosen per op")
    hw(sp)
    sp.add_argument("--json", action="store_true", help="print JSON instead of the table (default: table)")
    sp.set_defaults(func=cmd_info)
    sp = sub.add_parser("explain", help="why an op gets its kernel", epilog=_case_keys_help(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("op", help="the op (dsv4hal.OP_NAMES) or collective op (expert_parallel...); listed below")
    hw(sp)
    sp.add_argument("--case", action="append", metavar="KEY=VALUE",
                    help="case feature, repeatable; keys below (default: the op's default case)")
    sp.add_argument("--json", action="store_true", help="print the decision as JSON (default: text)")
    sp.set_defaults(func=cmd_explain)
    sp = sub.add_parser("conformance", help="run the conformance matrix against the reference")
    sp.add_argument("--platform", help="platform to check (default: the detected one; like DSV4HAL_PLATFORM)")
    sp.add_argument("--ops", help="comma-separated subset of ops, decode_step included (default: all)")
    sp.add_argument("--cases", metavar="REGEX", help="only cases whose name matches (re.search; default: all)")
    sp.add_argument("--json", metavar="PATH", help="write the cells as JSON here (default: not written)")
    sp.add_argument("--markdown", metavar="PATH", help="write the markdown report here (default: not written)")
    sp.add_argument("--quiet", action="store_true",
                    help="no progress and no report on stdout, only the summary line (default: both)")
    sp.set_defaults(func=cmd_conformance)
    add_demo_parser(sub)
    sp = sub.add_parser("soak", help="an engine's lifecycle with every op for N minutes: graphs, replays, checks")
    sp.add_argument("--platform", help="force a platform (like DSV4HAL_PLATFORM)")
    sp.add_argument("--minutes", type=number(float, 0, above=True), default=10.0,
                    help="how long to run (default: %(default)s)")
    sp.add_argument("--context", type=number(int, 2), default=2048,
                    help="tokens of context per request (default: %(default)s)")
    sp.add_argument("--seed", type=number(int, 0, 1 << 63), default=0, help="random seed (default: %(default)s)")
    sp.add_argument("--json", metavar="PATH", help="write the report here")
    sp.set_defaults(func=lambda a: __import__("dsv4hal.soak", fromlist=["main"]).main(a))
    sp = sub.add_parser("bench", help="benchmarks (GPU)")
    sp.add_argument("op", help="comma-separated benchmarks, or all: " + ", ".join(_bench_names()))
    sp.add_argument("--json", metavar="PATH", help="write the results as JSON here (default: not written)")
    sp.add_argument("--plot", metavar="PNG", help="plot the results here (default: none; needs matplotlib)")
    sp.add_argument("--quick", action="store_true", help="fewer shapes (default: the full sweep)")
    sp.set_defaults(func=cmd_bench)
    sp = sub.add_parser("run", help="run benchmark and check suites into bench/results/<card>/<suite>.json")
    sp.add_argument("suites", nargs="*", metavar="SUITE",
                    help="suites or tags to run, in the table's order (default: every suite this machine runs; "
                         "--list names them)")
    sp.add_argument("--list", action="store_true", help="list the suites and exit")
    sp.add_argument("--card", help="the result folder's name (default: from the GPU: h100, h200, ...; cpu)")
    sp.add_argument("--out-dir", default="bench/results", metavar="DIR",
                    help="where the card folders are (default: %(default)s)")
    sp.add_argument("--limit", type=number(int, 1), metavar="SECONDS",
                    help="cap each suite's time limit at this (default: the suite's own)")
    sp.set_defaults(func=lambda a: __import__("dsv4hal.runner", fromlist=["main"]).main(a))
    sp = sub.add_parser("tune", help="time every eligible kernel per op and shape bucket here; write a lock file")
    sp.add_argument("--platform", help="platform to tune (default: the detected one; like DSV4HAL_PLATFORM)")
    sp.add_argument("--ops", help="comma-separated subset of ops (default: all)")
    sp.add_argument("--out", default="dsv4hal.lock.json", help="lock file to write (default: %(default)s)")
    sp.add_argument("--margin", type=number(float, 0, 1), default=0.03,
                    help="a kernel must beat the static choice by this fraction to replace it (default: %(default)s)")
    sp.add_argument("--interpreted", action="store_true",
                    help="on the CPU also check and time Triton kernels under TRITON_INTERPRET=1")
    sp.add_argument("--update", action="store_true",
                    help="keep the other ops of an existing --out lock (same machine and versions only)")
    sp.add_argument("--markdown", metavar="PATH", help="also write the table of choices that differ from the "
                    "static priority")
    sp.add_argument("--check", metavar="LOCK", help="instead: check LOCK against this machine, its libraries' "
                    "versions and file hashes; exit 2 naming the differences")
    sp.set_defaults(func=lambda a: __import__("dsv4hal.tune", fromlist=["main"]).main(a))
    return p


def _quiet_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null, so that the interpreter's flush at exit
    does not raise BrokenPipeError again (Python's documented idiom for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file (a test's capture)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command: exit 2 with a one-paragraph message for a typed error, 130 on Ctrl-C, and quietly 141 (as a
    process SIGPIPE ends) when the reader of stdout went away (`dsv4hal info | head -1`)."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at the interpreter's exit, where a closed pipe prints a traceback
    except BrokenPipeError:
        _quiet_stdout()
        return 128 + 13


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="dsv4hal %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("dsv4hal").setLevel(level)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        raise  # an OSError, but not the command's: main() answers it
    except KeyboardInterrupt:
        print(f"dsv4hal {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Dsv4HalError as exc:
        print(f"dsv4hal {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # e.g. an unknown --simulate arch, an unwritable output path
        print(f"dsv4hal {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
