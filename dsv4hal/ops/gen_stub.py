"""Writes dsv4hal/ops/typed_ops.py, the typed attributes of dsv4hal.platform.Ops, from the catalog:

    python3 -m dsv4hal.ops.gen_stub

tests/test_typed_surface.py fails when the committed file differs from a fresh one."""

from __future__ import annotations

from pathlib import Path

from dsv4hal.ops.catalog import OPS

PATH = Path(__file__).with_name("typed_ops.py")
COMMAND = "python3 -m dsv4hal.ops.gen_stub"


def render() -> str:
    """The stub's text for the ops of the catalog."""
    from dsv4hal.dispatch.bound_op import BoundOp  # where BoundOp lives, named as the stub imports it

    modules = sorted({o.module for o in OPS})
    imports = sorted([*(f"    from dsv4hal.ops import {m} as _{m}" for m in modules),
                      "    from dsv4hal.ops.signatures import OpDefinition",
                      f"    from {BoundOp.__module__} import BoundOp"], key=lambda line: line.split()[1])
    attrs = [f"        {o.name} = _typed(_{o.module}.{o.name})" for o in OPS]
    return "\n".join([
        '"""The typed attributes of dsv4hal.platform.Ops: what IDEs and type checkers see of platform.ops.<op>, each',
        f"typed as its definition. Generated from the catalog by `{COMMAND}`: do not edit",
        '(tests/test_typed_surface.py compares it with a fresh one). Only type checkers import it."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import TYPE_CHECKING, ParamSpec, TypeVar",
        "",
        "if TYPE_CHECKING:",
        *imports,
        "",
        'P = ParamSpec("P")',
        'R = TypeVar("R")',
        "",
        "",
        "def _typed(definition: OpDefinition[P, R]) -> BoundOp[P, R]:  # static typing only",
        "    raise NotImplementedError",
        "",
        "",
        "class TypedOps:",
        "    if TYPE_CHECKING:",
        *attrs,
        "",
    ])


def main() -> None:
    PATH.write_text(render())
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
