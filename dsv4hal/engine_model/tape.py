"""Recording a program's op calls (`Tape`) and replaying each on another platform or kernel with the
program's real inputs (`replay`), compared per op within `REPLAY_TOLERANCE`."""

from __future__ import annotations

from typing import Any

import torch


def _kept(out: Any) -> Any:
    """An op's output as the tape keeps it: tensors (also in tuples) copied, since the program may write into what
    an op returned (the demo rotates the attention output in place); other objects by reference."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_kept(v) for v in out)
    return out


class Tape:
    """Stands in for platform.ops and records every call (inputs and outputs), so each op of the program
    can later be replayed on another platform or kernel with the program's real inputs."""

    def __init__(self, ops: Any) -> None:
        self._ops, self.calls = ops, []

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._ops, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = op(*args, **kwargs)
            self.calls.append((name, args, kwargs, _kept(out)))
            return out

        call.prepare_weights = getattr(op, "prepare_weights", None)  # type: ignore[attr-defined]
        return call


# per-op comparison when replaying a tape: (absolute, relative) tolerance, None = exact
REPLAY_TOLERANCE = {"sparse_attention_decode": (2e-2, 2e-2), "mhc_pre": (2e-3, 1e-2), "mhc_post": (2e-3, 1e-2),
                    "mhc_post_pre": (2e-3, 1e-2), "mhc_head": (2e-3, 1e-2),
                    "moe_experts": (5e-2, 5e-2), "compress": (5e-3, 5e-3), "indexer_logits": (1e-3, 1e-3),
                    "moe_route": (1e-5, 1e-5)}


IN_PLACE = ("pack_store", "indexer_store")  # ops whose result is the buffer they write: no output to compare


def replay(tape: Tape, platform: Any) -> dict[str, float]:
    """Re-run each recorded call on `platform` and return the worst error per op (raises on a mismatch).
    In-place ops (pack_store) are checked bit-exactly by the conformance suite and skipped here."""
    worst: dict[str, float] = {}
    for name, args, kwargs, want in tape.calls:
        if name in IN_PLACE:
            continue
        e = output_error(name, getattr(platform.ops, name)(*args, **kwargs), want)
        worst[name] = max(worst.get(name, 0.0), e)
    return worst


def output_error(name: str, got: Any, want: Any) -> float:
    """The largest absolute error of an op's output against a recorded one, over the finite recorded values;
    raises AssertionError past the op's REPLAY_TOLERANCE (exact where it has none) or where finiteness differs."""
    worst = 0.0
    for g, w in zip(tensors_of(got), tensors_of(want), strict=True):
        if name == "indexer_topk":  # same set per row; order is free beyond k
            g, w = g.sort(dim=-1).values, w.sort(dim=-1).values
        g, w = g.double(), w.double()
        finite = torch.isfinite(w)
        err = (g - w).abs()[finite]
        e = float(err.max()) if err.numel() else 0.0
        tol = REPLAY_TOLERANCE.get(name)
        bound = 0.0 if tol is None else tol[0] + tol[1] * (float(w[finite].abs().max()) if err.numel() else 0.0)
        if e > bound or not bool(torch.equal(torch.isfinite(g), finite)):
            raise AssertionError(f"replay of {name}: max error {e:.3g} over {bound:.3g}")
        worst = max(worst, e)
    return worst


def tensors_of(x: Any) -> list[torch.Tensor]:
    """The tensors in an op's output (or argument): a tensor, nested tuples/lists, or a dataclass's fields."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in tensors_of(v)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for f in x.__dataclass_fields__ for t in tensors_of(getattr(x, f))]
    return []
