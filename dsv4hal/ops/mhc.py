"""Op contracts: `mhc_pre`, `mhc_post` and `mhc_head` (manifold-constrained hyper-connections, spec 6).

Shared: n = hc_mult = 4 streams; x is the residual stream, bf16 [T, 4, d]; all parameters fp32; one device.

mhc_pre(x, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20) -> (y bf16 [T, d], post fp32 [T, 4],
        comb fp32 [T, 4, 4])
    fn [24, 4d], base [24], scale [3]. xf = flatten(x) in fp32, r = rsqrt(mean(xf^2) + rms_eps) over all 4d,
    m = (xf @ fn^T) * r.  pre_i = sigmoid(m_i * scale0 + base_i) + hc_eps;
    post_i = 2 * sigmoid(m_{4+i} * scale1 + base_{4+i});
    comb: C[j, k] = m_{8+4j+k} * scale2 + base_{8+4j+k}; C = softmax over k (each row) + hc_eps;
    C /= colsum + hc_eps; then sinkhorn_iters - 1 times: C /= rowsum + hc_eps; C /= colsum + hc_eps.
    y = sum_i pre_i * x[:, i] in fp32, rounded to bf16. (The layer's RMSNorm is not part of the op.)
mhc_post(f, x, post, comb) -> bf16 [T, 4, d]
    f bf16 [T, d] (the sublayer output); X'[:, k] = post_k * f + sum_j comb[j, k] * x[:, j], fp32, rounded once.
mhc_head(x, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6) -> bf16 [T, d]
    fn [4, 4d], base [4], scale [1]; pre_i = sigmoid(m_i * scale + base_i) + hc_eps; y = sum_i pre_i * x[:, i].

Checked mode additionally reads every floating input (a device sync) and rejects NaN/inf.
"""

from __future__ import annotations

import math

import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.checks import check_finite, check_same_device, check_tensor

OP_PRE = "mhc_pre"
OP_POST = "mhc_post"
OP_HEAD = "mhc_head"
HC_MULT = 4
MIX = (2 + HC_MULT) * HC_MULT


def _check_stream(op: str, x: object) -> torch.Tensor:
    return check_tensor(op, "x", x, dtype=torch.bfloat16, shape=(None, HC_MULT, None))


def _check_eps(op: str, name: str, eps: object) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InvalidArgumentError(op, name, "a non-negative finite float", repr(eps))


def _check_params(
    op: str, x: torch.Tensor, fn: object, base: object, scale: object, rows: int, scales: int
) -> dict[str, torch.Tensor]:
    width = HC_MULT * x.shape[2]
    return {
        "fn": check_tensor(op, "fn", fn, dtype=torch.float32, shape=(rows, width)),
        "base": check_tensor(op, "base", base, dtype=torch.float32, shape=(rows,)),
        "scale": check_tensor(op, "scale", scale, dtype=torch.float32, shape=(scales,)),
    }


def _finish(op: str, tensors: dict[str, torch.Tensor], checked: bool) -> None:
    check_same_device(op, tensors, tensors["x"].device, "x")
    if checked:
        for name, t in tensors.items():
            check_finite(op, name, t)


def validate_mhc_pre(
    x: object,
    fn: object,
    base: object,
    scale: object,
    rms_eps: object = 1e-6,
    hc_eps: object = 1e-6,
    sinkhorn_iters: object = 20,
    *,
    checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_pre contract."""
    x = _check_stream(OP_PRE, x)
    tensors = {"x": x, **_check_params(OP_PRE, x, fn, base, scale, MIX, 3)}
    _check_eps(OP_PRE, "rms_eps", rms_eps)
    _check_eps(OP_PRE, "hc_eps", hc_eps)
    if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise InvalidArgumentError(OP_PRE, "sinkhorn_iters", "an int >= 1", repr(sinkhorn_iters))
    _finish(OP_PRE, tensors, checked)


def validate_mhc_post(f: object, x: object, post: object, comb: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_post contract."""
    x = _check_stream(OP_POST, x)
    t, d = x.shape[0], x.shape[2]
    tensors = {
        "x": x,
        "f": check_tensor(OP_POST, "f", f, dtype=torch.bfloat16, shape=(t, d)),
        "post": check_tensor(OP_POST, "post", post, dtype=torch.float32, shape=(t, HC_MULT)),
        "comb": check_tensor(OP_POST, "comb", comb, dtype=torch.float32, shape=(t, HC_MULT, HC_MULT)),
    }
    _finish(OP_POST, tensors, checked)


def validate_mhc_head(
    x: object, fn: object, base: object, scale: object, rms_eps: object = 1e-6, hc_eps: object = 1e-6,
    *, checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_head contract."""
    x = _check_stream(OP_HEAD, x)
    tensors = {"x": x, **_check_params(OP_HEAD, x, fn, base, scale, HC_MULT, 1)}
    _check_eps(OP_HEAD, "rms_eps", rms_eps)
    _check_eps(OP_HEAD, "hc_eps", hc_eps)
    _finish(OP_HEAD, tensors, checked)


def case_mhc_pre(
    x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
    rms_eps: float = 1e-6, hc_eps: float = 1e-6, sinkhorn_iters: int = 20,
) -> dict[str, object]:
    """Hashable features for kernel selection: hidden size d and the Sinkhorn iteration count."""
    return {"hidden": int(x.shape[2]), "sinkhorn_iters": int(sinkhorn_iters)}


def case_mhc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> dict[str, object]:
    """Hashable features for kernel selection: hidden size d."""
    return {"hidden": int(x.shape[2])}


def case_mhc_head(
    x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
    rms_eps: float = 1e-6, hc_eps: float = 1e-6,
) -> dict[str, object]:
    """Hashable features for kernel selection: hidden size d."""
    return {"hidden": int(x.shape[2])}
