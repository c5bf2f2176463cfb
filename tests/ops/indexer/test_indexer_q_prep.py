"""indexer_q_prep (spec 4.2 steps 2-3): the Triton kernel (under the interpreter on the CPU) and the reference on
the conformance catalog against the float64 oracle; the oracle's check catches each step left out; the kernel
equals the reference bit for bit; and a GPU platform selects it."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance import cases_indexer_logits as cases
from dsv4hal.conformance.runner import load_catalog, run_cell
from dsv4hal.reference.indexer_logits import indexer_q_prep as reference

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

from conftest import TRITON_DEVICE, fake, registry_with  # noqa: E402

OP, KERNEL = "indexer_q_prep", "triton_indexer_q_prep"
CATALOG = [(s, b) for s, b in load_catalog([OP]) if not s.gpu_only]


@pytest.fixture(scope="module")
def triton_platform():  # noqa: ANN201
    with dsv4hal.overrides(kernels={OP: KERNEL}):
        return dsv4hal.select_platform()


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[s.name for s, _ in CATALOG])
def test_kernel_and_reference_pass_the_catalog(triton_platform, spec, build) -> None:  # noqa: ANN001
    """The Triton q_prep kernel and the reference both pass every catalog case."""
    cell = run_cell(triton_platform, spec, build, "eager")
    assert cell.implementation == KERNEL and cell.status == "pass", cell.detail
    ref = run_cell(dsv4hal.select_platform("cpu"), spec, build, "eager")
    assert ref.implementation == "torch_reference" and ref.status == "pass", ref.detail


def _fixture(name: str):  # noqa: ANN202
    spec = next(s for s, _ in CATALOG if s.name == name)
    return cases.build(spec, torch.device("cpu"), torch.Generator().manual_seed(3))


@pytest.mark.parametrize("broken", ["no rope", "no hadamard", "scale not folded", "rope at position 0",
                                    "scale without floor"])
def test_the_check_catches_each_step_left_out(broken: str) -> None:
    """The q_prep conformance check fails when any one step (rope, hadamard, scale) is left out."""
    fx = _fixture("t6_edges")
    a = fx.args
    q, w = reference(**a)
    assert fx.compare((q, w), fx.expected)[1]  # the reference itself passes
    if broken == "no rope":
        q, _ = reference(**{**a, "cos": torch.ones_like(a["cos"]), "sin": torch.zeros_like(a["sin"])})
    elif broken == "no hadamard":
        from dsv4hal.formats.indexer_cache import quantize_rows
        from dsv4hal.reference.rope import apply_rope

        pos = a["positions"].long()
        h = apply_rope(a["q"].float(), a["cos"][pos][:, None], a["sin"][pos][:, None])
        raw, _ = quantize_rows(h.reshape(-1, 128), a["fp8"])
        q = raw.view(q.dtype).view(q.shape)
    elif broken == "scale not folded":
        w = a["weights"].float() * cases.WEIGHT_FOLD
    elif broken == "rope at position 0":
        q, w = reference(**{**a, "positions": torch.zeros_like(a["positions"])})
    else:  # heads below the 1e-4 floor quantized against their own amax
        q2, w2 = reference(**{**a, "q": a["q"] * 1e6})
        w = w2 / 1e6
    assert not fx.compare((q, w), fx.expected)[1], broken


@pytest.mark.parametrize("name", ["t7_fp32_bf16_weights", "t6_edges_fnuz", "t9_strided_weights"])
def test_kernel_equals_the_reference_bit_for_bit(name: str) -> None:
    """The kernel keeps the reference's fp32 roundings in its order (the butterfly Hadamard, RoPE without FMA
    contraction, IEEE divisions): the same codes and weights, not merely within the tolerance."""
    from dsv4hal.kernels.triton.indexer_q_prep import indexer_q_prep

    fx = _fixture(name)
    args = {k: v.to(TRITON_DEVICE) if isinstance(v, torch.Tensor) else v for k, v in fx.args.items()}
    q_ref, w_ref = reference(**fx.args)
    q_k, w_k = indexer_q_prep(**args)
    assert q_k.dtype == q_ref.dtype
    assert torch.equal(q_k.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(w_k.cpu(), w_ref)


@pytest.mark.parametrize(("arch", "platform", "fp8"),
                         [("sm90", "cuda_sm90", "e4m3fn"), ("sm100", "cuda_sm100", "e4m3fn"),
                          ("gfx942", "rocm", "e4m3fnuz")])
def test_gpu_platforms_select_the_kernel_and_the_cpu_the_reference(arch: str, platform: str, fp8: str) -> None:
    """GPU platforms select the Triton q_prep kernel and the cpu platform the reference."""
    from dsv4hal import override as ov
    from dsv4hal.selection import select_kernel

    reg = registry_with(strict=True)
    d = select_kernel(reg, OP, {"fp8": fp8, "dtype": "bfloat16"}, fake(arch, triton="3"), platform, ov.Overrides())
    assert d.chosen.name == KERNEL
    assert dsv4hal.select_platform("cpu").explain(OP).chosen.name == "torch_reference"
