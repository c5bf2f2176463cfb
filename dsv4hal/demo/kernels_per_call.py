"""Every kernel that takes a call's case, run on each of a step's recorded calls of chosen ops (`dsv4hal demo
--kernels-per-call OPS`): which kernel is fastest for each layer's real call. The selection chooses per case bucket
from priorities and `dsv4hal tune`'s synthetic samples; these are the calls an engine's step makes, with its own
lengths, indices and caches. Each kernel's output is compared with the recorded one (the replay tolerance) before
it is timed, so a time always belongs to a kernel that gave the step's answer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.engine_model.tape import output_error
from dsv4hal.errors import Dsv4HalError


def in_step(platform: Any, op: Any, args: tuple, kwargs: dict) -> Any:
    """One op call in a decode step of its own: as the step runs it (a plan the step's first call of a shape makes,
    such as FlashMLA's, is made in this call)."""
    with platform.decode_step():
        return op(*args, **kwargs)


def check_ops(platform: Any, ops: Sequence[str]) -> None:
    """Refuse (Dsv4HalError) a name that is not an op of the platform, or an op that writes one of its arguments:
    running its recorded call again would change what the step recorded (a cache, a compressor ring)."""
    names = {op.name for op in platform.ops}
    for name in ops:
        if name not in names:
            raise Dsv4HalError(f"--kernels-per-call: {name!r} is not an op of platform {platform.name}",
                               remedy=f"name ops of `dsv4hal explain`: {', '.join(sorted(names))}")
        written = platform.ops[name].definition.mutates
        if written:
            raise Dsv4HalError(f"--kernels-per-call: {name} writes its argument(s) {', '.join(written)}, so its "
                               "recorded calls cannot run again unchanged",
                               remedy="name ops that write none of their arguments, such as sparse_attention_decode")


def kernels_per_call(platform: Any, calls: Sequence[tuple], ops: Sequence[str],
                     time_call: Callable[[Callable[[], Any]], float]) -> list[dict[str, Any]]:
    """For each recorded call (a Tape's: name, args, kwargs, output) of an op in `ops`: {op, call (its index among
    that op's calls), case, chosen, us {kernel: time}, max_error {kernel: error against the recorded output},
    refused {kernel: why it cannot take the call}, wrong {kernel: its mismatch}, fastest}. The kernels are the
    chosen one and every non-reference candidate the selection finds eligible for the call's case; time_call(fn)
    times fn, a call in its own decode step. The ops must pass check_ops."""
    check_ops(platform, ops)
    rows: list[dict[str, Any]] = []
    seen: Counter[str] = Counter()
    for name, args, kwargs, want in calls:
        if name not in ops:
            continue
        op = platform.ops[name]
        case = op.case_of(*args, **kwargs)
        chosen = op.decide(case).chosen.name
        row: dict[str, Any] = {"op": name, "call": seen[name], "case": dict(case), "chosen": chosen, "us": {},
                               "max_error": {}, "refused": {}, "wrong": {}}
        seen[name] += 1
        for impl in dict.fromkeys([chosen, *candidates(platform, name, case=case)]):
            try:
                bound = bound_op(platform, name, impl)
                got = in_step(platform, bound, args, kwargs)
            except Dsv4HalError as exc:  # a kernel the call's arguments rule out (prepared weights, a width)
                row["refused"][impl] = str(exc).splitlines()[0]
                continue
            try:
                row["max_error"][impl] = output_error(name, got, want)
            except AssertionError as exc:
                row["wrong"][impl] = str(exc)
                continue
            row["us"][impl] = time_call(lambda b=bound, a=args, k=kwargs: in_step(platform, b, a, k))
        row["fastest"] = min(row["us"], key=row["us"].__getitem__) if row["us"] else None
        rows.append(row)
    return rows
