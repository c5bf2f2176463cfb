"""Op contracts: `mhc_pre`, `mhc_post`, `mhc_head` and `mhc_post_pre` (manifold-constrained hyper-connections,
spec 6).

Shared: n = hc_mult = 4 streams; x is the residual stream, bf16 [T, 4, d] with d >= 1; all parameters fp32; one
device. rms_eps and hc_eps are positive finite floats (mhc_head also takes hc_eps = 0).

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
mhc_post_pre(f, x, post, comb, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
        -> (x' bf16 [T, 4, d], y bf16 [T, d], post' fp32 [T, 4], comb' fp32 [T, 4, 4])
    The boundary between two sublayers in one pass over the stream: x' = mhc_post(f, x, post, comb) (rounded to
    bf16, as the stream is stored) and (y, post', comb') = mhc_pre(x', fn, base, scale, ...) of the next sublayer.

Conventions (where eps enters, the Sinkhorn's row/column order, the order of the 24 mixes, post's index order)
are those of DeepSeek's own PyTorch reference for its mHC kernels: deepseek-ai/TileKernels @ 36d9e45,
tile_kernels/torch/mhc.py (`mhc_pre_norm_fn_ref`: mixes * rsqrt(sqrsum / 4d + eps); `mhc_pre_split_mixes_ref`:
pre | post | comb row-major, sigmoid(m * scale + base), + pre_eps on pre only, post times post_mult;
`sinkhorn_normalize_ref`: softmax(-1) + eps, / (sum(-2) + eps), then (row, column) x (repeat - 1);
`mhc_post_ref`: einsum('abmn,abmc->abnc', comb, residual), i.e. out[k] = sum_j comb[j, k] x[j];
`mhc_head_compute_mix_ref`).
V4 uses post_mult 2, 20 Sinkhorn iterations, eps 1e-6 (config hc_mult / hc_sinkhorn_iters / hc_eps; SGLang's
deepseek_v4.py, spec section 6). The norm_weight folding of TileKernels is not part of these ops.

Refused inputs (they give NaN, not an answer): rms_eps = 0 (an all-zero token has RMS 0 and m = 0 * inf),
d = 0 (the RMS of no values is 0/0) and, for the Sinkhorn, hc_eps = 0 (a column whose softmax entries all
underflow sums to 0 and is divided by 0).

Checked mode additionally reads every floating input (a device sync) and rejects NaN/inf.
"""

from __future__ import annotations

import math

import torch

from dsv4hal.checks import check_finite, check_same_device, check_tensor, describe, show
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.signatures import define

OP_PRE = "mhc_pre"
OP_POST = "mhc_post"
OP_HEAD = "mhc_head"
OP_POST_PRE = "mhc_post_pre"
HC_MULT = 4
MIX = (2 + HC_MULT) * HC_MULT


def _check_stream(op: str, x: object, *, gated: bool = True) -> torch.Tensor:
    """x bf16 [T, 4, d]; ops that normalise by the stream's RMS (gated) need d >= 1."""
    x = check_tensor(op, "x", x, dtype=torch.bfloat16, shape=(None, HC_MULT, None))
    if gated and x.shape[2] == 0:
        raise InvalidArgumentError(op, "x", "hidden size d >= 1", describe(x),
                                   remedy="the gates divide by the RMS of the 4d stream values, 0/0 at d = 0")
    return x


def _check_eps(op: str, name: str, eps: object, *, positive: bool = True) -> None:
    bad = isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0
    if bad or (positive and eps == 0):
        want = "a positive finite float" if positive else "a non-negative finite float"
        why = ("rms_eps keeps rsqrt(mean(x^2) + eps) finite for an all-zero token" if name == "rms_eps" else
               "hc_eps keeps the Sinkhorn's divisions (sum + eps) away from 0/0")
        raise InvalidArgumentError(op, name, want, show(eps), remedy=f"use the model's value (1e-6): {why}")


def _check_iters(op: str, sinkhorn_iters: object) -> None:
    if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise InvalidArgumentError(op, "sinkhorn_iters", "an int >= 1", show(sinkhorn_iters))


def _check_params(
    op: str, x: torch.Tensor, fn: object, base: object, scale: object, rows: int, scales: int
) -> dict[str, torch.Tensor]:
    width = HC_MULT * x.shape[2]
    return {
        "fn": check_tensor(op, "fn", fn, dtype=torch.float32, shape=(rows, width)),
        "base": check_tensor(op, "base", base, dtype=torch.float32, shape=(rows,)),
        "scale": check_tensor(op, "scale", scale, dtype=torch.float32, shape=(scales,)),
    }


def _check_post_inputs(op: str, x: torch.Tensor, f: object, post: object, comb: object) -> dict[str, torch.Tensor]:
    t, d = x.shape[0], x.shape[2]
    return {
        "f": check_tensor(op, "f", f, dtype=torch.bfloat16, shape=(t, d)),
        "post": check_tensor(op, "post", post, dtype=torch.float32, shape=(t, HC_MULT)),
        "comb": check_tensor(op, "comb", comb, dtype=torch.float32, shape=(t, HC_MULT, HC_MULT)),
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
    _check_iters(OP_PRE, sinkhorn_iters)
    _finish(OP_PRE, tensors, checked)


def validate_mhc_post(f: object, x: object, post: object, comb: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_post contract."""
    x = _check_stream(OP_POST, x, gated=False)
    tensors = {"x": x, **_check_post_inputs(OP_POST, x, f, post, comb)}
    _finish(OP_POST, tensors, checked)


def validate_mhc_head(
    x: object, fn: object, base: object, scale: object, rms_eps: object = 1e-6, hc_eps: object = 1e-6,
    *, checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_head contract."""
    x = _check_stream(OP_HEAD, x)
    tensors = {"x": x, **_check_params(OP_HEAD, x, fn, base, scale, HC_MULT, 1)}
    _check_eps(OP_HEAD, "rms_eps", rms_eps)
    _check_eps(OP_HEAD, "hc_eps", hc_eps, positive=False)  # no Sinkhorn: sigmoid + 0 is finite
    _finish(OP_HEAD, tensors, checked)


def validate_mhc_post_pre(
    f: object,
    x: object,
    post: object,
    comb: object,
    fn: object,
    base: object,
    scale: object,
    rms_eps: object = 1e-6,
    hc_eps: object = 1e-6,
    sinkhorn_iters: object = 20,
    *,
    checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the mhc_post_pre contract."""
    x = _check_stream(OP_POST_PRE, x)
    tensors = {"x": x, **_check_post_inputs(OP_POST_PRE, x, f, post, comb),
               **_check_params(OP_POST_PRE, x, fn, base, scale, MIX, 3)}
    _check_eps(OP_POST_PRE, "rms_eps", rms_eps)
    _check_eps(OP_POST_PRE, "hc_eps", hc_eps)
    _check_iters(OP_POST_PRE, sinkhorn_iters)
    _finish(OP_POST_PRE, tensors, checked)


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


def case_mhc_post_pre(
    f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
    base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6, sinkhorn_iters: int = 20,
) -> dict[str, object]:
    """Hashable features for kernel selection: hidden size d and the Sinkhorn iteration count."""
    return {"hidden": int(x.shape[2]), "sinkhorn_iters": int(sinkhorn_iters)}


def _fake_pre(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, d = x.shape
    return x.new_empty(t, d), x.new_empty(t, n, dtype=torch.float32), x.new_empty(t, n, n, dtype=torch.float32)


def fake_mhc_pre(x, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6,  # noqa: ANN001
                 sinkhorn_iters=20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    return _fake_pre(x)


def fake_mhc_post(f, x, post, comb) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile)."""
    return x.new_empty(x.shape)


def fake_mhc_post_pre(f, x, post, comb, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6,  # noqa: ANN001
                      sinkhorn_iters=20) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    return (x.new_empty(x.shape), *_fake_pre(x))


def fake_mhc_head(x, fn, base, scale, rms_eps=1e-6, hc_eps=1e-6) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile)."""
    return x.new_empty(x.shape[0], x.shape[2])


@define(validate=validate_mhc_pre, case=case_mhc_pre, fake=fake_mhc_pre)
def mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
            hc_eps: float = 1e-6, sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hyper-connection pre-mix: the gates of the 4 streams from their RMS-normalised mixes, the Sinkhorn-balanced
    combination matrix, and the sublayer input (module docstring: the formulas).

    Arguments:
        x: (T, 4, d), torch.bfloat16, d >= 1: the residual streams.
        fn: (24, 4d), torch.float32; base: (24,), torch.float32; scale: (3,), torch.float32.
        rms_eps, hc_eps: positive finite floats; sinkhorn_iters: an int >= 1 (20 in V4).

    Returns:
        y: (T, d), torch.bfloat16 (sum_i pre_i * x[:, i]); post: (T, 4), torch.float32; comb: (T, 4, 4),
        torch.float32.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, d = 0, eps <= 0 (they give NaN). Checked
    mode also refuses non-finite inputs.
    """


@define(validate=validate_mhc_post, case=case_mhc_post, fake=fake_mhc_post)
def mhc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Hyper-connection post-mix: X'[:, k] = post_k * f + sum_j comb[j, k] * x[:, j], fp32, rounded once.

    Arguments:
        f: (T, d), torch.bfloat16: the sublayer output.
        x: (T, 4, d), torch.bfloat16: the residual streams.
        post: (T, 4), torch.float32; comb: (T, 4, 4), torch.float32 (from mhc_pre).

    Returns:
        (T, 4, d), torch.bfloat16.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices. Checked mode also refuses non-finite inputs.
    """


@define(validate=validate_mhc_post_pre, case=case_mhc_post_pre, fake=fake_mhc_post_pre)
def mhc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                 base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                 sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The boundary between two sublayers in one pass: x' = mhc_post(f, x, post, comb) (rounded to bf16) and
    (y, post', comb') = mhc_pre(x', fn, base, scale, ...) of the next sublayer.

    Arguments:
        f, x, post, comb: as mhc_post; fn, base, scale, rms_eps, hc_eps, sinkhorn_iters: as mhc_pre.

    Returns:
        x': (T, 4, d), torch.bfloat16; y: (T, d), torch.bfloat16; post': (T, 4), torch.float32;
        comb': (T, 4, 4), torch.float32.

    Rejected (InvalidArgumentError): as mhc_post and mhc_pre.
    """


@define(validate=validate_mhc_head, case=case_mhc_head, fake=fake_mhc_head)
def mhc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
             hc_eps: float = 1e-6) -> torch.Tensor:
    """Hyper-connection head: the 4 streams to one before the final norm, y = sum_i pre_i * x[:, i] with
    pre_i = sigmoid(m_i * scale + base_i) + hc_eps.

    Arguments:
        x: (T, 4, d), torch.bfloat16, d >= 1.
        fn: (4, 4d), torch.float32; base: (4,), torch.float32; scale: (1,), torch.float32.
        rms_eps: a positive finite float; hc_eps: a non-negative finite float.

    Returns:
        (T, d), torch.bfloat16.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, d = 0, rms_eps <= 0. Checked mode also
    refuses non-finite inputs.
    """
